"""`Statements`: one connection's statements (`?` placeholders), the same coroutines on both
backends so a store is written once. On SQLite they never wait, and `drive` runs a piece of
work to its end in the database's thread."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from mnemo.graph.model import Vector
from mnemo.storage.row import Row

T = TypeVar("T")


class Statements(Protocol):
    """One connection (inside a transaction, for a write)."""

    async def rows(self, query: str, params: Sequence[Any] = ()) -> list[Row]: ...

    async def row(self, query: str, params: Sequence[Any] = ()) -> Row | None:
        """The first row of one statement (None when there is none)."""

    async def run(self, query: str, params: Sequence[Any] = ()) -> int:
        """Runs one statement; returns how many rows it changed (0 if unknown)."""

    async def run_many(self, query: str, params: Sequence[Sequence[Any]]) -> None:
        """Runs one statement for each parameter row (none for no row)."""

    def stream(self, query: str, params: Sequence[Any] = ()) -> AsyncGenerator[Row, None]:
        """The rows of one statement, read lazily; close it (`contextlib.aclosing`) when the
        loop may end early."""


Work = Callable[[Statements], Coroutine[Any, Any, T]]


class Driver(Protocol):
    """How a backend runs a store's work (`Database`, `Postgres`)."""

    async def read(self, work: Work[T]) -> T: ...

    async def together(self, work: Work[T]) -> T:
        """Runs `work`, a read of several statements, on one snapshot."""

    async def write(self, work: Work[T]) -> T:
        """Runs `work` in one transaction."""

    async def one(self, work: Work[T]) -> T:
        """Runs `work`, a write of one statement (its own transaction)."""

    async def side_write(self, work: Work[T]) -> T:
        """Runs a read's side write in one transaction (short lock wait on SQLite)."""


class Dialect:
    """What the backends write differently in a statement, as SQLite writes it (PostgreSQL:
    `postgres.connection.PgDialect`)."""

    # Appended to an ORDER BY of ids: text compared byte by byte, as SQLite compares it.
    BYTE_ORDER = ""
    # Appended to a SELECT whose rows stay locked until the transaction ends.
    LOCK = ""
    # The same, shared: others may read them locked so, none may change them.
    SHARE = ""
    # Appended to a JSON column read as its text.
    TEXT = ""
    # `column{ANY}`: the column is one of a list given as one parameter (`_list`).
    ANY = " IN (SELECT value FROM json_each(?))"
    _vector: Callable[[Vector], object]  # a vector as a statement's parameter

    @staticmethod
    def _list(values: Sequence[str]) -> object:
        return json.dumps(list(values))

    @staticmethod
    def _json(value: object) -> object:
        """A JSON value as a parameter (None stays NULL)."""
        return None if value is None else json.dumps(value, sort_keys=True)

    @staticmethod
    def _json_text(text: str) -> object:
        return text

    def _stamp(self, at: datetime) -> object:
        """A time as a statement's parameter: ISO-8601 text (text order is time order)."""
        return at.isoformat(timespec="microseconds")

    @staticmethod
    def _time(text: str | None) -> object:
        return text

    @staticmethod
    async def _lock_claims(sql: Statements, session_id: str) -> None:
        """Serialises the writes of the session's step claims until the transaction ends
        (SQLite's transaction holds the file's write lock from its start)."""


class SqlStore(Dialect):
    """A store written once over `Statements`; a backend's subclass gives what differs."""

    def __init__(self, driver: Driver) -> None:
        self._driver = driver

    async def _rows(self, statement: str, params: Sequence[Any] = ()) -> list[Row]:
        return await self._driver.read(lambda sql: sql.rows(statement, params))

    async def _among(self, statement: str, ids: Sequence[str], *before: object) -> list[Row]:
        """The rows of `statement` with `{}` a list for `ids`, 500 ids at a time."""
        rows: list[Row] = []
        for chunk in chunks(ids, 500):
            rows += await self._rows(statement.format(marks(len(chunk))), [*before, *chunk])
        return rows

    async def texts(self, node_ids: Sequence[str]) -> dict[str, str]:
        """The text of each node among `node_ids` that the store holds."""
        rows = await self._among("SELECT id, text FROM nodes WHERE id IN ({})", node_ids)
        return {str(i): str(t) for i, t in rows}


def utc(moment: datetime) -> datetime:
    """`moment` in UTC (a naive datetime is taken as UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def moment(value: str | datetime) -> datetime:
    """A stored time: SQLite's ISO-8601 text, or PostgreSQL's datetime in UTC."""
    return datetime.fromisoformat(value) if isinstance(value, str) else utc(value)


def drive(work: Coroutine[Any, Any, T]) -> T:
    """Runs a coroutine that never waits to its end; its result. `RuntimeError` if it waited."""
    try:
        work.send(None)
    except StopIteration as stop:
        result: T = stop.value
        return result
    work.close()
    raise RuntimeError("a statement waited outside the database's thread")


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def marks(count: int) -> str:
    """`count` placeholders for an `IN (...)` list."""
    return ", ".join("?" * count)


async def number(sql: Statements, query: str, *params: object) -> int:
    """The first value of a statement's first row as an int (0 for no row or NULL)."""
    row = await sql.row(query, params)
    return int(row[0] or 0) if row else 0
