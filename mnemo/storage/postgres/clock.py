"""`ServerClock`: the store's time on PostgreSQL, compared across hosts: the server's
`clock_timestamp()` read at open and at each takeover look (best of `SAMPLES` round trips), plus
this host's monotonic time since."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from mnemo.errors import StorageError
from mnemo.storage import clock as host_clock
from mnemo.storage.postgres.connection import Postgres

SAMPLES = 3


class ServerClock:
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
