"""The knowledge-update suite (`tests/recall/knowledge_update.py`) on both backends."""

from __future__ import annotations

import pytest

import mnemo
from tests.recall import knowledge_update
from tests.recall.fact_first import SuiteLLM, evaluate, remember


@pytest.mark.slow
async def test_a_corrected_fact_answers_with_its_current_value(store: str) -> None:
    """Of 45 facts corrected in a later session, the current value ranks first for at least
    9 in 10 of their questions."""
    llm = SuiteLLM(knowledge_update.SESSIONS, knowledge_update.CORRECTIONS)
    async with mnemo.Memory(store, llm=llm) as mem:
        await remember(mem, knowledge_update.SESSIONS)
        report = await evaluate(mem, knowledge_update.CASES)
    assert len(knowledge_update.CASES) >= 40
    misses = [(case.question, texts[:2]) for case, rank, texts in report.ranks if rank != 1]
    assert report.hit_at_1 >= 0.9, misses
