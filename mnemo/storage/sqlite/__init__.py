"""The SQLite backend: one file (or `:memory:`) holds every store, on one connection."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio

from mnemo.storage.sqlite.conversation import SqliteThreads
from mnemo.storage.sqlite.coordination import SqliteCoordination
from mnemo.storage.sqlite.database import Database
from mnemo.storage.sqlite.graph import SqliteGraph
from mnemo.storage.sqlite.sessions import SqliteSessions


class SqliteBackend:
    """Every store of one SQLite file (`mnemo.storage.ports.Backend`)."""

    def __init__(
        self,
        path: str | Path,
        *,
        dims: Callable[[str], int],
        busy_timeout: float,
        synchronous: str = "NORMAL",
    ) -> None:
        self.database = Database(path, synchronous=synchronous, busy_timeout=busy_timeout)
        self.graph = SqliteGraph(self.database, dims)
        self.sessions = SqliteSessions(self.database)
        self.threads = SqliteThreads(self.database)
        self.coordination = SqliteCoordination(self.database)

    async def open(self) -> None:
        await self.database.open()

    async def close(self) -> None:
        try:
            # Stops an HNSW build that is still running; bounded, as it was in Memory.aclose.
            with anyio.move_on_after(2, shield=True):
                await self.graph.aclose()
        finally:
            await self.database.close()
