"""The host clocks the stores' clocks (`ServerClock`, `HostClock`) are made of: the wall
clock, read once, and the boot time clock, which never steps, counting from there."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...


def host_now() -> datetime:
    """This host's wall clock, in UTC."""
    return datetime.now(UTC)


# Seconds on a forward-only clock, the same for every process on the host: Linux's boot time
# clock counts a suspended host's sleep; elsewhere, the monotonic clock.
elapsed: Callable[[], float] = (
    functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME)
    if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic
)
