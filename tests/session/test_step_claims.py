"""Each step of an auto-commit session is asked of a model once, whichever `Memory` extracts
it (the API contract, "Storage backends and many processes": nothing is done twice): a boundary's
background commit, a flush and a close claim the steps they extract in the store
(`Coordination.claim_steps`), leave another live holder's claims to it, and take over the
claims of one that left. A close waits for the claims of others, at most an extraction's time
limit. Other holders are `Memory` objects here, or holders registered through the port, as a
process that died or hangs would have left them.
"""

from __future__ import annotations

import dataclasses
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

import mnemo
from mnemo.session import registry
from mnemo.session.ports import HolderInfo
from tests.backends import backend_of, sql
from tests.fakes import (
    EventLog,
    FakeEmbedder,
    FakeLLM,
    extracted_observations,
    waiting_for_claims,
)

REPO = "r"
AUTO = mnemo.Config(auto_commit=True, flush_timeout=None, session_timeout=None)


async def opened(
    stack: AsyncExitStack, store: str, config: mnemo.Config | None = None
) -> tuple[mnemo.Memory, FakeLLM, EventLog]:
    """A Memory on `store` with its own fakes and repo "r" (with `config` when given)."""
    llm, events = FakeLLM(), EventLog()
    mem = await stack.enter_async_context(
        mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events)
    )
    await mem.open_repo(REPO, config=config)
    return mem, llm, events


async def in_the_graph(mem: mnemo.Memory) -> list[str]:
    """The observations of the EPISODIC nodes in the graph, sorted."""
    steps = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
    return sorted(n.text.split(" -> ")[0] for n in steps)


async def version(mem: mnemo.Memory, sid: str) -> int:
    lease = await backend_of(mem).coordination.lease(sid)
    assert lease is not None
    return lease.version


async def claims_left(mem: mnemo.Memory) -> list[tuple[object, ...]]:
    return await sql(mem, "SELECT step_id, holder FROM step_claims")


async def claimed_by_another(mem: mnemo.Memory, sid: str, name: str, *, seen: datetime) -> str:
    """Registers a holder `name` last seen at `seen`, on another host, and claims the
    session's first step for it, as its boundary commit would; returns the step's id."""
    co = backend_of(mem).coordination
    await co.register(HolderInfo(name, "another-host", 1, seen, seen))
    [(step_id,)] = await sql(mem, "SELECT id FROM steps WHERE session_id = ? AND idx = 0", sid)
    granted = await co.claim_steps(sid, [str(step_id)], name,
                                   unseen_since=seen - timedelta(seconds=30))
    assert granted == {step_id}
    return str(step_id)


