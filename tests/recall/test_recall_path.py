"""How far a query walks: the files of mnemo one recall runs through.

What is counted (`tests/paths.py`, as `tests/session/test_append_path.py` counts for an append):
the distinct source files under mnemo/, `adapters/` left out, of the Python functions called
(`sys.setprofile` and `threading.setprofile` "call" events) on every thread from the call of
`Memory.recall` until it returns. The recall is a second one (the first warmed the repo's caches
up), on the offline model and the hashing embedder, over a SQLite file holding one committed
session; the holder's periodic work (`timers.holder`) does not run, as it is not the recall's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import mnemo
from tests.paths import files_run, quiet_holder

# The most files a recall may run through (what counts: the module's docstring).
MOST_FILES = 25


async def test_a_recall_runs_through_few_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One recall runs through at most `MOST_FILES` files of mnemo, and through none of the
    model calls, sessions or step annotation: with the default config no model is asked
    (the offline heuristics plan), and no session is touched."""
    quiet_holder(monkeypatch)
    async with mnemo.Memory(
        str(tmp_path / "memory.db"), llm=mnemo.OfflineLLM(), embedder=mnemo.HashEmbedder()
    ) as mem:
        await mem.open_repo("r")
        sid = await mem.start_session("tidy the shed", repo="r")
        await mem.append(sid, "the shed is full of boxes", "open the first box")
        await mem.append(sid, "the box holds old tools", "sort the tools")
        await mem.close_and_commit(sid)
        await mem.recall("r", "tools in the shed")
        with files_run() as seen:
            result = await mem.recall("r", "old tools in boxes")
    assert result.memories
    files = sorted(seen)
    assert "recall/engine.py" in files
    assert not [f for f in files if f.startswith(("calls/", "session/", "episode/"))], files
    assert len(files) <= MOST_FILES, files
