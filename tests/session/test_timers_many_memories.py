"""Auto-commit's timers with several `Memory` objects on one store (the API contract,
"Configuration, auto-commit and durability" and "Storage backends and many processes"): a session's
inactivity is measured from its last activity as the store knows it, only the Memory that
drives a session flushes or expires it, a read never makes a Memory drive one, and a driver
that goes away leaves its timers to another Memory.

The timers are real, so these tests pace appends with short sleeps (the activity itself) and
bound every wait with `fail_after`.
"""

from __future__ import annotations

import sqlite3
from contextlib import AsyncExitStack, closing

import anyio
import psycopg
import pytest

import mnemo
from mnemo.session import timers
from tests.fakes import EventLog, FakeEmbedder, FakeLLM, extracted_observations, js

REPO = "r"


async def opened(
    stack: AsyncExitStack, store: str, config: mnemo.Config | None = None,
    *, lease_timeout: float = 30.0,
) -> tuple[mnemo.Memory, FakeLLM, EventLog]:
    """A Memory on `store` with its own fakes and repo "r" (with `config` when given)."""
    llm, events = FakeLLM(), EventLog()
    mem = await stack.enter_async_context(
        mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events,
                     config=mnemo.Config(lease_timeout=lease_timeout))
    )
    await mem.open_repo(REPO, config=config)
    return mem, llm, events


@pytest.mark.slow
async def test_appends_through_one_memory_keep_the_session_alive_in_the_others(
    store: str,
) -> None:
    """A session appended to through A every 0.15 s, longer than its 1 s timeout, is not
    expired by B (opened before, read once) nor C (opened after, restoring it); once idle it
    expires once, through A, which drives it."""
    config = mnemo.Config(auto_commit=True, flush_timeout=None, session_timeout=1.0)
    async with AsyncExitStack() as stack:
        a, _, a_events = await opened(stack, store, config)
        b, _, b_events = await opened(stack, store)
        sid = await a.start_session("explore the house", repo=REPO)
        assert await b.session_state(sid) is mnemo.State.COLLECTING
        _, _, c_events = await opened(stack, store)
        with anyio.fail_after(10):
            for i in range(12):
                await a.append(sid, f"walk {i}", f"go {i}")
                await anyio.sleep(0.15)
        assert await a.session_state(sid) is mnemo.State.COLLECTING
        expired = await a_events.wait_for(lambda e: e.kind == "session_expired")
        assert expired.session_id == sid
        for events in (b_events, c_events):
            assert not [e for e in events.events if e.kind == "session_expired"]
            assert not [e for e in events.events if e.kind == "trajectory_committed"]


@pytest.mark.slow
async def test_an_idle_trajectory_is_flushed_once_whoever_reads_it(store: str) -> None:
    """With flush_timeout 0.2 s, a step appended through A is extracted and committed once,
    by A, though B (opened after, restoring the session) and C (reading it) know it."""
    config = mnemo.Config(auto_commit=True, flush_timeout=0.2, session_timeout=None)
    async with AsyncExitStack() as stack:
        a, a_llm, a_events = await opened(stack, store, config)
        sid = await a.start_session("explore the house", repo=REPO)
        await a.append(sid, "walk north", "go north")
        b, b_llm, b_events = await opened(stack, store)
        c, c_llm, c_events = await opened(stack, store)
        assert await c.session_state(sid) is mnemo.State.COLLECTING
        committed = await a_events.wait_for(lambda e: e.kind == "trajectory_committed")
        assert committed.data["step_indices"] == [0]
        # Long enough for every other Memory's flush clock (started when it learnt of the
        # session, at most 0.2 s after A's) to run out twice over.
        await anyio.sleep(0.8)
        assert extracted_observations(a_llm) == ["walk north"]
        assert extracted_observations(b_llm) == extracted_observations(c_llm) == []
        for events in (b_events, c_events):
            assert not [e for e in events.events if e.kind == "trajectory_committed"]
        nodes = await b.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
        assert sorted(js(n.data)["index"] for n in nodes) == [0]


@pytest.mark.slow
async def test_appends_through_another_memory_postpone_the_drivers_flush(store: str) -> None:
    """A drives the session; steps appended through B every 0.1 s (flush_timeout 1 s) are
    not flushed while B keeps appending, then all of them once."""
    # The margin is wide: an append that took 0.2 s more on a busy machine was a flush.
    config = mnemo.Config(auto_commit=True, flush_timeout=1.0, session_timeout=None,
                          trajectory_threshold=0.0)
    async with AsyncExitStack() as stack:
        a, a_llm, a_events = await opened(stack, store, config)
        b, b_llm, _ = await opened(stack, store)
        sid = await a.start_session("explore the house", repo=REPO)
        with anyio.fail_after(10):
            for i in range(8):
                await b.append(sid, f"walk {i}", f"go {i}")
                await anyio.sleep(0.1)
        assert not [e for e in a_events.events if e.kind == "trajectory_committed"]
        committed = await a_events.wait_for(lambda e: e.kind == "trajectory_committed")
        assert committed.data["step_indices"] == list(range(8))
        asked = extracted_observations(a_llm) + extracted_observations(b_llm)
        assert sorted(asked) == sorted(f"walk {i}" for i in range(8))


