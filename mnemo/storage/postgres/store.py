"""The PostgreSQL backend: every store of one database, over one pool of connections."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mnemo.storage.lexical.index import LexicalIndex
from mnemo.storage.postgres.clock import ServerClock
from mnemo.storage.postgres.connection import Postgres
from mnemo.storage.postgres.conversation import PgThreads
from mnemo.storage.postgres.coordination import PgCoordination
from mnemo.storage.postgres.graph import PgGraph
from mnemo.storage.postgres.lexical import PgLexicalSource, default_folder
from mnemo.storage.postgres.sessions import PgSessions

# Connections one Memory may hold: a commit holds one for its repo's advisory lock and uses
# another, a recall runs its channels on two or three at once.
MAX_CONNECTIONS = 10


class PostgresBackend:
    def __init__(
        self,
        url: str,
        *,
        dims: Callable[[str], int],
        busy_timeout: float,
        max_connections: int = MAX_CONNECTIONS,
        lexical_dir: str | Path | None = None,
        ann_dir: str | Path | None = None,
    ) -> None:
        """`lexical_dir`, `ann_dir`: the lexical index's and the HNSW graphs' folder (None:
        `lexical.default_folder()`; "": none)."""
        self.postgres = Postgres(url, busy_timeout=busy_timeout, max_size=max_connections)
        lexical, graphs = (None if folder == "" else Path(folder) if folder else default_folder()
                           for folder in (lexical_dir, ann_dir))
        self.graph = PgGraph(self.postgres, dims, ann_dir=graphs, lexical=None if lexical is None
                             else LexicalIndex(lexical, PgLexicalSource(url, busy_timeout)))
        self.clock = ServerClock(self.postgres)
        self.sessions = PgSessions(self.postgres, self.clock)
        self.threads = PgThreads(self.postgres)
        self.coordination = PgCoordination(self.postgres, self.clock)

    async def open(self) -> None:
        """Applies pending migrations, opens the pool and reads the server's time (closing the
        pool if that fails). Raises `StorageError` ("unavailable", "extension_missing", "busy")."""
        await self.postgres.open(migrate=True)
        try:
            await self.clock.sync()
        except BaseException:
            await self.postgres.close()
            raise

    async def close(self) -> None:
        await self.graph.aclose()
        await self.postgres.close()
