"""The offline knowledge-update set (`tests/recall/offline_updates.py`) on the offline
defaults, on both backends."""

from __future__ import annotations

import pytest

import mnemo
from tests.recall.offline_updates import CASES, evaluate, remember


@pytest.mark.slow
async def test_the_value_that_holds_now_ranks_first(store: str) -> None:
    """With the offline LLM and the default embedder, every case's stale fact is retired by
    the later step that corrects it, and the first memory that names either value is live and
    names the current one."""
    async with mnemo.Memory(store) as mem:
        await remember(mem)
        missed = await evaluate(mem)
    assert len(CASES) >= 12
    assert [(case.question, why) for case, why in missed] == []
