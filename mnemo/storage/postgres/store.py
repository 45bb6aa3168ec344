"""The PostgreSQL backend: every store of one database, over one pool of connections, and its
clock (`ServerClock`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from mnemo.config import DEFAULT_IDLE_SESSION_TIMEOUT
from mnemo.errors import StorageError
from mnemo.storage import clock as host_clock
from mnemo.storage.coordination import SqlCoordination
from mnemo.storage.lexical.index import LexicalIndex
from mnemo.storage.postgres.connection import PgDialect, Postgres
from mnemo.storage.postgres.conversation import PgThreads
from mnemo.storage.postgres.graph import PgGraph
from mnemo.storage.postgres.lexical import PgLexicalSource, default_folder
from mnemo.storage.postgres.sessions import PgSessions
from mnemo.storage.row import Row
from mnemo.storage.sql import Statements

# Connections one Memory may hold: a commit holds one for its repo's advisory lock and uses
# another, a recall runs its channels on two or three at once.
MAX_CONNECTIONS = 10
SAMPLES = 3


class ServerClock:
    """The store's time on PostgreSQL, compared across hosts: the server's `clock_timestamp()`
    read at open and at each takeover look (best of `SAMPLES` round trips), plus this host's
    monotonic time since."""

    def __init__(self, pg: Postgres, host: Callable[[], datetime] = host_clock.host_now) -> None:
        self._pg = pg
        self.host = host  # before the first read only
        self._read: tuple[datetime, float] | None = None  # the server's time, and when

    def now(self) -> datetime:
        if self._read is None:
            return self.host()
        server, at = self._read
        return server + timedelta(seconds=host_clock.elapsed() - at)

    async def sync(self) -> None:
        """Reads the server's time again; on `StorageError` the last read stays."""
        samples: list[tuple[float, datetime, float]] = []  # (round trip, time, when)
        async with self._pg.connection() as conn:
            for _ in range(SAMPLES):
                before = host_clock.elapsed()
                cur = await conn.execute("SELECT clock_timestamp()")
                after = host_clock.elapsed()
                row = await cur.fetchone()
                server = None if row is None else row[0]
                if not isinstance(server, datetime):
                    raise StorageError("unavailable", f"the server's time read {server!r}")
                samples.append((after - before, server, before + (after - before) / 2))
        _, server, at = min(samples, key=lambda sample: sample[0])
        self._read = (server, at)


class PgCoordination(PgDialect, SqlCoordination):
    """The `Coordination` port over PostgreSQL, for Memory objects on any hosts. The change
    token is the server's next transaction id: a wake-up may be spurious, never missed."""

    AUTO_COMMIT = "(config->>'auto_commit')::boolean"
    # By the server's clock.
    IDLE_LEFT = (
        "extract(epoch FROM updated_at - clock_timestamp()) + coalesce("
        f"(config->>'idle_session_timeout')::float8, {DEFAULT_IDLE_SESSION_TIMEOUT})"
    )
    CHANGE_TOKEN = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"

    _clock: ServerClock

    async def sync_clock(self) -> None:
        await self._clock.sync()

    async def _end_due(self, sql: Statements, due: list[str], now: datetime) -> list[Row]:
        # A row another writer holds is left for the next sweep: it may be moving on.
        return await sql.rows(
            "UPDATE sessions SET ended = true, version = version + 1, holder = NULL,"
            " lease_until = NULL, updated_at = clock_timestamp() WHERE id IN (SELECT id"
            " FROM sessions WHERE id = ANY(?) AND NOT ended AND state = 'idle'"
            f" AND {self.IDLE_LEFT} <= 0 FOR UPDATE SKIP LOCKED) RETURNING id, repo",
            (due,),
        )


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
