"""Automatic summaries and compactions saved by hand: no summary's content is lost."""

from __future__ import annotations

import pytest

import mnemo
from tests.conversation._support import OfflineFake, user

MANUAL = "MANUAL: the deploy password rotates on fridays"


@pytest.mark.parametrize("manual", [(1, 2), (0, 2)], ids=["inside", "rolled-in"])
async def test_summary_keeps_a_compaction_it_replaces(
    cmem: mnemo.Memory, offline: OfflineFake, manual: tuple[int, int]
) -> None:
    """An automatic summary whose range holds a save_compaction record (inside it, or the
    previous record it rolls in) gets that record's text in its request, and load still
    shows what the record said, in the one summary standing for the range."""
    conv = cmem.conversation(compression=mnemo.Summary(max_tokens=60, keep=1))
    history = [user(f"m{i} routine chatter about nothing much") for i in range(4)]
    await conv.save("t", history)
    await conv.save_compaction("t", *manual, MANUAL)
    history += [
        user(f"m{i} more routine chatter about the weather and lunch plans today")
        for i in range(4, 12)
    ]
    await conv.save("t", history)

    records = await conv.compactions("t")
    assert [(c.start_seq, c.end_seq) for c in records] == [(0, 10)]
    [request] = [r for r in offline.calls if r.task == "summary"]
    assert MANUAL in str(request.messages), "the replaced record was not summarised"
    loaded = await conv.load("t")
    summaries = [str(m["content"]) for m in loaded if m["role"] == "system"]
    assert len(summaries) == 1
    assert "password rotates on fridays" in summaries[0]
    assert loaded[1:] == history[11:]
