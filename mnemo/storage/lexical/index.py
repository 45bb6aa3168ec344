"""Recall's lexical channel: a tantivy index of the graph's node texts, kept from the store
(a step's document also holds the steps around it in its episode: `windows.py`).

The store stays the one truth. Every insert, text change and delete of a node also writes a
row to the store's `lexical_log` (by trigger, in the writer's own transaction) under a
per-repo sequence number; the index is a cache that applies that log:

- **Before each search** the index reads the repo's sequence (one keyed row) and applies what
  it has not seen, so a search never misses a committed node nor returns an erased one.
- **What it has applied is in the index itself**: a meta document per repo holds the last
  sequence applied, committed with the documents it covers. A process killed mid-write
  reopens the index at its last commit and applies the log again from there (applying is
  idempotent: a node's document is replaced or deleted by its key).
- **A repo behind the log's horizon** (a store migrated from before the index, a log
  trimmed past it) or ahead of it (another store at the same place) is rebuilt from the
  store's nodes in a background thread; its searches go to the store's own full-text search
  meanwhile (`search` returns None), which is what they did before.
- **Many processes**: each process takes one of several slots (index folders) by tantivy's
  writer lock, an OS file lock that dies with its process, and keeps it while it lives; a
  process needs no other process's help to bring its slot up to date.
- **A node's words may be in other documents** (a step's in its neighbours' windows): applying
  a change also writes again every document that holds the changed node's text (found by its
  key in their `holds` field), so an erased step's words leave its neighbours at once.

Why the cost is bounded (BENCHMARKS.md, "Lexical candidates at scale"): tantivy scores a match
in Rust far faster than FTS5 or `ts_rank`, and query terms in more than
`DF_CUT` of the documents are dropped (unless that leaves none), so near-stopwords do not drag
in half the store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path

import anyio.to_thread

from mnemo.storage.lexical.fresh import (
    Statistics,
    idf,
    needles,
    scores,
    stored_score,
    unstale_hits,
)
from mnemo.storage.lexical.schema import analyzer, schema
from mnemo.storage.lexical.slots import META, Slot, drop_older, wipe_free
from mnemo.storage.lexical.source import LexicalSource
from mnemo.storage.lexical.windows import (
    documents,
    key,
    rowid_of,
)
from mnemo.storage.worker import Queued, Worker
from mnemo.text import query_words

log = logging.getLogger("mnemo.lexical")

# Query terms in more of the documents than this are dropped (unless that leaves none, then
# the `KEEP_RAREST` rarest stay): measured on LoCoMo, 20 % costs 0.555 -> 0.549 evidence
# recall@10 and cuts 1M-node in-context queries to a third of their time (BENCHMARKS.md); kept in
# small repos, such a word let a step whose window held a fact's words outrank the fact
# (DECISIONS.md, "Conversations' first stage").
DF_CUT = 0.2
KEEP_RAREST = 2
# Changes applied inline before a search; a longer backlog is applied in the background
# while the store's own search answers.
INLINE_CHANGES = 2_000
BATCH = 5_000
LOCK_WAIT = 5.0
# A backlog longer than this (or an empty slot) is cheaper to rebuild from the nodes, so the
# store's log keeps no more of a repo's entries (its triggers drop older ones).
LOG_KEEP = 50_000
SLOTS = 16
# The folder's layout (v4: accents folded, texts composed, words of up to 255 bytes kept; v5:
# node ids stored, not indexed; v6: each document's stems stored and its length a fast field,
# for the exact BM25): a change goes to a new folder (the older ones are deleted at the next
# erasure, `slots.wipe_free`).
FORMAT = "v6"
# Applied changes wait this long for more before they are committed, never longer than
# `COMMIT_WITHIN` after the oldest of them (under steady writes a search would otherwise score
# ever more of them itself, and skip ever more stale copies), and
# a search commits rather than score more than `COMMIT_ABOVE`.
COMMIT_AFTER = 0.5
COMMIT_WITHIN = 1.0
COMMIT_ABOVE = 2_000
# Hits read from tantivy beyond those asked for: tantivy ranks by its own statistics (deleted
# copies counted until a merge, lengths in coarse steps), and each hit it gives is scored again
# exactly, so the best of a wider cut are the exact best.
MORE = 10


class LexicalIndex(Slot):
    """One process's slot of the index for one store: searched, and kept up with the store
    in a background thread."""

    def __init__(self, folder: Path, source: LexicalSource) -> None:
        super().__init__(folder, source)
        self._queue = threading.Lock()  # `_behind`, `_dirty`, `_worker`: held for moments
        self._behind: set[str] = set()  # repos being rebuilt: the store's search answers
        self._dirty: set[str] = set()  # repos written since: applied ahead of their search
        self._worker: threading.Thread | None = None
        self._closing = threading.Event()
        self._wake = threading.Event()  # new work for the background thread
        # Searches run here, one at a time (a hop costs less than one through
        # `anyio.to_thread`, and tantivy's searches did not go faster side by side); started
        # at the first.
        self._searcher: Worker | None = None

    # ---- searching -------------------------------------------------------------------------

    async def search(
        self, repo: str, query: str, limit: int, types: Iterable[str] | None,
        within: Iterable[int] | None = None,
    ) -> list[tuple[str, float]] | None:
        """Node ids matching `query`, best BM25 first (of the nodes of rowids `within` only,
        when given); None when the index cannot answer for this repo now (unavailable, or
        being brought up in the background)."""
        return await self.start_search(repo, query, limit, types, within).result()

    def start_search(
        self, repo: str, query: str, limit: int, types: Iterable[str] | None,
        within: Iterable[int] | None = None,
    ) -> Queued[list[tuple[str, float]] | None]:
        """`search`, queued on the index's thread now: its answer is awaited later (the
        query's words are read there too, off the event loop)."""
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
            # Being rebuilt (read without the lock, which a rebuild's batch holds for a few
            # hundred milliseconds): the store's search answers.
            return None
        # Held by the background thread for one batch at most; a disk that stalls for longer
        # lets the store's search answer.
        if not self._lock.acquire(timeout=LOCK_WAIT):
            return None
        try:
            if not self._open() or not self._current(repo):
                return None
            stats = self._statistics(repo)
            searcher = self._index.searcher()
            if self._repos is None:
                self._repos = [t for t, _ in searcher.terms_with_prefix("repo", "", limit=2)]
            alone = self._repos in ([], [repo])
            stems = list(dict.fromkeys(t for w in words for t in self._analyzer.analyze(w)))
            stale, fresh = self._fresh.of(repo, stems)
            documents, average, read = stats.documents, stats.average, self._read
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
        # The words alone, when nothing else filters, let tantivy skip the blocks that cannot
        # enter the top k; a filter makes it score every match.
        query = match if len(clauses) == 1 else tv.Query.boolean_query(clauses)
        weights = {s: idf(documents, df) for df, s in kept}
        wanted = needles(weights)
        found = [(at, node_id, stored_score(stems, wanted, average))
                 for _, (at, node_id, stems)
                 in unstale_hits(searcher, query, limit + MORE, stale, read)]
        if fresh:
            found += scores(fresh, weights, kinds, average)
        # Ties in the order the nodes were written (their rowids), as the store's own search
        # and the dense channel break them: fused, the channels then agree on equal matches.
        found.sort(key=lambda hit: (-hit[2], rowid_of(hit[0])))
        return [(node_id, score) for _, node_id, score in found[:limit]]

    def _current(self, repo: str) -> bool:
        """Brings the repo's documents up to the log (inline if the backlog is short);
        whether the index answers for it now. Holds the lock."""
        if repo in self._behind or repo in self._rebuilds:
            return False
        seq, horizon, applied = self._log_state(repo)
        if applied == seq:
            return True
        if (applied < horizon or applied > seq or seq - applied > INLINE_CHANGES
                or (not applied and self._holds_any(repo))):
            self._enqueue(self._behind, repo)
            return False
        self._apply(repo, applied, seq)
        if len(self._fresh) >= COMMIT_ABOVE:
            self._commit()  # scoring them here would cost more than the commit
        else:
            self._wake_worker()  # to commit them soon
        return True

    # ---- keeping up with the store (under the lock) ----------------------------------------

    def _rebuild_step(self, repo: str) -> bool:
        """One batch of bringing `repo` up: of a rebuild from its nodes when the log cannot
        (a rebuild is done batch by batch, letting go of the lock between them), else of the
        log's next entries. True when the repo is current. Holds the lock."""
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
            # From the nodes as they are from now on; what changes meanwhile is past `seq`
            # in the log, applied once the rebuild is done. The mark goes too: a commit
            # before the end (another repo's) must not leave it beside half the documents.
            self._writer.delete_documents_by_term("repo", repo)
            self._writer.delete_documents_by_term("key", META + repo)
            self._applied.pop(repo, None)
            self._stats[repo] = Statistics()  # counted as the documents are written again
            cursor = (seq, 0)
            if seq > BATCH:
                # Marked before the first batch when it will not be the last (a repo wiped by
                # an erasure, say): a search meanwhile lets the store's search answer, rather
                # than wait for the batch's lock (a few hundred milliseconds). One batch is
                # waited for: the search then answers from it.
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
                # Its documents are not scored as uncommitted: until a commit holds them the
                # repo is not current (the next search brings it up again).
                self._applied.pop(repo, None)
                self._stats.pop(repo, None)
                raise
        else:
            self._rebuilds[repo] = (target, rows[-1].rowid)
        return False

    async def settle(self, repo: str) -> None:
        """Brings the repo's documents up to the store, rebuilding them if need be, and
        returns when done (a benchmark's or an operator's wait; recall never waits)."""
        await anyio.to_thread.run_sync(self._settle, repo)

    def _settle(self, repo: str) -> None:
        with self._lock:
            if not self._open():
                return
        self._enqueue(self._dirty, repo)
        while True:
            with self._queue:
                worker = self._worker
            if worker is None:
                return
            worker.join()

    def changed(self, repo: str) -> None:
        """The repo was written (its write lock was let go): brings the slot up in the
        background, so that the next search finds it current rather than paying the index's
        commit. An index no search has opened yet stays closed."""
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
        """Brings queued repos up, then commits what was applied once no more comes for
        `COMMIT_AFTER` seconds, or `COMMIT_WITHIN` after the oldest of it came; ends when
        nothing is left to do."""
        while not self._closing.is_set():
            with self._queue:
                self._wake.clear()
                repo = next(iter(self._behind), None) or next(iter(self._dirty), None)
            if repo is None:
                wait = self._fresh.commit_wait(COMMIT_AFTER, COMMIT_WITHIN)  # a hint: no lock
                if wait > 0 and self._wake.wait(wait):
                    continue
                # The commit (an fsync) holds `_lock` only: `changed`, called on the event
                # loop, takes `_queue` and must never wait for a disk.
                with self._lock:
                    self._commit_due(quiet=not self._wake.is_set())
                    with self._queue:
                        if self._wake.is_set():
                            continue
                        self._worker = None
                        return
            try:
                with self._lock:
                    current = self._writer is None or self._rebuild_step(repo)
                    # Writes that keep the repo dirty must not put the commit off either.
                    self._commit_due(quiet=False)
            except Exception:
                # The store's own search keeps answering for the repo; the next search retries.
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
        """Commits what was applied if it is due: after `quiet` (no write came meanwhile),
        or once its oldest change waited `COMMIT_WITHIN`. Holds the lock."""
        if not len(self._fresh) or self._writer is None:
            return
        if not quiet and self._fresh.commit_wait(COMMIT_AFTER, COMMIT_WITHIN) > 0:
            return
        try:
            self._commit()
        except Exception:
            # Still applied, still scored as fresh: retried later, not at every write.
            log.exception("lexical index: commit failed")
            self._fresh.postpone()

    # ---- the slot --------------------------------------------------------------------------

    def _open(self) -> bool:
        """Takes a free slot and reads what it has applied; False if no slot can be used (the
        store's own search then answers). Holds the lock."""
        if self._opened:
            return self._writer is not None
        self._opened = True
        try:
            self._schema, self._analyzer = schema(), analyzer()  # tantivy imported here
            place = self._base / self._source.place()
            self._folder = place / FORMAT
            if place.is_dir():
                drop_older(place, FORMAT)  # a cache of an older layout, rebuilt here
            epoch = self._source.epoch()
            for number in range(SLOTS):
                folder = self._folder / f"slot-{number}"
                if self._take(folder, epoch):
                    self.slot = folder
                    return True
            log.warning("lexical index: all %d slots in %s are taken", SLOTS, self._folder)
        except Exception:
            log.exception("lexical index: %s cannot be used", self._folder)
        self._writer = None
        return False

    async def erase(self) -> None:
        """Something was erased from the store (its epoch changed in the same transaction):
        wipes this process's slot now, and every slot no process holds (a process holding
        one wipes it before its next answer, as it reads the epoch with the log's state),
        and deletes the folders of the index's older layouts. Unreadable leftovers go whole."""
        await anyio.to_thread.run_sync(self._erase)

    def _erase(self) -> None:
        with self._lock:
            try:
                if self._writer is not None:
                    epoch = self._source.epoch()
                    if epoch != self._epoch:
                        self._restart(epoch)
                place = self._base / self._source.place()
            except Exception:
                log.exception("lexical index: wiping %s failed", self._folder)
                return
        wipe_free(place, FORMAT, keep=self.slot)

    async def aclose(self) -> None:
        if self._searcher is not None:
            # A search begun and never awaited (a recall that failed meanwhile) ends first:
            # the index and its source close below.
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
                if self._writer is not None:
                    # What was applied is committed (the next process starts from there);
                    # a rebuild under way is dropped (it starts again from the store).
                    if self._rebuilds:
                        self._writer.rollback()
                    elif len(self._fresh):
                        self._commit()
                    self._writer = None
                    self._index = None
            finally:
                self._source.close()


