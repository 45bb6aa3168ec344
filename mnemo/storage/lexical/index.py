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
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio.to_thread

from mnemo.storage.lexical.fresh import (
    Fresh,
    FreshDoc,
    Statistics,
    Stored,
    committed_docs,
    idf,
    needles,
    scores,
    stem_text,
    stored_score,
    unstale_hits,
)
from mnemo.storage.lexical.schema import analyzer, open_index, schema
from mnemo.storage.lexical.slots import HEAP, drop_older, wipe_free
from mnemo.storage.lexical.source import LexicalSource
from mnemo.storage.lexical.windows import (
    WINDOW,
    Document,
    documents,
    key,
    rowid_of,
    to_rewrite,
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
_META = "\x01meta/"
_EPOCH = "\x01epoch"


class LexicalIndex:
    """One process's slot of the index for one store."""

    def __init__(self, folder: Path, source: LexicalSource) -> None:
        self._base = folder
        self._folder = folder
        self._source = source
        self._lock = threading.Lock()  # the writer, `_applied`, the source's connection
        self._queue = threading.Lock()  # `_behind`, `_dirty`, `_worker`: held for moments
        self._opened = False
        self._index: Any = None
        self._writer: Any = None
        self._schema: Any = None
        self._analyzer: Any = None
        self._applied: dict[str, int] = {}
        self._behind: set[str] = set()  # repos being rebuilt: the store's search answers
        self._dirty: set[str] = set()  # repos written since: applied ahead of their search
        self._rebuilds: dict[str, tuple[int, int]] = {}  # repo -> (its seq, last rowid done)
        self._worker: threading.Thread | None = None
        self._closing = threading.Event()
        self._wake = threading.Event()  # new work for the background thread
        self._fresh = Fresh()  # applied, not yet committed (under `_lock`)
        # Per repo, its live documents' BM25 statistics (under `_lock`): read from the slot at
        # the repo's first search, then kept as changes are applied.
        self._stats: dict[str, Statistics] = {}
        # The committed documents searches read since the last commit (`unstale_hits`; under
        # `_lock`, or held by a search that took it with its searcher).
        self._read: dict[tuple[int, int], Stored] = {}
        # The repos with committed documents (at most two named; under `_lock`), read once per
        # commit: None until read.
        self._repos: list[str] | None = None
        self._epoch: str | None = None  # the store's epoch the slot's documents are of
        self.slot: Path | None = None
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
            present = sorted((df, s) for s in stems if (df := stats.frequencies.get(s, 0)))
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

    def _statistics(self, repo: str) -> Statistics:
        """The repo's BM25 statistics, read from the slot's committed documents and what was
        applied since the first time. Holds the lock."""
        stats = self._stats.get(repo)
        if stats is None:
            searcher = self._index.searcher()
            stats = self._stats[repo] = Statistics.read(searcher, self._schema, repo)
            entries = self._fresh.entries(repo)
            for before in committed_docs(searcher, self._schema, list(entries)):
                stats.add(before, -1)
            for _, doc in entries.values():
                if doc is not None:
                    stats.add(doc)
        return stats

    def _current(self, repo: str) -> bool:
        """Brings the repo's documents up to the log (inline if the backlog is short);
        whether the index answers for it now. Holds the lock."""
        if repo in self._behind or repo in self._rebuilds:
            return False
        seq, horizon, epoch = self._source.state(repo)
        if epoch != self._epoch:
            self._restart(epoch)
        applied = self._applied.get(repo, 0)
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

    def _holds_any(self, repo: str) -> bool:
        """Whether the slot's last commit has documents of `repo`. Without the repo's mark
        they are a rebuild's, cut short (its process killed): the log from its start need
        not name them (a store restored from a backup), so the repo is rebuilt rather than
        brought up from the log. Holds the lock."""
        return bool(self._index.searcher().doc_freq("repo", repo))

    # ---- keeping up with the store (under the lock) ----------------------------------------

    def _apply(self, repo: str, after: int, upto: int) -> None:
        """Applies the log's entries in (after, upto]: the changed nodes' documents, and
        those of the steps whose windows hold (or should now hold) a changed node's text;
        the repo's statistics follow (they are read again if this fails halfway)."""
        try:
            present, gone = self._source.changes(repo, after, upto)
            changed = [key(repo, r) for r in gone] + [key(repo, row.rowid) for row in present]
            rows = {row.rowid: row for row in present}
            held = self._holders(repo, changed) - rows.keys()
            rows.update((row.rowid, row) for row in self._source.at(repo, sorted(held)))
            # The changed steps' neighbours not read yet: mostly the documents that held them
            # already are; those that did not (a step just written) are read here.
            read = {row.id for row in rows.values()}
            around = [i for i in to_rewrite(present) if i not in read]
            rows.update((row.rowid, row) for row in self._source.rows(repo, around))
            docs = documents(self._source, repo, rows.values())
            stats = self._stats.get(repo)
            if stats is not None:
                for before in self._live(repo, [*(key(repo, r) for r in gone),
                                                *(key(repo, d.row.rowid) for d in docs)]):
                    stats.add(before, -1)
            for rowid in gone:
                self._writer.delete_documents_by_term("key", key(repo, rowid))
                self._fresh.put(repo, key(repo, rowid), None)
            for doc in docs:
                self._put(repo, doc, fresh=True)
        except BaseException:
            self._stats.pop(repo, None)
            raise
        self._mark(repo, upto)

    def _live(self, repo: str, keys: list[str]) -> list[FreshDoc]:
        """The documents these keys name now: applied since the last commit, else
        committed."""
        keys = list(dict.fromkeys(keys))
        entries = self._fresh.entries(repo)
        out = [doc for k in keys if k in entries and (doc := entries[k][1]) is not None]
        return out + committed_docs(self._index.searcher(), self._schema,
                                    [k for k in keys if k not in entries])

    def _holders(self, repo: str, keys: list[str]) -> set[int]:
        """The rowids of the documents, committed or applied since, that hold the text of one
        of the nodes `keys`."""
        import tantivy as tv

        if not keys:
            return set()
        stale, held = self._fresh.holding(repo, keys)
        searcher = self._index.searcher()
        # A node's text is in at most 2 x WINDOW other documents.
        query = tv.Query.term_set_query(self._schema, "holds", keys)
        hits = unstale_hits(searcher, query, 2 * WINDOW * len(keys) + 1, stale, self._read)
        held |= {at for _, (at, _, _) in hits}
        return {rowid_of(k) for k in held}

    def _put(self, repo: str, doc: Document, *, fresh: bool = False) -> None:
        """Adds (or replaces) a node's document; `fresh`: searches see it before the next
        commit (a rebuild's documents wait for theirs: the store's search answers)."""
        import tantivy as tv

        row, at = doc.row, key(repo, doc.row.rowid)
        stems = self._analyzer.analyze(doc.text)
        self._writer.delete_documents_by_term("key", at)
        self._writer.add_document(tv.Document(
            key=at, id=row.id.encode(), repo=repo, type=row.type, text=doc.text,
            holds=list(doc.holds), stems=stem_text(stems), length=len(stems),
        ))
        made = FreshDoc.of(row.id, row.type, stems, doc.holds)
        if fresh:
            self._fresh.put(repo, at, made)
        stats = self._stats.get(repo)
        if stats is not None:
            stats.add(made)

    def _mark(self, repo: str, seq: int) -> None:
        import tantivy as tv

        self._writer.delete_documents_by_term("key", _META + repo)
        self._writer.add_document(
            tv.Document(key=_META + repo, id=repo.encode(), type=_META, seq=seq))
        self._applied[repo] = seq

    def _commit(self) -> None:
        upto = self._fresh.version
        self._writer.commit()
        self._index.reload()
        self._read = {}
        self._repos = None
        self._fresh.committed(upto)

    def _rebuild_step(self, repo: str) -> bool:
        """One batch of bringing `repo` up: of a rebuild from its nodes when the log cannot
        (a rebuild is done batch by batch, letting go of the lock between them), else of the
        log's next entries. True when the repo is current. Holds the lock."""
        cursor = self._rebuilds.get(repo)
        if cursor is None:
            seq, horizon, epoch = self._source.state(repo)
            if epoch != self._epoch:
                self._restart(epoch)
            applied = self._applied.get(repo, 0)
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
            self._writer.delete_documents_by_term("key", _META + repo)
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

    def _take(self, folder: Path, epoch: str) -> bool:
        import tantivy as tv

        folder.mkdir(parents=True, exist_ok=True)
        try:
            index = open_index(folder, self._schema)
            writer = index.writer(heap_size=HEAP, num_threads=1)
        except ValueError as error:
            if "LockBusy" in str(error):
                return False
            # Unreadable (a disk that lost the last write): the store has it all, start over.
            log.warning("lexical index: %s is unreadable (%s); rebuilding it", folder, error)
            shutil.rmtree(folder)
            folder.mkdir(parents=True)
            index = open_index(folder, self._schema)
            writer = index.writer(heap_size=HEAP, num_threads=1)
        index.config_reader(reload_policy="manual")
        self._index, self._writer, self._repos, self._read = index, writer, None, {}
        searcher = index.searcher()
        marks = searcher.search(tv.Query.term_query(self._schema, "key", _EPOCH), 1).hits
        if not marks or searcher.doc(marks[0][1])["id"][0] != epoch.encode():
            self._restart(epoch)
            return True
        self._epoch = epoch
        meta = tv.Query.term_query(self._schema, "type", _META)
        for _, address in searcher.search(meta, max(1, searcher.num_docs)).hits:
            doc = searcher.doc(address)
            self._applied[doc["id"][0].decode()] = int(doc["seq"][0])
        return True

    def _restart(self, epoch: str) -> None:
        """Wipes the slot (another store's, or this store's of before an erasure: a document
        may hold erased words, and tantivy keeps a deleted document's words in its segment
        until a merge) and marks it as of `epoch`; every repo is then brought up again from
        the store. The old segments' files are deleted. Holds the lock."""
        import tantivy as tv

        self._writer.rollback()  # what was applied and not committed is of the old epoch
        self._writer.delete_all_documents()
        self._writer.add_document(tv.Document(key=_EPOCH, id=epoch.encode()))
        self._applied.clear()
        self._rebuilds.clear()
        self._stats.clear()
        self._fresh = Fresh()
        self._epoch = epoch
        self._commit()
        self._writer.garbage_collect_files()

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


