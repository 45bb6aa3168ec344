"""`HostClock`: the store's time on SQLite, the same in every process of the host and never
stepped by a wall clock.

A SQLite file is shared by the processes of one host, and they all read one boot time clock
(`storage.clock.elapsed`). The file keeps an anchor (`store_clock`): the wall clock's time and
the boot time clock's reading at one moment of this boot, written by the first Memory that
opens the file after the host booted. The store's time is the anchor's wall time plus the
boot time elapsed since: every process computes the same, and no step of a wall clock (NTP, a
date set by hand, a process whose clock is faked) moves a lease, a heartbeat or a session's
last use, the times Memories judge each other by. Stamped with the wall clock, a step of two
hours ahead made every live holder's lease look ended, and a janitor took its extraction over.

A new boot (the kernel's boot id changed, or, where there is none, the boot time clock reads
less than at the anchor) anchors again; every holder recorded before it is then gone (its
process ended with the boot), and so are its leases.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.storage.clock import elapsed, host_now

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """This boot's id ("" where the kernel tells none)."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


class HostClock:
    """The store's time: the file's anchor plus the boot time elapsed since."""

    def __init__(self, wall: Callable[[], datetime] = host_now) -> None:
        self.wall = wall  # read to anchor a new boot, and before the file is open
        self._anchor: tuple[datetime, float] | None = None

    def now(self) -> datetime:
        if self._anchor is None:
            return self.wall()
        wall, at = self._anchor
        return wall + timedelta(seconds=elapsed() - at)

    def anchor(self, db: SqliteUtilsDatabase) -> None:
        """Reads the file's anchor, or writes one when it is of another boot (and forgets the
        holders of that boot). Runs in the connection's thread, when the file opens."""
        boot = boot_id()
        row = _anchor_of(db)
        if not _this_boot(row, boot):
            with db.atomic():
                row = _anchor_of(db)  # another process may have anchored meanwhile
                if not _this_boot(row, boot):
                    row = (boot, self.wall().isoformat(timespec="microseconds"), elapsed())
                    db.conn.execute("DELETE FROM store_clock")
                    db.conn.execute("INSERT INTO store_clock(boot, wall, at) VALUES (?, ?, ?)",
                                    row)
                    db.conn.execute("DELETE FROM holders")
        assert row is not None
        self._anchor = (datetime.fromisoformat(str(row[1])), float(row[2]))


def _anchor_of(db: SqliteUtilsDatabase) -> tuple[Any, ...] | None:
    row = db.conn.execute("SELECT boot, wall, at FROM store_clock").fetchone()
    return None if row is None else tuple(row)


def _this_boot(row: tuple[Any, ...] | None, boot: str) -> bool:
    return row is not None and row[0] == boot and elapsed() >= float(row[2])
