"""The SQLite backend: one file (or `:memory:`) holds every store, on one connection."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import anyio

from mnemo.config import DEFAULT_IDLE_SESSION_TIMEOUT
from mnemo.storage.coordination import SqlCoordination
from mnemo.storage.lexical.index import LexicalIndex
from mnemo.storage.lexical.source import LexicalSource
from mnemo.storage.row import Row
from mnemo.storage.sql import Statements, marks
from mnemo.storage.sqlite.conversation import SqliteThreads
from mnemo.storage.sqlite.database import Database, storage_error
from mnemo.storage.sqlite.graph import SqliteGraph
from mnemo.storage.sqlite.sessions import SqliteSessions


class SqliteCoordination(SqlCoordination):
    """The `Coordination` port over SQLite, for Memory objects sharing a file. The change token
    is `PRAGMA data_version` (moves on another connection's commit, no I/O)."""

    DISTINCT = " IS NOT "
    AUTO_COMMIT = "json_extract(config, '$.auto_commit')"
    IDLE_LEFT = (
        "(julianday(updated_at) - julianday(?)) * 86400.0 + coalesce("
        f"json_extract(config, '$.idle_session_timeout'), {DEFAULT_IDLE_SESSION_TIMEOUT})"
    )
    CHANGE_TOKEN = "PRAGMA data_version"
    _driver: Database

    def _idle_params(self, now: datetime) -> tuple[object, ...]:
        return (self._stamp(now),)

    async def _end_due(self, sql: Statements, due: list[str], now: datetime) -> list[Row]:
        at = self._stamp(now)
        return await sql.rows(
            "UPDATE sessions SET ended = 1, version = version + 1, holder = NULL,"
            " lease_until = NULL, updated_at = ? WHERE ended = 0 AND state = 'idle'"
            f" AND id IN ({marks(len(due))}) AND {self.IDLE_LEFT} <= 0 RETURNING id, repo",
            (at, *due, at),
        )


class SqliteLexicalSource(LexicalSource):
    """Reads the log and nodes on a read-only connection of its own, never waiting for nor
    holding up the writing one (so not for `:memory:`, which has no second)."""

    def __init__(self, path: str | Path, busy_timeout: float) -> None:
        self._path = str(path)
        self._busy_ms = int(busy_timeout * 1000)
        self._conn: sqlite3.Connection | None = None

    def _rows(self, statement: str, params: tuple[object, ...] = ()) -> list[object]:
        try:
            if self._conn is None:
                uri = Path(self._path).resolve().as_uri() + "?mode=ro"
                conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
                conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
                self._conn = conn
            return self._conn.execute(statement, params).fetchall()
        except sqlite3.Error as exc:
            raise storage_error(exc) from exc


class SqliteBackend:
    def __init__(
        self,
        path: str | Path,
        *,
        dims: Callable[[str], int],
        busy_timeout: float,
        synchronous: str = "NORMAL",
        lexical_dir: str | Path | None = None,
        ann_dir: str | Path | None = None,
    ) -> None:
        """`lexical_dir`, `ann_dir`: the lexical index's and HNSW graphs' folder (None: beside
        the file; "" or `:memory:`: none)."""
        self.database = Database(path, synchronous=synchronous, busy_timeout=busy_timeout)
        self.graph = SqliteGraph(
            self.database, dims, ann_dir=_beside(path, ann_dir, "hnsw"),
            lexical=None if (where := _beside(path, lexical_dir, "lexical")) is None
            else LexicalIndex(where, SqliteLexicalSource(path, busy_timeout)),
        )
        self.sessions = SqliteSessions(self.database)
        self.threads = SqliteThreads(self.database)
        self.coordination = SqliteCoordination(self.database, self.database.clock)

    async def open(self) -> None:
        await self.database.open()

    async def close(self) -> None:
        try:
            with anyio.move_on_after(2, shield=True):
                await self.graph.aclose()
        finally:
            await self.database.close()


def _beside(path: str | Path, folder: str | Path | None, suffix: str) -> Path | None:
    """A cache folder of the file's: "<file>.<suffix>", or its own inside `folder`."""
    if str(path) == ":memory:" or folder == "":
        return None
    if folder is None:
        return Path(f"{path}.{suffix}")
    # One folder may serve many stores: each gets its own, named by the file's path.
    name = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:16]
    return Path(folder) / f"sqlite-{name}"
