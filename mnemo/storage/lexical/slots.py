"""The lexical index's slots: `Slot`, the one a process holds (its tantivy writer and what it
applied of the store's log), and `wipe_free`, `drop_older` for the slots it does not hold. A
slot's documents are of one epoch of the store (renewed by each erasure): a slot of an older
one is wiped before it is committed to, answers or is let go, and a free one when found."""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
from pathlib import Path
from typing import Any

import filelock

from mnemo.storage.lexical.fresh import (
    Fresh,
    FreshDoc,
    Statistics,
    Stored,
    Totals,
    committed_docs,
    stem_text,
    unstale_hits,
)
from mnemo.storage.lexical.schema import open_index, schema
from mnemo.storage.lexical.source import (
    WINDOW,
    Document,
    LexicalSource,
    documents,
    key,
    rowid_of,
    to_rewrite,
)

log = logging.getLogger("mnemo.lexical")

HEAP = 32_000_000
# tantivy's writer lock in a slot's folder: an OS lock (flock) its holder keeps while it lives.
WRITER_LOCK = ".tantivy-writer.lock"
# The keys of a repo's mark (the log's last sequence applied) and of the slot's epoch.
META = "\x01meta/"
EPOCH = "\x01epoch"


class Slot:
    """One process's slot of the index for one store; every method holds `_lock`."""

    def __init__(self, folder: Path, source: LexicalSource) -> None:
        self._base = folder
        self._folder = folder
        self._source = source
        self._lock = threading.Lock()  # the writer, `_applied`, the source's connection
        self._opened = False
        self._index: Any = None
        self._writer: Any = None
        self._schema: Any = None
        self._analyzer: Any = None
        self._applied: dict[str, int] = {}
        self._rebuilds: dict[str, tuple[int, int]] = {}  # repo -> (its seq, last rowid done)
        self._fresh = Fresh()  # applied, not yet committed
        self._stats: dict[str, Statistics] = {}
        # Committed documents searches read since the last commit.
        self._read: dict[tuple[int, int], Stored] = {}
        # How many times the searcher changed; tantivy's `Totals` of the current one.
        self._generation = 0
        self._totals: tuple[int, Totals] | None = None
        # Up to two repos with committed documents, read once per commit.
        self._repos: list[str] | None = None
        self._epoch: str | None = None  # the store's epoch the slot's documents are of
        self.slot: Path | None = None

    def _log_state(self, repo: str) -> tuple[int, int, int]:
        """The repo's log (sequence, horizon) and the slot's applied sequence (the slot started
        over first if the store's epoch moved)."""
        seq, horizon, epoch = self._source.state(repo)
        self._follow(epoch)
        return seq, horizon, self._applied.get(repo, 0)

    def _follow(self, epoch: str) -> bool:
        """Whether the slot is of the store's `epoch`; if not (an erasure it has not applied),
        wipes it first. Holds the lock."""
        if epoch == self._epoch:
            return True
        self._restart(epoch)
        return False

    def _apply(self, repo: str, after: int, upto: int) -> None:
        """Applies the log's entries in (after, upto]: the changed nodes' documents and those
        of the windows holding their text; the statistics follow."""
        try:
            present, gone = self._source.changes(repo, after, upto)
            changed = [key(repo, r) for r in gone] + [key(repo, row.rowid) for row in present]
            rows = {row.rowid: row for row in present}
            held = self._holders(repo, changed) - rows.keys()
            rows.update((row.rowid, row) for row in self._source.by("rowid", repo, sorted(held)))
            read = {row.id for row in rows.values()}
            around = [i for i in to_rewrite(present) if i not in read]
            rows.update((row.rowid, row) for row in self._source.by("id", repo, around))
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
        """The documents these keys name now, fresh or committed."""
        keys = list(dict.fromkeys(keys))
        entries = self._fresh.entries(repo)
        out = [doc for k in keys if k in entries and (doc := entries[k][1]) is not None]
        return out + committed_docs(self._index.searcher(), self._schema,
                                    [k for k in keys if k not in entries])

    def _holders(self, repo: str, keys: list[str]) -> set[int]:
        """The rowids of the documents holding the text of one of the nodes `keys`."""
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
        """Adds (or replaces) a node's document; `fresh`: searches see it before the commit."""
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

        self._writer.delete_documents_by_term("key", META + repo)
        self._writer.add_document(
            tv.Document(key=META + repo, id=repo.encode(), type=META, seq=seq))
        self._applied[repo] = seq

    def _commit(self) -> bool:
        """Commits what was applied, or wipes the slot instead if an erasure came since it was
        read (the store's epoch moved); whether it committed. Holds the lock."""
        if not self._follow(self._source.epoch()):
            return False
        self._save()
        return True

    def _save(self) -> None:
        upto = self._fresh.version
        self._writer.commit()
        self._index.reload()
        self._read = {}
        self._generation += 1
        self._repos = None
        self._fresh.committed(upto)

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
        self._generation += 1
        searcher = index.searcher()
        if not of_epoch(searcher, self._schema, epoch):
            self._restart(epoch)
            return True
        self._epoch = epoch
        meta = tv.Query.term_query(self._schema, "type", META)
        for _, address in searcher.search(meta, max(1, searcher.num_docs)).hits:
            doc = searcher.doc(address)
            self._applied[doc["id"][0].decode()] = int(doc["seq"][0])
        return True

    def _restart(self, epoch: str) -> None:
        """Wipes the slot, old segment files included (erased words stay in a segment until a
        merge), and marks it as of `epoch`. Holds the lock."""
        import tantivy as tv

        self._writer.rollback()  # what was applied and not committed is of the old epoch
        self._writer.delete_all_documents()
        self._writer.add_document(tv.Document(key=EPOCH, id=epoch.encode()))
        self._applied.clear()
        self._rebuilds.clear()
        self._stats.clear()
        self._fresh = Fresh()
        self._epoch = epoch
        self._save()
        self._writer.garbage_collect_files()


