"""The two clocks of a host that the stores' clocks are made of: the wall clock, read once
to place the store's time, and a clock that only moves forward, which counts from there.

The boot time clock never steps. The store's time is the server's read plus the time elapsed
since on PostgreSQL (`ServerClock`), a file's anchor plus the time elapsed on SQLite
(`HostClock`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """A store's time (`ServerClock`, `HostClock`)."""

    def now(self) -> datetime: ...


def host_now() -> datetime:
    """This host's wall clock, in UTC."""
    return datetime.now(UTC)


# Linux's boot time clock counts a suspended host's sleep; elsewhere, the monotonic clock.
_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)


# Seconds on a clock that only moves forward, the same for every process on the host (a C
# function: the append path reads it).
elapsed: Callable[[], float] = (
    time.monotonic if _BOOTTIME is None else functools.partial(time.clock_gettime, _BOOTTIME)
)
