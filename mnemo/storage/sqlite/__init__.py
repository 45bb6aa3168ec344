"""The SQLite backend: one file (or `:memory:`) holds every store, on one connection."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import anyio

from mnemo.config import DEFAULT_IDLE_SESSION_TIMEOUT
from mnemo.conversation.drafts import MessageDraft
from mnemo.graph.scope import canonical
from mnemo.ports import vector_from_blob, vector_to_blob
from mnemo.storage.coordination import SqlCoordination
from mnemo.storage.lexical.index import LexicalIndex
from mnemo.storage.lexical.source import LexicalSource
from mnemo.storage.row import Row
from mnemo.storage.sql import Statements, T, Work, marks
from mnemo.storage.sqlite.database import Database, file_uri, storage_error
from mnemo.storage.sqlite.graph import SqliteGraph, SqliteSessions, match_expression
from mnemo.storage.thread_rows import SearchQuery
from mnemo.storage.threads import SqlThreads


class SqliteThreads(SqlThreads):
    """The conversation store on SQLite, searched by FTS5 (`messages_fts`, `match_expression`)."""

    _driver: Database

    def _message_row(self, message_id: str, thread_id: str, seq: int, draft: MessageDraft,
                     at: datetime) -> Row:
        return (message_id, thread_id, seq, draft.role, draft.text,
                None if draft.content == draft.text else draft.content,
                json.dumps(draft.data, sort_keys=True), self._stamp(at), draft.tokens,
                canonical(draft.metadata))

    _vector = staticmethod(vector_to_blob)
    _vector_of = staticmethod(vector_from_blob)

    def _prefix(self, prefix: str) -> tuple[str, tuple[object, ...]]:
        return "id >= ? AND id < ?", (prefix, prefix + "\U0010ffff")

    async def _erase(self, write: Work[T], erased: Callable[[T], object] = bool) -> T:
        async def merged(sql: Statements) -> T:
            done = await write(sql)
            if erased(done):  # deleted words stay in old segments until a merge
                await sql.run("INSERT INTO messages_fts(messages_fts) VALUES ('optimize')")
            return done

        done = await self._driver.write(merged)
        await self._driver.scrub(erased=bool(erased(done)))
        return done

    async def _candidates(self, sql: Statements, query: SearchQuery) -> list[Row]:
        match = match_expression(query.words)
        conditions: list[str] = []
        params: list[object] = []
        if query.thread_id is not None:
            conditions.append("m.thread_id = ?")
            params.append(query.thread_id)
            # FTS5 seeks to the thread's rowid range rather than rank every thread's matches.
            span = await sql.row(
                "SELECT min(rowid), max(rowid) FROM messages WHERE thread_id = ?",
                (query.thread_id,),
            )
            if span is None or span[0] is None:
                return []
            conditions.append("messages_fts.rowid BETWEEN ? AND ?")
            params += [span[0], span[1]]
        for key, values in (query.where or {}).items():
            # Each of the scope's keys: the message's value at that key is one of its values,
            # both read back by SQLite (same type and value, however either JSON spells it).
            conditions.append(
                "EXISTS (SELECT 1 FROM json_each(m.metadata) j WHERE j.key = ? AND"
                " (j.type, j.value) IN (SELECT type, value FROM json_each(?)))")
            params += [key, f"[{','.join(values)}]"]
        unseen, hidden = self._unseen(query)
        conditions += unseen
        params += hidden
        if conditions:
            rows = await sql.rows(
                "SELECT m.rowid, bm25(messages_fts) AS score, m.recorded_at FROM messages_fts"
                " JOIN messages m ON m.rowid = messages_fts.rowid"
                f" WHERE messages_fts MATCH ? AND {' AND '.join(conditions)}"
                " ORDER BY score LIMIT ?",
                [match, *params, query.pool],
            )
        else:
            # Without a filter FTS5 orders by rank itself, keeping only the best `pool` rows.
            rows = await sql.rows(
                "SELECT f.rowid, f.rank, m.recorded_at FROM"
                " (SELECT rowid, rank FROM messages_fts WHERE messages_fts MATCH ?"
                "  ORDER BY rank LIMIT ?) AS f JOIN messages m ON m.rowid = f.rowid",
                (match, query.pool),
            )
        return [(rowid, -score, at) for rowid, score, at in rows]


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
                conn = sqlite3.connect(file_uri(self._path, read_only=True), uri=True,
                                       check_same_thread=False, isolation_level=None)
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
        inspect: bool = False,
    ) -> None:
        """`lexical_dir`, `ann_dir`: the lexical index's and HNSW graphs' folder (None: beside
        the file; "" or `:memory:`: none); `inspect`: as `Database`'s."""
        self.database = Database(path, synchronous=synchronous, busy_timeout=busy_timeout,
                                 inspect=inspect)
        self.graph = SqliteGraph(
            self.database, dims, ann_dir=_beside(path, ann_dir, "hnsw"),
            lexical=None if (where := _beside(path, lexical_dir, "lexical")) is None
            else LexicalIndex(where, SqliteLexicalSource(path, busy_timeout)),
        )
        self.sessions = SqliteSessions(self.database, self.database.clock)
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
