"""`Statements`: one connection's statements, called the same way on both backends, so that a
store's logic is written once (`storage.threads`) and a backend gives only its driver and SQL.

Statements are written with `?` placeholders; PostgreSQL's (`storage.postgres.connection`)
turns them into psycopg's `%s`. The calls are coroutines on both backends: on SQLite they never
wait (each runs its statement at once, in the database's thread), and `drive` runs a piece of
work made of them to its end inside that thread, in one `Database.run`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from mnemo.storage.row import Row

T = TypeVar("T")


class Statements(Protocol):
    """One connection (inside a transaction, for a write)."""

    async def rows(self, query: str, params: Sequence[Any] = ()) -> list[Row]:
        """Every row of one statement."""
        ...

    async def row(self, query: str, params: Sequence[Any] = ()) -> Row | None:
        """The first row of one statement (None when there is none)."""
        ...

    async def run(self, query: str, params: Sequence[Any] = ()) -> int:
        """Runs one statement; returns how many rows it changed (0 when the driver tells
        none)."""
        ...

    async def run_many(self, query: str, params: Sequence[Sequence[Any]]) -> None:
        """Runs one statement for each parameter row (none for no row)."""
        ...

    def stream(self, query: str, params: Sequence[Any] = ()) -> AsyncGenerator[Row, None]:
        """The rows of one statement, read lazily (a page at a time on PostgreSQL, inside a
        transaction): a bounded read of a long table stops early. Close it
        (`contextlib.aclosing`) when the loop may end before the rows do."""
        ...


# A store's piece of work on one connection.
Work = Callable[[Statements], Coroutine[Any, Any, T]]


class Driver(Protocol):
    """How a backend runs a store's work (`storage.sqlite.database.Database`,
    `storage.postgres.connection.Postgres`)."""

    async def read(self, work: Work[T]) -> T:
        """Runs `work`, a read."""
        ...

    async def together(self, work: Work[T]) -> T:
        """Runs `work`, a read of several statements, on one snapshot."""
        ...

    async def write(self, work: Work[T]) -> T:
        """Runs `work` in one transaction."""
        ...

    async def one(self, work: Work[T]) -> T:
        """Runs `work`, a write of one statement (its own transaction)."""
        ...

    async def side_write(self, work: Work[T]) -> T:
        """Runs a read's side write in one transaction (on SQLite it waits for another
        writer a tenth of a second, not the busy timeout)."""
        ...


class SqlStore(ABC):
    """A store written once over `Statements`; a backend's subclass gives what differs."""

    # Appended to an ORDER BY of ids: text compared byte by byte, as SQLite compares it.
    BYTE_ORDER = ""

    def __init__(self, driver: Driver) -> None:
        self._driver = driver

    @abstractmethod
    def _stamp(self, at: datetime) -> object:
        """A time as a statement's parameter."""


def utc(moment: datetime) -> datetime:
    """`moment` in UTC (a naive datetime is taken as UTC)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def moment(value: str | datetime) -> datetime:
    """A stored time: SQLite's ISO-8601 text, or PostgreSQL's datetime in UTC."""
    return datetime.fromisoformat(value) if isinstance(value, str) else utc(value)


def drive(work: Coroutine[Any, Any, T]) -> T:
    """Runs a coroutine that never waits (every statement it awaits runs at once in this
    thread) to its end, and returns its result.

    Raises:
        RuntimeError: it waited for something else (it is closed first).
    """
    try:
        work.send(None)
    except StopIteration as stop:
        result: T = stop.value
        return result
    work.close()
    raise RuntimeError("a statement waited outside the database's thread")


def marks(count: int) -> str:
    """`count` placeholders for an `IN (...)` list."""
    return ", ".join("?" * count)
