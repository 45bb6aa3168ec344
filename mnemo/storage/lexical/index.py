"""Recall's lexical channel: a tantivy index of node texts, a cache of the store that applies
its `lexical_log` (written by trigger in each writer's transaction) before each search, so a
search never misses a committed node nor returns an erased one. Each slot's meta document holds
the sequence applied (replay is idempotent); a repo the log cannot bring up is rebuilt in the
background while the store's own search answers (`search` returns None). Each process holds one
of `SLOTS` folders by tantivy's writer lock."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio.to_thread

from mnemo.cpu import Queued, Worker
from mnemo.storage.lexical.fresh import (
    Statistics,
    Totals,
    idf,
    needles,
    scores,
    stored_score,
    tantivy_scale,
    tantivy_totals,
    unstale_hits,
)
from mnemo.storage.lexical.schema import analyzer, schema
from mnemo.storage.lexical.slots import META, Slot, wipe_free
from mnemo.storage.lexical.source import LexicalSource, documents, key, rowid_of
from mnemo.text import query_words

log = logging.getLogger("mnemo.lexical")

# Query terms in more of the documents than this are dropped, unless that leaves none (then
# the `KEEP_RAREST` rarest stay); BENCHMARKS.md, "Lexical candidates at scale".
DF_CUT = 0.2
KEEP_RAREST = 2
# A longer backlog is applied in the background while the store's own search answers.
INLINE_CHANGES = 2_000
BATCH = 5_000
# A longer backlog is rebuilt from the nodes; the log's triggers keep no more per repo.
LOG_KEEP = 50_000
SLOTS = 16
# The folder's layout; a new one gets a new folder (older ones go at the next erasure).
FORMAT = "v7"
# Applied changes are committed after this quiet time, at most `COMMIT_WITHIN` after the
# oldest; a search commits rather than score more than `COMMIT_ABOVE` uncommitted ones.
COMMIT_AFTER = 0.5
COMMIT_WITHIN = 1.0
COMMIT_ABOVE = 2_000
# Extra hits read from tantivy (whose ranking is approximate) before exact rescoring; more
# are read, up to `READ_MOST` times as many, until the exact top is certain.
MORE = 10
READ_MOST = 16


class LexicalIndex(Slot):
    def __init__(self, folder: Path, source: LexicalSource) -> None:
        super().__init__(folder, source)
        self._queue = threading.Lock()  # `_behind`, `_dirty`, `_worker`: held for moments
        self._behind: set[str] = set()  # repos being rebuilt: the store's search answers
        self._dirty: set[str] = set()  # repos written since: applied ahead of their search
        self._worker: threading.Thread | None = None
        self._closing = threading.Event()
        self._wake = threading.Event()  # new work for the background thread
        self._settling = 0  # settles waiting: the worker commits without the quiet time
        # Searches run here one at a time (cheaper hop than `anyio.to_thread`; BENCHMARKS.md).
        self._searcher: Worker | None = None
        self._held: Path | None = None  # where an erasure left a held slot behind it

    async def search(
        self, repo: str, query: str, limit: int, types: Iterable[str] | None,
        within: Iterable[int] | None = None,
    ) -> list[tuple[str, float]] | None:
        """Node ids matching `query`, best BM25 first (only rowids `within`, if given); None
        when the index cannot answer for this repo now."""
        return await self.start_search(repo, query, limit, types, within).result()

    def start_search(
        self, repo: str, query: str, limit: int, types: Iterable[str] | None,
        within: Iterable[int] | None = None,
    ) -> Queued[list[tuple[str, float]] | None]:
        """`search`, queued on the index's thread now, awaited later."""
        kinds = None if types is None else list(types)
        keys = None if within is None else {key(repo, rowid) for rowid in within}
        if self._searcher is None:
            self._searcher = Worker("mnemo-lexical")
        return Queued(self._searcher.start(
            lambda: self._search(repo, query, limit, kinds, keys)))

    def _search(
        self, repo: str, text: str, limit: int, kinds: list[str] | None,
        keys: set[str] | None = None,
    ) -> list[tuple[str, float]] | None:
        words = query_words(text)
        if not words or limit <= 0:
            return []
        if repo in self._behind or repo in self._rebuilds:
            return None  # being rebuilt: read without the lock a batch holds
        if not self._lock.acquire(timeout=5.0):
            return None
        try:
            if not self._open() or not self._current(repo):
                return None
            searcher = self._index.searcher()
            stats = self._stats.get(repo)
            if stats is None:  # read the first time
                stats = self._stats[repo] = Statistics.read(
                    searcher, self._schema, repo, self._fresh)
            if self._repos is None:
                self._repos = [t for t, _ in searcher.terms_with_prefix("repo", "", limit=2)]
            alone = self._repos in ([], [repo])
            stems = list(dict.fromkeys(t for w in words for t in self._analyzer.analyze(w)))
            stale, fresh = self._fresh.of(repo, stems)
            documents, average, read = stats.documents, stats.average, self._read
            generation = self._generation
            counted = stats.frequencies_of(stems, searcher, self._schema, repo, self._fresh)
            present = sorted((df, s) for s, df in counted.items() if df)
        finally:
            self._lock.release()
        import tantivy as tv

        if not present:
            return []
        kept = [(df, s) for df, s in present if df <= DF_CUT * documents] or present[:KEEP_RAREST]
        match = tv.Query.boolean_query(
            [(tv.Occur.Should, tv.Query.term_query(self._schema, "text", s)) for _, s in kept]
        )
        clauses = [(tv.Occur.Must, match)]
        if not alone:
            clauses.append((tv.Occur.Must, tv.Query.const_score_query(
                tv.Query.term_query(self._schema, "repo", repo), 0.0)))
        if kinds is not None:
            clauses.append((tv.Occur.Must, tv.Query.const_score_query(
                tv.Query.term_set_query(self._schema, "type", kinds), 0.0)))
        if keys is not None:  # a scope's nodes: its keys' postings, never the repo's
            clauses.append((tv.Occur.Must, tv.Query.const_score_query(
                tv.Query.term_set_query(self._schema, "key", sorted(keys)), 0.0)))
            fresh = {k: doc for k, doc in fresh.items() if k in keys}
        # Words alone let tantivy skip blocks that cannot enter the top k.
        query = match if len(clauses) == 1 else tv.Query.boolean_query(clauses)
        weights = {s: idf(documents, df) for df, s in kept}
        wanted = needles(weights)
        # By key, (-BM25, rowid, id): ties by rowid, as the store's search and the dense
        # channel break them.
        ranked = {at: (-score, rowid_of(at), node_id)
                  for at, node_id, score in scores(fresh, weights, kinds, average)}
        want, most, scale = limit + MORE, READ_MOST * (limit + MORE), 0.0
        while True:
            hits = unstale_hits(searcher, query, want, stale, read)
            for _, (at, node_id, stored) in hits:
                if at not in ranked:
                    ranked[at] = (-stored_score(stored, wanted, average), rowid_of(at), node_id)
            found = sorted(ranked.values())[:limit]
            if len(hits) < want or want >= most:
                break
            # Done when no document tantivy ranks below the last read can reach the top.
            if not scale:
                totals = self._tantivy_totals(generation, searcher, [s for _, s in kept])
                if totals is None:  # no hit holds a word: not reached while there are hits
                    break
                scale = tantivy_scale(totals, weights, average,
                                      lambda s: searcher.doc_freq("text", s))
            if len(found) == limit and -found[-1][0] > scale * hits[-1][0]:
                break
            want = min(2 * want, most)
        return [(node_id, -score) for score, _, node_id in found]

    def _tantivy_totals(self, generation: int, searcher: Any, stems: list[str]) -> Totals | None:
        """`tantivy_totals`, kept for this `generation` of commits."""
        kept = self._totals
        if kept is not None and kept[0] == generation:
            return kept[1]
        totals = tantivy_totals(searcher, self._schema, stems)
        if totals is not None:
            self._totals = (generation, totals)
        return totals

    def _current(self, repo: str) -> bool:
        """Applies a short backlog inline; whether the index answers now. Holds the lock."""
        if repo in self._behind or repo in self._rebuilds:
            return False
        seq, horizon, applied = self._log_state(repo)
        if applied == seq:
            return True
        if (applied < horizon or applied > seq or seq - applied > INLINE_CHANGES
                # Documents of the repo without its mark: a rebuild cut short, so rebuilt.
                or (not applied and self._index.searcher().doc_freq("repo", repo))):
            self._enqueue(self._behind, repo)
            return False
        self._apply(repo, applied, seq)
        if len(self._fresh) >= COMMIT_ABOVE:
            # Scoring them here would cost more than the commit (False: an erasure wiped them).
            return self._commit()
        self._wake_worker()  # to commit them soon
        return True

    def _rebuild_step(self, repo: str) -> bool:
        """One batch of bringing `repo` up, from the log or else by a rebuild from its nodes;
        True when current. Holds the lock."""
        cursor = self._rebuilds.get(repo)
        if cursor is None:
            seq, horizon, applied = self._log_state(repo)
            if applied == seq:
                return True
            if 0 < applied < seq and applied >= horizon and seq - applied <= LOG_KEEP:
                self._apply(repo, applied, min(seq, applied + BATCH))
                if len(self._fresh) >= COMMIT_ABOVE:
                    self._commit()
                return False
            # Changes meanwhile are past `seq`, applied after. The mark goes too: a commit
            # mid-rebuild must not leave it beside half the documents.
            self._writer.delete_documents_by_term("repo", repo)
            self._writer.delete_documents_by_term("key", META + repo)
            self._applied.pop(repo, None)
            self._stats[repo] = Statistics()  # counted as the documents are written again
            cursor = (seq, 0)
            if seq > BATCH:
                # Several batches: searches meanwhile go to the store rather than wait.
                self._rebuilds[repo] = cursor
        target, after = cursor
        rows = self._source.nodes(repo, after, BATCH)
        for doc in documents(self._source, repo, rows):
            self._put(repo, doc)
        if len(rows) < BATCH:
            self._rebuilds.pop(repo, None)
            self._mark(repo, target)
            try:
                self._commit()
            except Exception:
                # Not current until a commit holds its documents.
                self._applied.pop(repo, None)
                self._stats.pop(repo, None)
                raise
        else:
            self._rebuilds[repo] = (target, rows[-1].rowid)
        return False

    async def settle(self, repo: str) -> None:
        """Brings the repo's documents up to the store, commits them at once and returns when
        done (recall never waits for this)."""
        await anyio.to_thread.run_sync(self._settle, repo)

    def _settle(self, repo: str) -> None:
        with self._lock:
            if not self._open():
                return
        with self._queue:
            self._settling += 1
        try:
            self._enqueue(self._dirty, repo)
            while True:
                with self._queue:
                    worker = self._worker
                if worker is None:
                    return
                worker.join()
        finally:
            with self._queue:
                self._settling -= 1

    def changed(self, repo: str) -> None:
        """The repo was written: brings the slot up in the background (an unopened index
        stays closed)."""
        if self._writer is not None and not self._closing.is_set():
            self._enqueue(self._dirty, repo)

    def _enqueue(self, queue: set[str], repo: str) -> None:
        with self._queue:
            queue.add(repo)
        self._wake_worker()

    def _wake_worker(self) -> None:
        with self._queue:
            self._wake.set()
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._work, name="mnemo-lexical", daemon=True
                )
                self._worker.start()

    def _work(self) -> None:
        """Brings queued repos up and commits when due; ends when nothing is left."""
        while not self._closing.is_set():
            with self._queue:
                self._wake.clear()
                repo = next(iter(self._behind), None) or next(iter(self._dirty), None)
            if repo is None:
                # Hints, read without a lock.
                wait = 0.0 if self._settling else self._fresh.commit_wait(COMMIT_AFTER,
                                                                          COMMIT_WITHIN)
                if wait > 0 and self._wake.wait(wait):
                    continue
                # The fsync holds `_lock` only: `changed` (event loop) takes `_queue`.
                with self._lock:
                    self._commit_due(quiet=bool(self._settling) or not self._wake.is_set())
                    with self._queue:
                        if self._wake.is_set():
                            continue
                        self._worker = None
                        return
            try:
                with self._lock:
                    current = self._writer is None or self._rebuild_step(repo)
                    self._commit_due(quiet=False)
            except Exception:
                log.exception("lexical index: bringing repo %r up failed", repo)
                with self._lock:
                    self._rebuilds.pop(repo, None)
                    self._stats.pop(repo, None)
                current = True
            if current:
                with self._queue:
                    self._behind.discard(repo)
                    self._dirty.discard(repo)
        with self._queue:
            self._worker = None

    def _commit_due(self, *, quiet: bool) -> None:
        """Commits what was applied if due (`quiet`, or `COMMIT_WITHIN` passed). Holds the lock."""
        if not len(self._fresh) or self._writer is None:
            return
        if not quiet and self._fresh.commit_wait(COMMIT_AFTER, COMMIT_WITHIN) > 0:
            return
        try:
            self._commit()
        except Exception:
            log.exception("lexical index: commit failed")
            self._fresh.postpone()

    def _open(self) -> bool:
        """Takes a free slot and wipes the free ones behind an erasure; False if none can be
        used. Holds the lock."""
        if self._opened:
            return self._writer is not None
        self._opened = True
        try:
            self._schema, self._analyzer = schema(), analyzer()  # tantivy imported here
            place = self._base / self._source.place()
            self._folder = place / FORMAT
            epoch = self._source.epoch()
            for number in range(SLOTS):
                folder = self._folder / f"slot-{number}"
                if self._take(folder, epoch):
                    self.slot = folder
                    try:  # free slots behind an erasure (their holder killed); older layouts
                        wipe_free(place, FORMAT, epoch, keep=folder)
                    except Exception:
                        log.exception("lexical index: wiping free slots in %s failed", place)
                    return True
            log.warning("lexical index: all %d slots in %s are taken", SLOTS, self._folder)
        except Exception:
            # The store's full-text search answers instead: a degraded answer, not a failure.
            log.warning("lexical index: %s cannot be used; the store's full-text search "
                        "answers", self._folder, exc_info=True)
        self._writer = None
        return False

    async def erase(self) -> None:
        """After an erasure (the store's epoch changed): wipes this slot, every free slot and
        older layouts. A slot another process holds is wiped by it before its next commit,
        answer or close; if it is killed, by this index's close or the next to open one."""
        await anyio.to_thread.run_sync(self._erase)

    def _erase(self) -> None:
        with self._lock:
            try:
                epoch = self._source.epoch()
                if self._writer is not None:
                    self._follow(epoch)
                place = self._base / self._source.place()
            except Exception:
                log.exception("lexical index: wiping %s failed", self._folder)
                return
        if wipe_free(place, FORMAT, epoch, keep=self.slot):
            self._held = place

    async def aclose(self) -> None:
        if self._searcher is not None:
            # A search never awaited ends before the index closes.
            searcher, self._searcher = self._searcher, None
            await searcher.stopped()
        self._closing.set()
        self._wake.set()  # the worker may be waiting out `COMMIT_AFTER`
        with self._queue:
            worker = self._worker
        if worker is not None:
            await anyio.to_thread.run_sync(worker.join, 10.0)
        await anyio.to_thread.run_sync(self._close)

    def _close(self) -> None:
        with self._lock:
            try:
                if self._writer is not None or self._held is not None:
                    self._leave()
            finally:
                self._source.close()

    def _leave(self) -> None:
        """Commits what was applied and lets the slot go; a slot behind an erasure is wiped
        first, and what was applied is dropped if the store's epoch cannot be read, as is a
        rebuild under way. Then wipes the free slots an erasure here found held. Holds the lock."""
        try:
            epoch = self._source.epoch()
        except Exception:
            log.exception("lexical index: closing %s unchecked; its changes are dropped",
                          self._folder)
            self._writer = self._index = None
            return
        if self._writer is not None:
            if self._follow(epoch) and not self._rebuilds and len(self._fresh):
                self._save()
            self._writer = self._index = None
        if self._held is not None:
            wipe_free(self._held, FORMAT, epoch, keep=self.slot)
