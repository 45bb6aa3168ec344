"""`ServerClock`: the store's time as one `Memory` on PostgreSQL knows it.

Leases, heartbeats and a session's last use are compared across every Memory on the
database, on any number of hosts. Stamped and judged with each host's own clock, a host whose
clock ran ahead by more than a lease took over the others' live work (their leases looked
ended), and one behind had its own taken (its heartbeats looked old). So every such time is
the server's: each Memory keeps its host clock's offset to the server's `clock_timestamp()`,
measured when it opens and at each janitor look (twice a lease), and reads host time plus
that offset, without a round trip. The offset is known within half a round trip.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from mnemo.storage.postgres.connection import Postgres


def host_now() -> datetime:
    """This host's clock, in UTC."""
    return datetime.now(UTC)


class ServerClock:
    """The server's time as host time plus a measured offset."""

    def __init__(self, pg: Postgres, host: Callable[[], datetime] = host_now) -> None:
        self._pg = pg
        self.host = host
        self._offset = timedelta(0)

    def now(self) -> datetime:
        """The server's time, by this host's clock and the last measured offset."""
        return self.host() + self._offset

    async def sync(self) -> None:
        """Measures the offset again: the server's time against the middle of the host's
        round trip that read it.

        Raises:
            StorageError: the server could not be asked (the last offset stays).
        """
        async with self._pg.connection() as conn:
            before = self.host()
            cur = await conn.execute("SELECT clock_timestamp()")
            after = self.host()
            row = await cur.fetchone()
        assert row is not None
        server = row[0]
        assert isinstance(server, datetime)
        self._offset = server - (before + (after - before) / 2)
