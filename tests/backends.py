"""Test helpers that reach under a store on either backend: open its stores without a
`Memory`, and run raw SQL on it (to look at rows, or to fault them).

SQL here is written once with `?` placeholders and runs on both backends (`%s` on PostgreSQL);
a statement only one backend understands belongs in a test that says which backend it is for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import pytest

import mnemo
from mnemo.storage.ports import Backend, open_backend
from mnemo.storage.sqlite import SqliteBackend

# The `store` fixture's parameters: every test that stores something runs once on each.
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@asynccontextmanager
async def open_stores(
    store: str, dim: int | Callable[[str], int], *, lexical_dir: str | None = None
) -> AsyncIterator[Backend]:
    """The backend of `store` (a SQLite path or a PostgreSQL URL), opened, closed after;
    `lexical_dir=""` leaves its lexical index out (the store's own text search answers)."""
    dims = dim if callable(dim) else (lambda repo: dim)
    backend = open_backend(store, dims=dims, busy_timeout=5.0, lexical_dir=lexical_dir)
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()


def backend_of(owner: mnemo.Memory | Backend) -> Backend:
    backend: Backend = owner._backend if isinstance(owner, mnemo.Memory) else owner
    return backend


def is_sqlite(owner: mnemo.Memory | Backend) -> bool:
    return isinstance(backend_of(owner), SqliteBackend)


def vector_of(node_id: str, owner: mnemo.Memory | Backend) -> str:
    """A WHERE clause for the row of `vectors` of the node `node_id` (an id without quotes):
    SQLite keys a vector by its node's rowid, PostgreSQL by the node's id."""
    if is_sqlite(owner):
        return f"node = (SELECT rowid FROM nodes WHERE id = '{node_id}')"
    return f"node_id = '{node_id}'"


def links_table(owner: mnemo.Memory | Backend) -> str:
    """A FROM clause's table of the links as (repo, src, dst, type), their ends by node id,
    named `links`: SQLite names a link's ends by their nodes' rowids."""
    if is_sqlite(owner):
        return (
            "(SELECT a.repo AS repo, a.id AS src, b.id AS dst, l.type AS type FROM links l"
            " JOIN nodes a ON a.rowid = l.src JOIN nodes b ON b.rowid = l.dst) AS links"
        )
    return "links"


def link_end(node_id: str, owner: mnemo.Memory | Backend) -> str:
    """What a link's `src` or `dst` holds for the node `node_id` (an id without quotes)."""
    if is_sqlite(owner):
        return f"(SELECT rowid FROM nodes WHERE id = '{node_id}')"
    return f"'{node_id}'"


async def sql(
    owner: mnemo.Memory | Backend, statement: str, *params: object
) -> list[tuple[Any, ...]]:
    """Runs one statement (with `?` placeholders) on the store and returns its rows (none for a
    statement that returns none), committed. PostgreSQL's times come back as SQLite holds
    them, ISO 8601 text."""
    backend = backend_of(owner)
    if isinstance(backend, SqliteBackend):

        def run(db: Any) -> list[tuple[Any, ...]]:
            with db.atomic():
                cursor = db.conn.execute(statement, params)
                return [tuple(row) for row in cursor.fetchall()]

        return await backend.database.run(run)
    from mnemo.storage.postgres.store import PostgresBackend

    assert isinstance(backend, PostgresBackend)
    async with backend.postgres.transaction() as conn:
        # Without parameters, several statements may go in one call (`SET LOCAL ...; ...`).
        cur = await conn.execute(
            statement.replace("?", "%s"), params or None
        )
        rows = await cur.fetchall() if cur.description else []
        return [tuple(_as_sqlite(value) for value in row) for row in rows]


def _as_sqlite(value: object) -> object:
    return value.isoformat() if isinstance(value, datetime) else value
