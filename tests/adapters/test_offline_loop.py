"""The offline LLM on long inputs: its heuristics leave the event loop free."""

from __future__ import annotations

import anyio
import pytest

import mnemo
from mnemo.adapters.offline import MAX_FACTS, OfflineLLM
from mnemo.episode import NO_VECTOR, StepRecord, annotate_step
from mnemo.errors import DEFAULT_MAX_TEXT_CHARS
from mnemo.extraction.prompts import parse_facts, procedural_request, semantic_request
from tests.fakes import FakeEmbedder, open_test_memory
from tests.loop import ticking

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


@pytest.mark.slow
async def test_loop_keeps_running_while_offline_llm_annotates_and_extracts() -> None:
    """A 5 ms ticker never waits over 0.25 s while a max-size observation is annotated and
    extracted by the offline LLM."""
    llm = OfflineLLM()
    observation = big_observation()
    async with ticking() as ticker:
        step = StepRecord("episode_0:0", 0, "", observation, "restart the cache on every server",
                          "", "", NO_VECTOR)
        await annotate_step(
            lambda: llm, FakeEmbedder(), mnemo.Config(), "keep the fleet up", step, [],
            new_trajectory="trajectory_0", name="step 0",
        )
        steps = [{"index": 0, "observation": observation, "action": "restart the cache now"}]
        facts = parse_facts(await llm.generate(
            semantic_request(goal="keep the fleet up", subgoal="servers", steps=steps)
        ))
        await llm.generate(procedural_request(goal="g", subgoal="servers", steps=steps))
    assert facts
    assert ticker.gaps
    assert ticker.longest < 0.25


async def test_semantic_keeps_the_most_informative_facts_in_order() -> None:
    """A long observation yields at most MAX_FACTS facts, the most informative, in order."""
    filler = [f"The cluster number {i} runs the service well." for i in range(100)]
    specific = [
        f"Server node{i} on port {8000 + i} runs Redis 7.2 with TLS and AOF." for i in range(3)
    ]
    sentences = filler[:40] + specific[:1] + filler[40:] + specific[1:]
    steps = [{"index": 0, "observation": " ".join(sentences), "action": "look"}]
    facts = parse_facts(await OfflineLLM().generate(
        semantic_request(goal="keep the fleet up", subgoal="servers", steps=steps)
    ))
    propositions = [f.proposition for f in facts]
    assert len(propositions) == MAX_FACTS
    assert all(s in propositions for s in specific)
    assert propositions == sorted(propositions, key=sentences.index)


async def test_memory_commits_a_max_size_observation_without_blocking_the_loop() -> None:
    """With the offline defaults, appending and committing an observation of the default
    Config.max_text_chars leaves the loop free (no 5 ms tick late by 0.25 s), with bounded
    facts."""
    async with open_test_memory(llm=None) as mem:
        await mem.open_repo("r")
        async with ticking() as ticker:
            sid = await mem.start_session("keep the fleet up", repo="r")
            await mem.append(sid, big_observation(DEFAULT_MAX_TEXT_CHARS), "restart the cache")
            await mem.close_and_commit(sid)
        facts = await mem.get_nodes_by_type("r", [mnemo.NodeType.SEMANTIC])
    assert 0 < len(facts) <= MAX_FACTS
    assert ticker.gaps
    assert ticker.longest < 0.25


async def test_fail_after_fires_during_a_long_offline_call() -> None:
    """A deadline around the offline LLM's answer to a long request fires (a call that never
    yields to the loop could not be interrupted)."""
    steps = [{"index": 0, "observation": big_observation(), "action": "restart the cache"}]
    request = semantic_request(goal="keep the fleet up", subgoal="servers", steps=steps)
    with pytest.raises(TimeoutError), anyio.fail_after(0.02):
        await OfflineLLM().generate(request)
