"""The two clocks of a host that the stores' clocks are made of: the wall clock, read once
to place the store's time, and a clock that only moves forward, which counts from there.

A step of the wall clock (NTP, a date set by hand, a VM resumed) moves every time read from
it; the boot time clock never steps. Leases, heartbeats and a session's last use are judged
by the store's time: on PostgreSQL the server's read plus the time elapsed since
(`postgres.clock.ServerClock`), on SQLite an anchor kept in the file plus the time elapsed
since (`sqlite.clock.HostClock`).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime


def host_now() -> datetime:
    """This host's wall clock, in UTC."""
    return datetime.now(UTC)


# Linux's boot time clock counts a suspended host's sleep; elsewhere, the monotonic clock.
_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)


def elapsed() -> float:
    """Seconds on a clock that only moves forward (and never steps with the wall clock), the
    same for every process on the host."""
    return time.monotonic() if _BOOTTIME is None else time.clock_gettime(_BOOTTIME)
