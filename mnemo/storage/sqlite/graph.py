"""`SqliteGraph`: the `GraphStore` port over SQLite. Commits to a repo are serialised by a
per-repo lock (across processes too); each is one transaction recorded in `applied_changesets`
with its side writes."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import filelock

from mnemo.errors import ConflictError, StorageError
from mnemo.graph import ann, ann_files, erasure
from mnemo.graph.commit import CommitPlan
from mnemo.graph.erasure import Inherited
from mnemo.graph.model import CommitReceipt, Link, LinkType, now_utc
from mnemo.graph.ports import Reverting, SideWrite
from mnemo.storage.lexical import LexicalIndex
from mnemo.storage.maintenance import MaintainedGraph
from mnemo.storage.reembeds import ReembeddedGraph
from mnemo.storage.sqlite import commits, deletes, history
from mnemo.storage.sqlite.database import Database, truncate_wal
from mnemo.storage.sqlite.maintenance import SqliteMaintenance
from mnemo.storage.sqlite.recall_graph import SqliteRecallReads
from mnemo.storage.sqlite.reembeds import SqliteReembeds
from mnemo.storage.sqlite.rows import node as node_of
from mnemo.storage.sqlite.rows import unpack_text
from mnemo.storage.sqlite.sessions import side_writes_alone
from mnemo.storage.sqlite.vectors import SqliteVectors


class SqliteGraph(SqliteRecallReads, MaintainedGraph, ReembeddedGraph):
    """`GraphStore` over mnemo's SQLite file."""

    MAINTENANCE = SqliteMaintenance()
    REEMBEDS = SqliteReembeds()

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
        self._reembeds = set()
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

    async def write_commit(self, plan: CommitPlan, also: Sequence[SideWrite]) -> None:
        repo = plan.repo
        await self._database.run(lambda db: commits.write_commit(db, plan, also))
        if self._vectors.loaded(repo) is not None:
            await self._vectors.index(repo)

    async def write_side(self, also: Sequence[SideWrite]) -> None:
        await self._database.run(lambda db: side_writes_alone(db, also))

    _ids = staticmethod(history.stored_ids)
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

    async def _delete_rows(self, repo: str, ids: list[str]) -> list[str]:
        return await self._database.run(lambda db: deletes.delete_nodes(db, repo, ids))

    async def _inherited(self, repo: str, key: str, one: bool) -> Inherited:
        return await self._database.run(lambda db: deletes.inherited(db, repo, key, one=one))

    async def _withdraw_rows(self, repo: str, key: str, also: Sequence[SideWrite],
                             plan: erasure.Plan, reverting: Reverting | None) -> list[str]:
        revert = None if reverting is None else (reverting.revert_id, now_utc().isoformat())
        return await self._database.run(
            lambda db: deletes.withdraw(db, repo, key, also, plan, revert))

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