async def test_a_close_while_another_memorys_background_commit_runs_extracts_each_step_once(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's boundary hands the first trajectory to a background commit, held in its model
    call; B closes the session meanwhile. B waits for A's commit instead of extracting the
    same step again, then extracts the rest: every step is asked of a model once, and is in
    the graph once. Before the store knew which steps a commit had taken, B extracted "walk
    north" too, and one of the two commits was refused (the model's work done twice)."""
    waiting = waiting_for_claims(monkeypatch)
    async with AsyncExitStack() as stack:
        a, a_llm, a_events = await opened(stack, store, AUTO)
        b, b_llm, b_events = await opened(stack, store)
        sid = await a.start_session("explore the house", repo=REPO)
        await a.append(sid, "walk north", "go north")
        held = a_llm.hold("semantic")
        await a.append(sid, "open door", "push door")  # a boundary: step 0 commits
        with anyio.fail_after(10):
            await held.started.wait()
        await b.close(sid)
        with anyio.fail_after(10):
            await waiting.wait()
        assert b_llm.calls == []
        held.release()
        with anyio.fail_after(10):
            landed = await b_events.wait_state(b, sid, mnemo.State.IDLE, mnemo.State.FAILED)
        assert landed is mnemo.State.IDLE
        assert extracted_observations(a_llm) == ["walk north"]
        assert extracted_observations(b_llm) == ["open door"]
        assert await in_the_graph(b) == ["open door", "walk north"]
        assert [e.kind for e in a_events.events].count("trajectory_committed") == 1
        assert await claims_left(b) == []


@pytest.mark.slow
async def test_the_drivers_flush_leaves_a_boundary_commit_elsewhere_its_steps(
    store: str,
) -> None:
    """A drives the session (flush_timeout 0.5 s); B appends a boundary, whose background
    commit of "walk north" is held in B's model call. A's flush comes meanwhile: it extracts
    and commits "open door" only. Before, A's flush extracted "walk north" as well. While B
    holds its claim, and once B's commit lands, A's later flushes find nothing to do and
    leave the session's version alone: A claimed the session again at every
    timeout, for good (it did not take in that the step was committed), and then while B's
    claim lasted."""
    config = mnemo.Config(auto_commit=True, flush_timeout=0.5, session_timeout=None)
    async with AsyncExitStack() as stack:
        a, a_llm, a_events = await opened(stack, store, config)
        b, b_llm, b_events = await opened(stack, store)
        sid = await a.start_session("explore the house", repo=REPO)
        held = b_llm.hold("semantic")
        await b.append(sid, "walk north", "go north")
        await b.append(sid, "open door", "push door")  # a boundary: B commits step 0
        with anyio.fail_after(10):
            await held.started.wait()
            flushed = await a_events.wait_for(lambda e: e.kind == "trajectory_committed")
        assert flushed.data["step_indices"] == [1]
        before = await version(a, sid)
        await anyio.sleep(1.2)  # two of A's flush timeouts, B's claim held
        assert await version(a, sid) == before
        held.release()
        with anyio.fail_after(10):
            committed = await b_events.wait_for(lambda e: e.kind == "trajectory_committed")
        assert committed.data["step_indices"] == [0]
        await anyio.sleep(1.2)  # two more, the step committed
        assert await version(a, sid) == before
        assert extracted_observations(a_llm) == ["open door"]
        assert extracted_observations(b_llm) == ["walk north"]
        assert await in_the_graph(a) == ["open door", "walk north"]
        assert await claims_left(a) == []


async def test_the_claims_of_a_holder_that_left_are_taken_at_once(store: str) -> None:
    """A holder not seen for a lease (a process killed in its commit) claimed the first step:
    B's boundary takes it over at once and commits it, then B's close commits the rest."""
    async with AsyncExitStack() as stack:
        b, b_llm, b_events = await opened(stack, store, AUTO)
        sid = await b.start_session("explore the house", repo=REPO)
        await b.append(sid, "walk north", "go north")
        await claimed_by_another(b, sid, "killed",
                                 seen=datetime.now(UTC) - timedelta(minutes=5))
        await b.append(sid, "open door", "push door")  # a boundary: B commits step 0
        with anyio.fail_after(10):
            committed = await b_events.wait_for(lambda e: e.kind == "trajectory_committed")
        assert committed.data["step_indices"] == [0]
        await b.close(sid)
        with anyio.fail_after(10):
            assert await b_events.wait_state(b, sid, mnemo.State.IDLE) is mnemo.State.IDLE
        assert extracted_observations(b_llm) == ["walk north", "open door"]
        assert await in_the_graph(b) == ["open door", "walk north"]
        assert await claims_left(b) == []


async def test_a_close_extracts_what_a_live_claimer_gives_up(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live holder claimed the first step: B's boundary leaves it, and B's close waits.
    When the holder gives its claim up (its commit failed), the close claims it and extracts
    every step, each task asked once a trajectory, and ends idle."""
    waiting = waiting_for_claims(monkeypatch)
    async with AsyncExitStack() as stack:
        b, b_llm, b_events = await opened(stack, store, AUTO)
        sid = await b.start_session("explore the house", repo=REPO)
        await b.append(sid, "walk north", "go north")
        step = await claimed_by_another(b, sid, "failing", seen=datetime.now(UTC))
        await b.append(sid, "open door", "push door")  # a boundary: left to "failing"
        await b.close(sid)
        with anyio.fail_after(10):
            await waiting.wait()
        assert await b.session_state(sid) is mnemo.State.EXTRACTING
        asked_before = b_llm.tasks()
        await backend_of(b).coordination.release_steps(sid, "failing", [step])
        with anyio.fail_after(10):
            landed = await b_events.wait_state(b, sid, mnemo.State.IDLE, mnemo.State.FAILED)
        assert landed is mnemo.State.IDLE
        assert "semantic" not in asked_before
        assert extracted_observations(b_llm) == ["walk north", "open door"]
        extraction = [t for t in b_llm.tasks() if t in ("semantic", "procedural")]
        assert sorted(extraction) == ["procedural"] * 2 + ["semantic"] * 2
        assert await in_the_graph(b) == ["open door", "walk north"]
        assert not [e for e in b_events.events if e.kind == "trajectory_committed"]
        assert await claims_left(b) == []


@pytest.mark.slow
async def test_a_close_waits_for_a_claim_no_longer_than_an_extractions_time_limit(
    store: str,
) -> None:
    """A live holder claimed the first step and never lets it go (hung): B's close, with a
    0.5 s extraction time limit, waits that long, then extracts the step itself and ends idle
    rather than wedged."""
    async with AsyncExitStack() as stack:
        config = mnemo.Config(auto_commit=True, flush_timeout=None, session_timeout=None,
                              extraction_timeout=0.5)
        b, b_llm, b_events = await opened(stack, store, config)
        sid = await b.start_session("explore the house", repo=REPO)
        await b.append(sid, "walk north", "go north")
        await claimed_by_another(b, sid, "hung", seen=datetime.now(UTC))
        await b.append(sid, "open door", "push door")
        await b.close(sid)
        with anyio.fail_after(10):
            landed = await b_events.wait_state(b, sid, mnemo.State.IDLE, mnemo.State.FAILED,
                                               within=10)
        assert landed is mnemo.State.IDLE
        assert extracted_observations(b_llm) == ["walk north", "open door"]
        assert await in_the_graph(b) == ["open door", "walk north"]


async def test_a_close_waiting_for_claims_stops_when_the_session_ends_elsewhere(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close waits for a live holder's claim; the session is ended through another Memory
    (its end drops every claim). The close asks the model nothing and leaves no claim: it
    must not claim every step of the ended session, ask the model about them, or
    on PostgreSQL leave a claim row for good."""
    waiting = waiting_for_claims(monkeypatch)
    async with AsyncExitStack() as stack:
        b, b_llm, _ = await opened(stack, store, AUTO)
        c, _, _ = await opened(stack, store)
        sid = await b.start_session("explore the house", repo=REPO)
        await b.append(sid, "walk north", "go north")
        await claimed_by_another(b, sid, "other", seen=datetime.now(UTC))
        await b.append(sid, "open door", "push door")
        await b.close(sid)
        with anyio.fail_after(10):
            await waiting.wait()
        record = b._live.by_id[sid]
        await c.end_session(sid)
        with anyio.fail_after(10):
            while not record.ended:  # the close's end: its record dropped
                await record.changed.wait()
        assert extracted_observations(b_llm) == []
        assert await claims_left(b) == []


async def test_a_store_that_refuses_claims_fails_no_commit(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every claim is refused (the store busy for longer than `busy_timeout`): a boundary's
    commit and the close extract and commit as they did before claims, and the session ends
    idle with each step once. A claim only saves work, so its refusal fails nothing: before,
    the boundary's commit failed, and so did the close."""
    async with AsyncExitStack() as stack:
        b, b_llm, b_events = await opened(stack, store, AUTO)

        async def busy(*args: Any, **kwargs: Any) -> set[str]:
            raise mnemo.StorageError("busy", "another writer holds the store")

        monkeypatch.setattr(backend_of(b).coordination, "claim_steps", busy)
        sid = await b.start_session("explore the house", repo=REPO)
        await b.append(sid, "walk north", "go north")
        await b.append(sid, "open door", "push door")  # a boundary: step 0 commits
        with anyio.fail_after(10):
            committed = await b_events.wait_for(lambda e: e.kind == "trajectory_committed")
        assert committed.data["step_indices"] == [0]
        await b.close(sid)
        with anyio.fail_after(10):
            landed = await b_events.wait_state(b, sid, mnemo.State.IDLE, mnemo.State.FAILED)
        assert landed is mnemo.State.IDLE
        assert extracted_observations(b_llm) == ["walk north", "open door"]
        assert await in_the_graph(b) == ["open door", "walk north"]


async def test_a_flush_whose_steps_are_read_again_while_it_claims_them_still_commits(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's steps are read again from the store (new records, equal to the old
    ones) while the driver's flush claims them, as a reload for another Memory's write does:
    the flush still extracts and commits them. It picked its steps by comparing records,
    whose vectors made the comparison raise (a final read of the change)."""
    config = mnemo.Config(auto_commit=True, flush_timeout=0.2, session_timeout=None)
    claim = registry.claim

    async def read_again(live: Any, session: Any, steps: Any) -> Any:
        mine = await claim(live, session, steps)
        if session.episode is not None:
            session.episode.steps = [
                dataclasses.replace(s, subgoal_vec=s.subgoal_vec.copy())
                for s in session.episode.steps
            ]
        return mine

    async with AsyncExitStack() as stack:
        a, a_llm, a_events = await opened(stack, store, config)
        sid = await a.start_session("explore the house", repo=REPO)
        monkeypatch.setattr(registry, "claim", read_again)
        await a.append(sid, "walk north", "go north")
        with anyio.fail_after(10):
            flushed = await a_events.wait_for(lambda e: e.kind == "trajectory_committed")
        assert flushed.data["step_indices"] == [0]
        assert extracted_observations(a_llm) == ["walk north"]
