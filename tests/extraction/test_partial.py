"""An extraction task that fails for good: by default the extraction fails, naming the task
and its trajectory; with `Config(partial_commits=True)` what the other tasks produced is
committed, every step with it, and the receipt says what is missing and why; on each
backend."""

from __future__ import annotations

import pytest

import mnemo
from mnemo import NodeType as N
from tests.conftest import REPO
from tests.fakes import FakeEmbedder, FakeLLM

STEPS = [("walk north", "go north"), ("open door", "push door")]


async def _session(mem: mnemo.Memory) -> str:
    sid = await mem.start_session("explore the house", repo=REPO)
    for observation, action in STEPS:
        await mem.append(sid, observation, action)
    return sid


async def test_a_failed_task_fails_the_extraction_naming_itself(store: str) -> None:
    """By default a procedural task failing for good fails the extraction: the error names
    the task and the trajectory (with its subgoal), and nothing is committed."""
    llm = FakeLLM()
    llm.fail_tasks.add("procedural")
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        sid = await _session(mem)
        with pytest.raises(mnemo.PipelineError, match=r"procedural of trajectory \d \('"):
            await mem.close_and_commit(sid, max_retries=0)
        assert await mem.get_nodes_by_type(REPO, [N.EPISODIC]) == []


async def test_partial_commits_keep_what_the_other_tasks_produced(store: str) -> None:
    """With partial_commits, the failing procedural task leaves only its part out: every
    step and every fact is committed (and recalled), no procedure, and the receipt names the
    procedural tasks and why they failed."""
    llm = FakeLLM()
    llm.fail_tasks.add("procedural")
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO, config=mnemo.Config(partial_commits=True))
        sid = await _session(mem)
        receipt = await mem.close_and_commit(sid, max_retries=0)
        assert len(receipt.missing) == 2
        assert all(m.startswith("procedural of trajectory") for m in receipt.missing)
        assert all("procedural" in m.split(": ", 1)[1] for m in receipt.missing)
        assert len(await mem.get_nodes_by_type(REPO, [N.EPISODIC])) == 2
        assert len(await mem.get_nodes_by_type(REPO, [N.SEMANTIC])) == 2
        assert await mem.get_nodes_by_type(REPO, [N.PROCEDURAL]) == []
        found = await mem.recall(REPO, "open door")
        assert any("open door" in m.node.text for m in found.memories)


async def test_a_partial_ingest_says_what_it_lacks(store: str) -> None:
    """An ingest with partial_commits whose semantic task fails stores the steps and the
    procedures, and its receipt names the semantic task."""
    llm = FakeLLM()
    llm.fail_tasks.add("semantic")
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO, config=mnemo.Config(partial_commits=True))
        receipt = await mem.ingest(
            REPO, mnemo.Trajectory("explore", [mnemo.Step(o, a) for o, a in STEPS]),
            source_id="walk",
        )
        assert receipt.created
        assert [m.split(" of ")[0] for m in receipt.missing] == ["semantic", "semantic"]
        assert await mem.get_nodes_by_type(REPO, [N.SEMANTIC]) == []
        assert len(await mem.get_nodes_by_type(REPO, [N.PROCEDURAL])) == 2
