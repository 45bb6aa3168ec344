"""The fact-first suite (`tests/recall/fact_first.py`) on both backends."""

from __future__ import annotations

import mnemo
from tests.recall.fact_first import CASES, SuiteLLM, evaluate, remember


def _misses(report: object) -> str:
    return "\n".join(f"{rank}: {case.question} -> {texts[:3]}"
                     for case, rank, texts in getattr(report, "ranks", []) if rank != 1)


async def test_an_extracted_fact_or_procedure_answers_first(store: str) -> None:
    """With the test model, the fact or procedure that answers a question ranks first for at
    least 9 in 10 of the suite's questions (MRR 0.9 or more)."""
    async with mnemo.Memory(store, llm=SuiteLLM()) as mem:
        await remember(mem)
        report = await evaluate(mem)
    assert len(CASES) >= 40
    assert report.hit_at_1 >= 0.9, _misses(report)
    assert report.mrr >= 0.9, _misses(report)
