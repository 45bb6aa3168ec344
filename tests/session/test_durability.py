"""A killed process loses nothing accepted: a child drives a Memory to a point and dies with
`os._exit` (no cleanup at all), then a new Memory on the same store carries on (a SQLite file,
a PostgreSQL database)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import mnemo
from mnemo.calls.tasks import task_inputs
from tests.fakes import EventLog, FakeEmbedder, FakeLLM, js

ROOT = Path(__file__).resolve().parents[2]


def run_child(db: str, mode: str) -> tuple[str, str]:
    """Runs the child to its point of death; returns (session id, stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.session.durability_child", str(db), mode],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1], done.stderr


def reopen(db: str, llm: FakeLLM, events: EventLog) -> mnemo.Memory:
    return mnemo.Memory(db, llm=llm, embedder=FakeEmbedder(), on_event=events)


@pytest.mark.slow
async def test_killed_while_collecting_keeps_every_step(store: str) -> None:
    """A session killed while collecting comes back collecting, with all its steps."""
    sid, _ = run_child(store, "collecting")
    llm, events = FakeLLM(), EventLog()
    async with reopen(store, llm, events) as mem:
        assert await mem.list_repos() == ["r"]
        assert await mem.session_state(sid) is mnemo.State.COLLECTING
        context = await mem.session_context(sid)
        assert context is not None
        assert context.goal == "explore the house"
        assert context.recent_steps == ["walk north -> go north", "walk east -> go east",
                                        "walk south -> go south"]
        info = await mem.append(sid, "walk west", "go west")
        assert info.index == 3
        receipt = await mem.close_and_commit(sid)
        episodic = await mem.get_nodes_by_type("r", [mnemo.NodeType.EPISODIC])
        assert sorted(js(n.data)["index"] for n in episodic) == [0, 1, 2, 3]
        assert {n.id for n in episodic} <= set(receipt.node_ids)
        # The deferred rewards the child's appends scored were durable too.
        in_order = sorted(episodic, key=lambda n: js(n.data)["index"])
        assert [js(n.data)["reward"] for n in in_order] == [0.7, 0.7, 0.7, 0.7]


@pytest.mark.slow
async def test_killed_while_extracting_extracts_again(store: str) -> None:
    """A session killed mid-extraction is extracting after reopening, extracts again with the
    new Memory's LLM, and commits every step."""
    sid, _ = run_child(store, "extracting")
    llm, events = FakeLLM(), EventLog()
    async with reopen(store, llm, events) as mem:
        await mem.open_repo("r")
        assert await mem.session_state(sid) in (mnemo.State.EXTRACTING, mnemo.State.READY)
        await events.wait_state(mem, sid, mnemo.State.READY, mnemo.State.FAILED)
        assert await mem.session_state(sid) is mnemo.State.READY
        assert "semantic" in llm.tasks()
        receipt = await mem.commit(sid)
        assert receipt is not None
        facts = await mem.get_nodes_by_type("r", [mnemo.NodeType.SEMANTIC])
        assert sorted(f.text for f in facts) == ["fact: walk east", "fact: walk north",
                                                 "fact: walk south"]


@pytest.mark.slow
async def test_killed_when_ready_keeps_the_changeset(store: str) -> None:
    """A ready session survives a kill with its changeset: commit applies it without
    extracting again (the commit's own contradiction question is all it asks)."""
    sid, _ = run_child(store, "ready")
    llm, events = FakeLLM(), EventLog()
    async with reopen(store, llm, events) as mem:
        assert await mem.session_state(sid) is mnemo.State.READY
        receipt = await mem.commit(sid)
        assert receipt is not None
        assert set(llm.tasks()) <= {"contradiction"}
        assert len(await mem.get_nodes_by_type("r", [mnemo.NodeType.SEMANTIC])) == 3
        assert await mem.session_state(sid) is mnemo.State.IDLE


@pytest.mark.slow
async def test_killed_after_commit_keeps_the_nodes(store: str) -> None:
    """Once commit returned, its nodes survive a kill and the session is idle."""
    sid, stderr = run_child(store, "committed")
    node_ids = stderr.strip().splitlines()[-1].split()
    llm, events = FakeLLM(), EventLog()
    async with reopen(store, llm, events) as mem:
        assert await mem.session_state(sid) is mnemo.State.IDLE
        for node_id in node_ids:
            assert await mem.get_node("r", node_id) is not None


@pytest.mark.slow
async def test_killed_during_auto_commit_loses_and_repeats_nothing(store: str) -> None:
    """An auto-commit session killed while collecting its second trajectory comes back with
    the first committed and the second uncommitted; closing commits exactly the rest."""
    sid, _ = run_child(store, "auto")
    llm, events = FakeLLM(), EventLog()
    async with reopen(store, llm, events) as mem:
        assert await mem.session_state(sid) is mnemo.State.COLLECTING
        await mem.close_and_commit(sid)
        assert await mem.session_state(sid) is mnemo.State.IDLE
        episodic = await mem.get_nodes_by_type("r", [mnemo.NodeType.EPISODIC])
        assert sorted(js(n.data)["index"] for n in episodic) == [0, 1, 2, 3]
        extracted = [
            step["observation"]
            for request in llm.calls if request.task == "semantic"
            for step in js(task_inputs(request))["steps"]
        ]
        assert extracted == ["open door"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["collecting", "extracting"])
async def test_repos_and_their_config_persist(store: str, mode: str) -> None:
    """Repos and their config come back after a kill."""
    run_child(store, mode)
    async with reopen(store, FakeLLM(), EventLog()) as mem:
        assert await mem.list_repos() == ["r"]
        with anyio.fail_after(5):
            await mem.open_repo("r")