def of_epoch(searcher: Any, fields: Any, epoch: str) -> bool:
    """Whether the slot `searcher` reads is marked as of the store's `epoch`."""
    import tantivy as tv

    marks = searcher.search(tv.Query.term_query(fields, "key", EPOCH), 1).hits
    return bool(marks) and searcher.doc(marks[0][1])["id"][0] == epoch.encode()


def _clean(folder: Path, fields: Any, epoch: str) -> bool:
    """Whether the slot in `folder` is empty or of the store's `epoch`."""
    try:
        searcher = open_index(folder, fields).searcher()
    except ValueError:
        return False
    return not searcher.num_segments or of_epoch(searcher, fields, epoch)


def wipe_free(place: Path, layout: str, epoch: str, *, keep: Path | None) -> bool:
    """Deletes the documents of every free slot under `place` but `keep` that is neither empty
    nor of the store's `epoch`, and the free slots of layouts older than `layout`; whether
    such a slot was held (its holder wipes it)."""
    drop_older(place, layout)
    current = place / layout
    if not current.is_dir():
        return False
    fields, held = schema(), False
    for folder in sorted(current.iterdir()):
        if folder == keep or not folder.is_dir() or _clean(folder, fields, epoch):
            continue
        try:
            writer = open_index(folder, fields).writer(heap_size=HEAP, num_threads=1)
        except ValueError as error:
            if "LockBusy" in str(error):
                held = True
            else:
                shutil.rmtree(folder, ignore_errors=True)
            continue
        try:
            # Without the epoch's mark: its next holder starts it over (`_take`).
            writer.delete_all_documents()
            writer.commit()
            writer.garbage_collect_files()
        finally:
            del writer
    return held


def drop_older(place: Path, layout: str) -> None:
    """Deletes the free slots of layouts older than `layout`, and their emptied folders."""
    if not place.is_dir():
        return
    for older in place.iterdir():
        name = older.name
        if not (name[:1] == "v" and name[1:].isdigit() and name != layout and older.is_dir()):
            continue
        for folder in older.iterdir():
            lock = filelock.FileLock(folder / WRITER_LOCK, timeout=0)
            try:
                with lock:
                    shutil.rmtree(folder, ignore_errors=True)
            except (filelock.Timeout, OSError):
                continue  # held: its process keeps it
        with contextlib.suppress(OSError):
            older.rmdir()
