"""The host clocks the stores' clocks (`ServerClock`, `HostClock`) are made of: the wall
clock, read once, and the boot time clock, which never steps, counting from there."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


def host_now() -> datetime:
    """This host's wall clock, in UTC."""
    return datetime.now(UTC)


# Linux's boot time clock counts a suspended host's sleep; elsewhere, the monotonic clock.
_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)


# Seconds on a forward-only clock, the same for every process on the host.
elapsed: Callable[[], float] = (
    time.monotonic if _BOOTTIME is None else functools.partial(time.clock_gettime, _BOOTTIME)
)


class ReadClock:
    """A clock read once (`_read`: the time read, and `elapsed` then), counting on `elapsed`
    since; `host`, this host's wall clock, before the first read."""

    def __init__(self, host: Callable[[], datetime] = host_now) -> None:
        self.host = host
        self._read: tuple[datetime, float] | None = None

    def now(self) -> datetime:
        if self._read is None:
            return self.host()
        read, at = self._read
        return read + timedelta(seconds=elapsed() - at)
