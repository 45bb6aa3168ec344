"""Idle sessions do not pile up: a session idle between episodes and unchanged for its config's
`idle_session_timeout` ends by itself, in the Memory that holds it or in any working Memory
that opens the store after the process that left it went away; reads never end one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import pytest

import mnemo
from mnemo import State
from mnemo.session import timers
from mnemo.session.ports import IdleSweep
from tests.backends import open_stores, sql
from tests.conftest import REPO
from tests.fakes import EventLog, FakeEmbedder, FakeLLM


async def left_idle(store: str, goals: list[str]) -> list[str]:
    """Sessions a Memory (since closed) committed and left idle, one per goal, their last
    change set back two hours: due under the default timeout of an hour."""
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        sids = []
        for goal in goals:
            sid = await mem.start_session(goal, repo=REPO)
            await mem.append(sid, "walk north", "go north")
            await mem.close_and_commit(sid)
            sids.append(sid)
        long_ago = (datetime.now(UTC) - timedelta(hours=2)).isoformat()
        await sql(mem, "UPDATE sessions SET updated_at = ?", long_ago)
    return sids


def expired(events: EventLog) -> list[str]:
    return [str(e.session_id) for e in events.events if e.kind == "session_expired"]


async def test_an_idle_session_ends_after_its_timeout(store: str, events: EventLog) -> None:
    """A committed session, idle, ends once its `idle_session_timeout` has passed: reported
    "session_expired", unknown after, its nodes kept; a session collecting since before is
    left alone (only idle ones end)."""
    config = mnemo.Config(idle_session_timeout=0.2)
    async with mnemo.Memory(
        store, llm=FakeLLM(), embedder=FakeEmbedder(), config=config, on_event=events
    ) as mem:
        await mem.open_repo(REPO)
        working = await mem.start_session("still at work", repo=REPO)
        await mem.append(working, "walk south", "go south")
        sid = await mem.start_session("explore the house", repo=REPO)
        await mem.append(sid, "walk north", "go north")
        receipt = await mem.close_and_commit(sid)
        assert await mem.session_state(sid) is State.IDLE
        event = await events.wait_for(
            lambda e: e.kind == "session_expired" and e.session_id == sid
        )
        assert (event.repo, event.data["state"], event.data["committed"]) == (
            REPO, State.IDLE, False)
        with pytest.raises(mnemo.NotFoundError):
            await mem.session_state(sid)
        assert [s.id for s in await mem.list_sessions()] == [working]
        assert await mem.session_state(working) is State.COLLECTING
        assert await mem.get_node(REPO, receipt.node_ids[0]) is not None
        assert expired(events) == [sid]


async def test_the_next_memory_that_opens_the_store_ends_what_was_left_idle(
    store: str, events: EventLog
) -> None:
    """A session a closed Memory left idle past its timeout is still listed (with its last
    goal) by an inspecting Memory, which never ends it, and is ended by the next working
    Memory before its open returns."""
    [sid] = await left_idle(store, ["explore the house"])
    async with mnemo.Memory(store, embedder=FakeEmbedder(), inspect=True) as looking:
        [info] = await looking.list_sessions()
        assert (info.id, info.state, info.goal, info.steps) == (
            sid, State.IDLE, "explore the house", 0)
        assert await looking.session_state(sid) is State.IDLE
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder(),
                            on_event=events) as mem:
        assert expired(events) == [sid]
        assert await mem.list_sessions() == []
        with pytest.raises(mnemo.NotFoundError):
            await mem.start_episode(sid, "explore the garden")


async def test_a_memory_holding_an_idle_session_finds_it_ended_elsewhere(store: str) -> None:
    """The Memory that holds an idle session sees it unknown once another Memory's sweep
    ended it: starting an episode raises NotFoundError, not a stale success."""
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as holder:
        await holder.open_repo(REPO)
        sid = await holder.start_session("explore the house", repo=REPO)
        await holder.close_and_commit(sid)
        long_ago = (datetime.now(UTC) - timedelta(hours=2)).isoformat()
        await sql(holder, "UPDATE sessions SET updated_at = ?", long_ago)
        async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()):
            pass
        with pytest.raises(mnemo.NotFoundError):
            await holder.start_episode(sid, "explore the garden")
        assert await holder.list_sessions() == []


async def test_memories_opening_at_once_end_each_session_once(store: str) -> None:
    """Three working Memories opened together on a store with sessions left idle: each
    session is ended once, by one of them."""
    sids = await left_idle(store, ["one", "two"])
    logs = [EventLog() for _ in range(3)]

    async def open_one(log: EventLog) -> None:
        async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder(), on_event=log):
            pass

    async with anyio.create_task_group() as tg:
        for log in logs:
            tg.start_soon(open_one, log)
    assert sorted(sid for log in logs for sid in expired(log)) == sorted(sids)


async def test_a_sweep_is_bounded_and_the_rest_follow(
    store: str, events: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One sweep ends at most its limit of sessions, the most overdue first, and says more
    are due; a Memory's sweeps end the rest without being asked."""
    sids = await left_idle(store, ["one", "two", "three", "four"])
    async with open_stores(store, FakeEmbedder().dim) as backend:
        first = await backend.coordination.end_idle(2)
        assert len(first.ended) == 2
        assert first.next_due == 0.0
    rest = sorted(set(sids) - {sid for sid, _ in first.ended})
    monkeypatch.setattr(timers, "SWEEP_LIMIT", 1)
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder(), on_event=events):
        await events.wait_for(lambda e: len(expired(events)) == len(rest))
    assert sorted(expired(events)) == rest
    async with open_stores(store, FakeEmbedder().dim) as backend:
        assert await backend.coordination.end_idle(2) == IdleSweep([], None)
