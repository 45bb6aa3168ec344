"""Operations a Memory queues behind a session's work are stored before the call returns, and
forgotten as each runs or is answered: if the Memory dies first, the Memory that takes its work
over runs them (the killed process's case is `test_processes`)."""

from __future__ import annotations

import uuid

import anyio
import pytest

import mnemo
from mnemo import State
from mnemo.session import timers
from mnemo.session.ports import StoredOp
from mnemo.session.registry import Sessions
from tests.backends import sql
from tests.fakes import Callbacks
from tests.session.test_many_memories import (
    REPO,
    extracting,
    fill,
    held_after_its_row,
    outcome_of,
    ready,
    workers,
)


async def test_operations_queued_behind_the_work_are_stored_until_they_run(store: str) -> None:
    """While A's extraction is held, the commit, new episode and append queued behind it each
    have their row; once they ran, none is left."""
    async with workers(store, 1) as [a]:
        sid = await fill(a.mem)
        held = await extracting(a, sid)
        callbacks = Callbacks()
        await a.mem.commit_async(sid, callbacks("commit"))
        await a.mem.start_episode_async(sid, "walk back", callbacks("start"))
        await a.mem.append_async(sid, "walk west", "go west", callbacks("append"))
        queued = await sql(a.mem, "SELECT kind, accepted_by, taken_by FROM ops ORDER BY created_at")
        holder = a.mem._live.holder_id
        assert queued == [(kind, holder, holder) for kind in ("commit", "start_episode",
                                                              "append")]
        held.release()
        assert [(label, r.ok) for label, r in await callbacks.wait(3)] == [
            ("commit", True), ("start", True), ("append", True)]
        assert await sql(a.mem, "SELECT id FROM ops") == []


async def test_operations_answered_unrun_leave_no_rows(store: str) -> None:
    """A commit queued behind an extraction that fails is answered extraction_failed, and
    its row goes with it."""
    async with workers(store, 1) as [a]:
        sid = await fill(a.mem)
        held = await extracting(a, sid)
        a.llm.fail_tasks.add("semantic")
        callbacks = Callbacks()
        await a.mem.commit_async(sid, callbacks("commit"))
        assert len(await sql(a.mem, "SELECT id FROM ops")) == 1
        held.release()
        [(_, result)] = await callbacks.wait(1)
        assert result.error is not None
        assert result.error.reason == "extraction_failed"
        assert await sql(a.mem, "SELECT id FROM ops") == []


async def queue_as(live: Sessions, sid: str, holder_id: str, kind: str) -> None:
    """A row `holder_id` queued for itself, as `operations._queue` writes it."""
    co = live.coordination
    await co.queue_op(StoredOp(f"op_{uuid.uuid4().hex}", sid, kind, [], holder_id, co.now()),
                      own=True)


async def test_what_a_gone_holder_queued_after_its_work_ended_runs_in_another(
    store: str,
) -> None:
    """A holder that died between the end of its extraction and its queue left a commit
    queued: B's look for work runs it, once. A live holder's queue is left alone."""
    async with workers(store, 2) as (a, b):
        sid = await fill(a.mem)
        await ready(a, sid)
        live = b.mem._live
        await queue_as(live, sid, a.mem._live.holder_id, "commit")
        await timers.take_over(live)
        assert await b.mem.session_state(sid) is State.READY
        assert len(await sql(b.mem, "SELECT id FROM ops")) == 1
        await sql(b.mem, "DELETE FROM ops")
        await queue_as(live, sid, "gone-holder", "commit")
        await timers.take_over(live)
        assert await b.events.wait_state(b.mem, sid, State.IDLE) is State.IDLE
        assert len([c for c in await b.mem.history(REPO) if c.session_id == sid]) == 1
        # Taken by B (its result kept for the holder that accepted it, until forgotten).
        assert await sql(b.mem, "SELECT taken_by FROM ops") == [(live.holder_id,)]


async def test_a_call_queued_while_its_session_ends_is_refused_and_leaves_no_row(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit queued behind A's extraction whose row is written as the session ends through
    A is refused (NotFoundError, never called back): the end answered the queue before it."""
    async with workers(store, 1) as [a]:
        sid = await fill(a.mem)
        held = await extracting(a, sid)
        written, go = held_after_its_row(monkeypatch, a.mem)
        callbacks = Callbacks()
        outcome: list[BaseException | None] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(outcome_of, outcome, lambda: a.mem.commit_async(sid, callbacks("c")))
            with anyio.fail_after(5):
                await written.wait()
            await a.mem.end_session(sid)
            go.set()
        held.release()
        [refused] = outcome
        assert isinstance(refused, mnemo.NotFoundError)
        assert callbacks.results == []
        assert await sql(a.mem, "SELECT id FROM ops") == []
