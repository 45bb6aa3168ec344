"""How far a query walks: the files of mnemo one recall runs through.

What is counted is what `/work/tools/measure_paths.py` counts (as
`tests/session/test_append_path.py` does for an append): the distinct source files under
mnemo/, `adapters/` left out, of the Python functions called (`sys.setprofile` and
`threading.setprofile` "call" events) on every thread from the call of `Memory.recall` until
it returns. The recall is a second one (the first warmed the repo's caches up), on the offline
model and the hashing embedder, over a SQLite file holding one committed session; the holder's
periodic work (`timers.holder`) does not run, as it is not the recall's.
"""

from __future__ import annotations

import sys
import threading
import types
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import TaskStatus

import mnemo
from mnemo.session import timers

PACKAGE = Path(mnemo.__file__).parent

# The most files a recall may run through (what counts: the module's docstring).
MOST_FILES = 25


async def test_a_recall_runs_through_few_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One recall runs through at most `MOST_FILES` files of mnemo, and through none of the
    model calls, sessions or step annotation: with the default config no model is asked
    (the offline heuristics plan), and no session is touched."""

    async def quiet(live: Any, *, task_status: TaskStatus[None]) -> None:
        task_status.started()
        await anyio.sleep_forever()

    monkeypatch.setattr(timers, "holder", quiet)
    seen: set[str] = set()

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        path = frame.f_code.co_filename
        if event == "call" and path.startswith(str(PACKAGE)):
            seen.add(str(Path(path).relative_to(PACKAGE)))

    async with mnemo.Memory(
        str(tmp_path / "memory.db"), llm=mnemo.OfflineLLM(), embedder=mnemo.HashEmbedder()
    ) as mem:
        await mem.open_repo("r")
        sid = await mem.start_session("tidy the shed", repo="r")
        await mem.append(sid, "the shed is full of boxes", "open the first box")
        await mem.append(sid, "the box holds old tools", "sort the tools")
        await mem.close_and_commit(sid)
        await mem.recall("r", "tools in the shed")
        threading.setprofile(profile)
        sys.setprofile(profile)
        try:
            result = await mem.recall("r", "old tools in boxes")
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    assert result.memories
    files = sorted(name for name in seen if not name.startswith("adapters/"))
    assert "recall/engine.py" in files
    assert not [f for f in files if f.startswith(("calls/", "session/", "episode/"))], files
    assert len(files) <= MOST_FILES, files
