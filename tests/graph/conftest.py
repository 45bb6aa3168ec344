"""Fixtures for the graph tests: the graph store of a fresh store, on each backend."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mnemo.graph.ports import GraphStore
from mnemo.storage.ports import Backend
from tests.backends import open_stores
from tests.graph._support import DIM


@pytest.fixture
async def backend(store: str) -> AsyncIterator[Backend]:
    async with open_stores(store, DIM) as opened:
        yield opened


@pytest.fixture
def graph(backend: Backend) -> GraphStore:
    return backend.graph
