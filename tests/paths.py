"""The files of mnemo a call runs through: the distinct source files under mnemo/, `adapters/` left
out, of the Python functions called (`sys.setprofile` and `threading.setprofile` "call" events)
on every thread while the call runs. The Memory's own periodic work (the holder's heartbeat and
takeover looks, `timers.holder`) is switched off: it is not the call's, and would make the count
depend on when it comes."""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import TaskStatus

import mnemo
from mnemo.session import timers

PACKAGE = Path(mnemo.__file__).parent


def quiet_holder(monkeypatch: pytest.MonkeyPatch) -> None:
    """Memories opened after this run no holder's periodic work."""

    async def quiet(live: Any, *, task_status: TaskStatus[None]) -> None:
        task_status.started()
        await anyio.sleep_forever()

    monkeypatch.setattr(timers, "holder", quiet)


@contextmanager
def files_run() -> Iterator[set[str]]:
    """The set the files run through inside the block are added to (relative to the package)."""
    seen: set[str] = set()

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        path = frame.f_code.co_filename
        if event == "call" and path.startswith(str(PACKAGE)):
            name = str(Path(path).relative_to(PACKAGE))
            if not name.startswith("adapters/"):
                seen.add(name)

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
