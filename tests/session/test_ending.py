"""Ending a session (`end_session`, auto-commit's expiry) cancels its background work, never a
callback: an async `on_event` or operation callback, once called, runs to its end, and every
accepted operation still gets its one callback (the API contract, "The async operation queue")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel

import mnemo
from mnemo import State
from tests.conftest import REPO, Enter
from tests.fakes import EventLog, FakeEmbedder, FakeLLM
from tests.session.test_op_failures import Results as SyncResults

# Sessions that expire 50 ms after their last activity, with no flush.
EXPIRING = mnemo.Config(auto_commit=True, flush_timeout=None, session_timeout=0.05)


class AsyncEvents(EventLog):
    """An async `on_event`: it awaits before recording each event, and, for the events that
    `hold_on` matches, waits until `release` is set."""

    def __init__(self, hold_on: Callable[[mnemo.Event], bool] = lambda event: False) -> None:
        super().__init__()
        self.hold_on = hold_on
        self.held = anyio.Event()
        self.release = anyio.Event()

    async def __call__(self, event: mnemo.Event) -> None:  # type: ignore[override]
        await anyio.lowlevel.checkpoint()
        if self.hold_on(event):
            self.held.set()
            await self.release.wait()
        super().__call__(event)


class Results(SyncResults):
    """Async callbacks by label: each awaits before it records its result, and the one
    labelled `hold` first waits until `release` is set."""

    def __init__(self, hold: str | None = None) -> None:
        super().__init__()
        self.hold = hold
        self.held = anyio.Event()
        self.release = anyio.Event()

    def __call__(self, label: str) -> Callable[[mnemo.OpResult], Awaitable[None]]:
        record = super().__call__(label)

        async def held_then_recorded(result: mnemo.OpResult) -> None:
            await anyio.lowlevel.checkpoint()
            if label == self.hold:
                self.held.set()
                await self.release.wait()
            record(result)

        return held_then_recorded

    def reason(self, label: str) -> str | None:
        error = self.got[label].error
        return None if error is None else error.reason


async def test_an_async_on_event_hears_session_expired(llm: FakeLLM, store: str) -> None:
    """An expired session reports "session_expired" to an async `on_event` too (the expiry
    runs as one of the session's tasks, which ending the session cancelled: the event was
    lost at the callback's first await)."""
    events = AsyncEvents()
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO, config=EXPIRING)
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, "walk north", "go north")
        event = await events.wait_for(lambda e: e.kind == "session_expired")
        assert event.session_id == sid
        assert event.data["committed"] is True


async def test_an_op_queued_behind_a_callback_that_ends_the_session_is_called_back(
    mem: mnemo.Memory, enter: Enter, llm: FakeLLM
) -> None:
    """An append's async callback ends the session; the close queued behind it still gets
    session_ended (the callback's task was cancelled by the end it called, and the queued
    close's async callback with it)."""
    sid = await enter(State.COLLECTING)
    results = Results()
    held = llm.hold("subgoal")

    async def end_after_append(result: mnemo.OpResult) -> None:
        await results("append")(result)
        await mem.end_session(sid)

    await mem.append_async(sid, "walk north", "go north", callback=end_after_append)
    await mem.close_async(sid, callback=results("close"))
    with anyio.fail_after(5):
        await held.started.wait()
    held.release()
    await results.wait("append", "close")
    assert results.got["append"].value == "appended"
    assert results.reason("close") == "session_ended"


async def test_ending_a_session_during_a_callback_cuts_off_no_callback(
    mem: mnemo.Memory, enter: Enter, llm: FakeLLM
) -> None:
    """A failed extraction calls back its queued operations; the session ends while the first
    async callback is under way: that callback runs to its end, and the next still gets
    extraction_failed (the callbacks' task was cancelled: the first stopped at its await, the
    rest were already out of the queue and never called)."""
    sid = await enter(State.EXTRACTING)
    results = Results(hold="commit")
    await mem.commit_async(sid, callback=results("commit"))
    await mem.start_episode_async(sid, "next", callback=results("start"))
    llm.fail_tasks.add("semantic")
    llm.holds["semantic"].release()
    with anyio.fail_after(5):
        await results.held.wait()
    await mem.end_session(sid)
    results.release.set()
    await results.wait("commit", "start")
    assert results.reason("commit") == "extraction_failed"
    assert results.reason("start") == "extraction_failed"


async def test_an_async_on_event_under_way_when_the_session_ends_runs_to_its_end(
    llm: FakeLLM, store: str
) -> None:
    """The session ends while an async `on_event` is handling its move to ready: the callback
    is not cut off (it was cancelled with the extraction that reported the move)."""

    def to_ready(event: mnemo.Event) -> bool:
        return event.kind == "transition" and event.data["to"] == State.READY

    events = AsyncEvents(hold_on=to_ready)
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, "walk north", "go north")
        await mem.close(sid)
        with anyio.fail_after(5):
            await events.held.wait()
        await mem.end_session(sid)
        events.release.set()
        event = await events.wait_for(to_ready)
        assert event.session_id == sid
