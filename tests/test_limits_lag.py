"""Work at the input limits leaves the event loop running: while an ingest of long steps, a
recall at `max_results`' ceiling with a query at `max_text_chars`, `get_linked_nodes` of
the steps it stored, a save of long messages and a Semantic load that embeds them all run,
a 5 ms ticker is never late by more than a generous bound (the aim, measured by
`scripts/bench_loop_lag.py` at 1,000 steps and messages, is 100 ms on a quiet machine)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import mnemo
from tests.loop import ticking

pytestmark = pytest.mark.slow

CHARS = 32_000
COUNT = 10
BOUND = 0.5  # seconds


@functools.cache
def text(seed: int, opening: str = "") -> str:
    """Random words of seven lowercase letters, `CHARS - 8` characters with `opening`."""
    letters = np.random.default_rng(seed).integers(ord("a"), ord("z") + 1, CHARS, np.uint8)
    letters[7::8] = ord(" ")
    return (opening + letters.tobytes().decode())[: CHARS - 8]


async def test_work_at_the_limits_keeps_the_loop_running(store: str) -> None:
    opening = "The payment service deploy failed on the staging cluster again. "
    steps = [mnemo.Step(text(i, opening), f"retry deploy {i}") for i in range(COUNT)]
    messages = [{"role": "user", "content": text(1_000 + i)} for i in range(5 * COUNT)]
    query = text(99)
    config = mnemo.Config(max_results=10_000)
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(), config=config) as mem:
        await mem.open_repo("r")
        lags: dict[str, float] = {}
        async with ticking() as ticker:
            await mem.ingest("r", mnemo.Trajectory("long steps", steps),
                                       source_id="long")
        lags["ingest"] = ticker.longest
        async with ticking() as ticker:
            found = await mem.recall("r", query, k=10_000)
        lags["recall"] = ticker.longest
        async with ticking() as ticker:
            matching = await mem.recall("r", "payment service deploy failed", k=10_000)
        lags["recall, every step matching"] = ticker.longest
        steps_ids = [n.id for n in await mem.get_nodes_by_type("r", [mnemo.NodeType.EPISODIC])]
        async with ticking() as ticker:
            linked = await mem.get_linked_nodes("r", steps_ids)
        lags["linked"] = ticker.longest
        async with ticking() as ticker:
            await mem.conversation().save("t", messages)
        lags["save"] = ticker.longest
        async with ticking() as ticker:
            loaded = await mem.conversation(retrieval=mnemo.Semantic(k=1_000)).load(
                "t", query=query)
        lags["semantic"] = ticker.longest
    assert found.memories
    assert len(matching.memories) >= COUNT
    assert linked
    assert len(loaded) == len(messages)
    assert max(lags.values()) < BOUND, lags
