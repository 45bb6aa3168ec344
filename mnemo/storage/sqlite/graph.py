"""`SqliteGraph`: the `GraphStore` port over SQLite. Commits to a repo are serialised by a
per-repo lock (across processes too); each is one transaction recorded in `applied_changesets`
with its side writes."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import filelock

from mnemo.errors import ConflictError, StorageError
from mnemo.graph import ann, ann_files
from mnemo.graph.commit import CommitPlan
from mnemo.graph.model import CommitReceipt, Link, LinkType
from mnemo.storage.graph_writes import SqlGraphWrites
from mnemo.storage.lexical import LexicalIndex
from mnemo.storage.maintenance import MaintainedGraph
from mnemo.storage.reembed_claims import Claims
from mnemo.storage.reembeds import ReembeddedGraph
from mnemo.storage.row import loads
from mnemo.storage.sqlite.database import Database, truncate_wal
from mnemo.storage.sqlite.maintenance import SqliteMaintenance
from mnemo.storage.sqlite.recall_graph import SqliteRecallReads
from mnemo.storage.sqlite.reembeds import SqliteReembeds
from mnemo.storage.sqlite.rows import half_blob, pack_text, unpack_text
from mnemo.storage.sqlite.rows import node as node_of
from mnemo.storage.sqlite.sessions import SqliteSessions
from mnemo.storage.sqlite.vectors import SqliteVectors


class SqliteGraphWrites(SqlGraphWrites):
    """The graph's writes on SQLite: links and vectors by node rowid, half-float vectors, a
    commit record's lists that grow with it packed (`rows.pack_text`), erasures ending with a
    merge of the FTS5 index (deleted words stay in old segments until then)."""

    SCRUB = ("INSERT INTO nodes_fts(nodes_fts) VALUES ('optimize')",
             "UPDATE lexical_epoch SET epoch = lower(hex(randomblob(16)))")
    SESSIONS = SqliteSessions
    _vector = staticmethod(half_blob)
    _receipt = staticmethod(pack_text)

    @staticmethod
    def _record(values: list[Any], packed: bool) -> object:
        text = json.dumps(values)
        return pack_text(text) if packed else text

    @staticmethod
    def _loads(value: Any) -> Any:
        return None if value is None else loads(unpack_text(value))


class SqliteGraph(SqliteRecallReads, MaintainedGraph, ReembeddedGraph):
    """`GraphStore` over mnemo's SQLite file."""

    MAINTENANCE = SqliteMaintenance()
    REEMBEDS = SqliteReembeds()
    WRITES = SqliteGraphWrites()

    def __init__(self, database: Database, dims: Callable[[str], int], *,
                 ann_threshold: int | None = ann.DEFAULT_THRESHOLD,
                 ann_params: ann.HnswParams | None = None, lexical: LexicalIndex | None = None,
                 ann_dir: Path | None = None) -> None:
        """`ann_threshold`: size past which searches use HNSW (None: always exact); `lexical`:
        the index for `search_text` (None: FTS5); `ann_dir`: where HNSW graphs are saved."""
        self._database = self._driver = database
        self._lexical = lexical
        self._dims = dims
        self._locks: dict[str, anyio.Lock] = {}
        self._reembeds = Claims()
        self._vectors = SqliteVectors(
            database, dims, ann_threshold=ann_threshold, ann_params=ann_params, ann_dir=ann_dir)

    @property
    def database(self) -> Database:
        return self._database

    @asynccontextmanager
    async def _repo_lock(self, repo: str) -> AsyncIterator[None]:
        timeout = self._database.busy_timeout
        busy = StorageError("busy", f"another process held repo {repo!r}'s lock for {timeout}s")
        async with self._locks.setdefault(repo, anyio.Lock()), self._holding(
                repo, "repo", timeout, busy):
            yield

    @asynccontextmanager
    async def _holding(self, repo: str, kind: str, wait: float,
                       busy: Exception) -> AsyncIterator[None]:
        """The repo's lock file of `kind` (none for a database in memory), taken within
        `wait` seconds (`busy` raised past them)."""
        held = self._file_lock(repo, kind)
        if held is None:
            yield
            return
        try:
            # Shielded: a lock taken in the thread must be released, not abandoned.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(functools.partial(held.acquire, timeout=wait))
        except filelock.Timeout:
            raise busy from None
        except OSError as exc:  # its folder gone, read-only, full: no driver error out
            raise StorageError(
                "unavailable", f"cannot take repo {repo!r}'s {kind} lock file: {exc}") from exc
        try:
            yield
        finally:
            held.release()

    def _file_lock(self, repo: str, kind: str) -> filelock.FileLock | None:
        path = self._database.path
        if path == ":memory:" or path.startswith("file:"):
            return None
        digest = hashlib.sha256(repo.encode()).hexdigest()[:24]
        # Not thread-local: taken in a worker thread, released on the event loop's.
        return filelock.FileLock(f"{path}-{kind}-{digest}.lock", thread_local=False)

    async def _committed(self, plan: CommitPlan) -> None:
        if self._vectors.loaded(plan.repo) is not None:
            await self._vectors.index(plan.repo)

    _ids = staticmethod(SqliteGraphWrites._loads)
    _node = staticmethod(node_of)

    @staticmethod
    def _receipt(value: Any) -> CommitReceipt:
        return CommitReceipt.from_json(unpack_text(value))

    async def links(self, repo: str) -> list[Link]:
        rows = await self._rows(
            "SELECT a.id, b.id, l.type FROM nodes a JOIN links l ON l.src = a.rowid"
            " JOIN nodes b ON b.rowid = l.dst WHERE a.repo = ? ORDER BY l.type, a.id, b.id",
            [repo])
        return [Link(src, dst, LinkType(kind)) for src, dst, kind in rows]

    async def _erased(self) -> None:
        """After an erasure's transaction: truncates the WAL, wipes the lexical slots."""
        await self._database.run(truncate_wal)
        await super()._erased()

    # ---- re-embedding (`mnemo.graph.reembed`; the SQL in `storage/reembeds.py`) ----------

    def _reembed_lock(self, repo: str, busy: ConflictError
                      ) -> AbstractAsyncContextManager[None]:
        """A lock file beside the file, taken without waiting (freed when its process dies)."""
        return self._holding(repo, "reembed", 0, busy)

    async def vectors_switched(self, repo: str, dim: int) -> None:
        """Drops the repo's saved HNSW graphs; the index in memory reloads at its next use."""
        folder = self._vectors.graph_folder(repo)
        if folder is not None:
            await anyio.to_thread.run_sync(ann_files.discard, folder)
