"""The host clocks the stores' clocks (`ServerClock`, `HostClock`) are made of: the wall
clock, read once, and the boot time clock, which never steps, counting from there."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


# Linux's boot time clock counts a suspended host's sleep; elsewhere, the monotonic clock.
_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)


# Seconds on a forward-only clock, the same for every process on the host.
elapsed: Callable[[], float] = (
    time.monotonic if _BOOTTIME is None else functools.partial(time.clock_gettime, _BOOTTIME)
)
