"""Fixtures for the graph tests: a `SqliteGraph` on an in-memory database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mnemo.storage.sqlite.database import Database
from mnemo.storage.sqlite.graph import SqliteGraph
from tests.graph._support import DIM


@pytest.fixture
async def database() -> AsyncIterator[Database]:
    db = Database(":memory:")
    await db.open()
    yield db
    await db.close()


@pytest.fixture
def graph(database: Database) -> SqliteGraph:
    return SqliteGraph(database, lambda repo: DIM)