@pytest.mark.slow
async def test_a_closed_drivers_timers_are_taken_over(store: str) -> None:
    """When the Memory driving an auto-commit session closes, another takes its timers over
    within the lease and expires the session, committing its step once."""
    config = mnemo.Config(auto_commit=True, flush_timeout=None, session_timeout=0.3)
    async with AsyncExitStack() as stack:
        b, b_llm, b_events = await opened(stack, store, lease_timeout=1.0)
        async with AsyncExitStack() as first:
            a, a_llm, _ = await opened(first, store, config, lease_timeout=1.0)
            sid = await a.start_session("explore the house", repo=REPO)
            await a.append(sid, "walk north", "go north")
        expired = await b_events.wait_for(lambda e: e.kind == "session_expired")
        assert expired.session_id == sid
        assert extracted_observations(a_llm) + extracted_observations(b_llm) == ["walk north"]
        nodes = await b.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
        assert [n.data["index"] for n in nodes] == [0]


async def test_a_close_after_another_memorys_background_commit_commits_the_rest(
    store: str,
) -> None:
    """A's boundary commits the first trajectory in the background; B, which read the session
    before, closes it: B extracts only what is left and the session ends idle with each step
    in the graph once. B's record still held the first step uncommitted (a background commit
    moves no version): it extracted it again, the store refused the second commit of it, and
    the close ended `failed` at every retry."""
    config = mnemo.Config(auto_commit=True, flush_timeout=None, session_timeout=None)
    async with AsyncExitStack() as stack:
        a, a_llm, a_events = await opened(stack, store, config)
        b, b_llm, b_events = await opened(stack, store)
        sid = await a.start_session("explore the house", repo=REPO)
        await a.append(sid, "walk north", "go north")
        held = a_llm.hold("semantic")
        await a.append(sid, "open door", "push door")  # a boundary: step 0 commits
        with anyio.fail_after(10):
            await held.started.wait()
        # B reads the session while the commit runs: its record has step 0 uncommitted.
        assert await b.session_state(sid) is mnemo.State.COLLECTING
        held.release()
        with anyio.fail_after(10):
            await a_events.wait_for(lambda e: e.kind == "trajectory_committed")
        await b.close(sid)
        with anyio.fail_after(10):
            landed = await b_events.wait_state(b, sid, mnemo.State.IDLE, mnemo.State.FAILED)
        assert landed is mnemo.State.IDLE
        assert extracted_observations(b_llm) == ["open door"]
        steps = await b.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
        assert sorted(n.text.split(" -> ")[0] for n in steps) == ["open door", "walk north"]


async def test_an_idle_driver_flushes_an_episode_begun_through_another_memory(
    store: str,
) -> None:
    """A drives a session it left idle; B starts an episode and appends a step: A flushes it
    after flush_timeout. A looked at the store only for a session it saw collecting, so the
    step waited for a close or an expiry (forever without a session_timeout)."""
    config = mnemo.Config(auto_commit=True, flush_timeout=0.3, session_timeout=None)
    async with AsyncExitStack() as stack:
        a, _, a_events = await opened(stack, store, config)
        b, _, _ = await opened(stack, store)
        sid = await a.start_session("explore the house", repo=REPO)
        await a.close(sid)
        with anyio.fail_after(10):
            await a_events.wait_state(a, sid, mnemo.State.IDLE)
        await b.start_episode(sid, "explore the garden")
        await b.append(sid, "walk north", "go north")
        with anyio.fail_after(10):
            committed = await a_events.wait_for(lambda e: e.kind == "trajectory_committed")
        assert committed.data["step_indices"] == [0]


def _forget_activity(store: str) -> None:
    """Clears every session's stored last use, as rows written before `active_at` were."""
    if store.startswith("postgresql"):
        with psycopg.connect(store, autocommit=True) as pg:
            pg.execute("UPDATE sessions SET active_at = NULL")
        return
    with closing(sqlite3.connect(store)) as db, db:
        db.execute("UPDATE sessions SET active_at = NULL")


async def test_a_session_without_a_stored_use_is_idle_from_when_it_is_read(store: str) -> None:
    """A session whose row holds no time of last use is idle from when a Memory reads it, not
    from the loop clock's zero: it expired the moment it was restored."""
    config = mnemo.Config(auto_commit=True, flush_timeout=None, session_timeout=600.0)
    async with AsyncExitStack() as stack:
        a, _, _ = await opened(stack, store, config)
        sid = await a.start_session("explore the house", repo=REPO)
    _forget_activity(store)
    async with AsyncExitStack() as stack:
        before = anyio.current_time()
        b, _, _ = await opened(stack, store)  # restores the session
        assert await b.session_state(sid) is mnemo.State.COLLECTING
        record = b._live.by_id[sid]
        assert record.last_activity >= before


async def test_a_reader_takes_over_no_session_without_timers(store: str) -> None:
    """A Memory that takes over the sessions of one that closed leaves alone an auto-commit
    session with neither flush nor expiry (and nothing committing): there is nothing to
    drive, and a Memory that only reads wrote a new holder and version into every such
    session at each open (200 sessions, 200 claims an open)."""
    config = mnemo.Config(auto_commit=True, flush_timeout=None, session_timeout=None)
    async with AsyncExitStack() as stack:
        a, _, _ = await opened(stack, store, config)
        sid = await a.start_session("explore the house", repo=REPO)
        await a.append(sid, "walk north", "go north")
    async with AsyncExitStack() as stack:
        b, _, _ = await opened(stack, store)
        coordination = b._live.coordination
        before = await coordination.lease(sid)
        await timers.take_over(b._live)  # the takeover task's look, at once
        after = await coordination.lease(sid)
        assert before is not None
        assert after is not None
        assert (after.version, after.holder) == (before.version, before.holder)
