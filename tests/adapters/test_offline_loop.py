"""The offline LLM on long inputs: its heuristics leave the event loop free (issue 9)."""

from __future__ import annotations

import time

import anyio
import pytest

from mnemo.adapters.offline import OfflineLLM
from mnemo.episode.annotation import annotate
from mnemo.extraction.prompts import parse_facts, procedural_request, semantic_request
from tests.fakes import FakeEmbedder

# A bound a deployment might configure (Config.max_text_chars), and an observation that fills
# it with distinct sentences: on the loop its heuristics would block it for about a second.
MAX_CHARS = 400_000


def big_observation(chars: int = MAX_CHARS) -> str:
    sentences: list[str] = []
    total = 0
    i = 0
    while total < chars:
        sentence = f"Server node{i} runs the service svc{i * 7} on port {8000 + i} with cache{i}."
        sentences.append(sentence)
        total += len(sentence) + 1
        i += 1
    return " ".join(sentences)[:chars]


async def test_loop_keeps_running_while_offline_llm_annotates_and_extracts() -> None:
    """A 5 ms ticker never waits over 0.25 s while a max-size observation is annotated and
    extracted by the offline LLM."""
    llm = OfflineLLM()
    observation = big_observation()
    gaps: list[float] = []
    done = anyio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await anyio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await annotate(
            llm, FakeEmbedder(), goal="keep the fleet up", observation=observation,
            action="restart the cache on every server", previous=None, recent=[],
        )
        steps = [{"index": 0, "observation": observation, "action": "restart the cache now"}]
        facts = parse_facts(await llm.generate(
            semantic_request(goal="keep the fleet up", subgoal="servers", steps=steps)
        ))
        await llm.generate(procedural_request(goal="g", subgoal="servers", steps=steps))
        done.set()
    assert facts
    assert gaps
    assert max(gaps) < 0.25


async def test_fail_after_fires_during_a_long_offline_call() -> None:
    """A deadline around the offline LLM's answer to a long request fires (a call that never
    yields to the loop could not be interrupted)."""
    steps = [{"index": 0, "observation": big_observation(), "action": "restart the cache"}]
    request = semantic_request(goal="keep the fleet up", subgoal="servers", steps=steps)
    with pytest.raises(TimeoutError), anyio.fail_after(0.02):
        await OfflineLLM().generate(request)
