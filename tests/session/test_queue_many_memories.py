"""The operation queue of a session one Memory extracts while others accept operations for it
(the API contract's queue rules): one queue, whichever Memory accepted an operation. Its bound
counts them all, each is projected from every one accepted before it, and they run in the
order they were accepted."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import anyio
import pytest

import mnemo
from mnemo import State
from tests.fakes import Callbacks
from tests.session.test_many_memories import Worker, extracting, fill, open_worker

OPS = [("commit", ()), ("start_episode", ("next goal",)), ("append", ("walk west", "go west")),
       ("close", ()), ("commit", ())]


async def submit(worker: Worker, sid: str, kind: str, args: tuple[str, ...],
                 callbacks: Callbacks, label: str) -> None:
    await getattr(worker.mem, f"{kind}_async")(sid, *args, callback=callbacks(label))


async def test_the_bound_counts_the_operations_every_memory_accepted(store: str) -> None:
    """Five operations accepted through B fill the queue of a session A extracts: a sixth is
    refused through either (ten were accepted, and B's, accepted first, ran last and all
    failed); the five run in order and each calls back where it was accepted."""
    async with AsyncExitStack() as stack:
        a, b = await open_worker(stack, store), await open_worker(stack, store)
        sid = await fill(a.mem)
        held = await extracting(a, sid)
        callbacks = Callbacks()
        for kind, args in OPS:
            await submit(b, sid, kind, args, callbacks, kind)
        for worker in (a, b):
            with pytest.raises(mnemo.SessionError) as refused:
                await submit(worker, sid, "commit", (), callbacks, "sixth")
            assert refused.value.reason == "pending_queue_full"
        held.release()
        results = await callbacks.wait(len(OPS), within=10)
        assert [(label, r.ok) for label, r in results] == [(kind, True) for kind, _ in OPS]
        assert await b.events.wait_state(b.mem, sid, State.IDLE) is State.IDLE
        assert [len(e.steps) for e in await a.mem.episodes(sid)] == [3, 1]


@pytest.mark.parametrize("first", ["holder", "other"])
async def test_each_operation_is_projected_from_every_one_accepted_before_it(
    store: str, first: str
) -> None:
    """A commit and a start_episode accepted through one Memory, then an append through the
    other, valid once they ran: accepted, and run after them (it was refused
    invalid_queued_operation, the other Memory's operations left out of its projection)."""
    async with AsyncExitStack() as stack:
        a, b = await open_worker(stack, store), await open_worker(stack, store)
        sid = await fill(a.mem)
        held = await extracting(a, sid)
        before, after = (a, b) if first == "holder" else (b, a)
        callbacks = Callbacks()
        for kind, args in OPS[:2]:
            await submit(before, sid, kind, args, callbacks, kind)
        await submit(after, sid, *OPS[2], callbacks, "append")
        with pytest.raises(mnemo.SessionError) as refused:  # idle no more once they ran
            await submit(after, sid, "start_episode", ("another goal",), callbacks, "refused")
        assert refused.value.reason == "invalid_queued_operation"
        held.release()
        results = await callbacks.wait(3, within=10)
        assert sorted((label, r.ok, r.value) for label, r in results) == [
            ("append", True, "appended"), ("commit", True, "committed"),
            ("start_episode", True, "started")]
        assert await a.mem.session_state(sid) is State.COLLECTING
        episodes = await a.mem.episodes(sid)
        assert [(e.goal, [s.observation for s in e.steps]) for e in episodes][1:] == [
            ("next goal", ["walk west"])]


async def test_a_call_cancelled_after_its_row_is_stored_is_still_called_back(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit_async through B whose caller is cancelled while B checks its stored row again:
    the row stays and runs where the work ends, and B calls it back (no watcher was started,
    so the commit ran and its callback never came)."""
    async with AsyncExitStack() as stack:
        a, b = await open_worker(stack, store), await open_worker(stack, store)
        sid = await fill(a.mem)
        held = await extracting(a, sid)
        coordination = b.mem._backend.coordination
        queued_ops, checking, go = coordination.queued_ops, anyio.Event(), anyio.Event()
        reads = 0

        async def a_held_second_read(session_id: str) -> Any:
            nonlocal reads
            reads += 1
            if reads == 2:  # the check after the insert
                checking.set()
                await go.wait()
            return await queued_ops(session_id)

        monkeypatch.setattr(coordination, "queued_ops", a_held_second_read)
        callbacks = Callbacks()
        async with anyio.create_task_group() as group:
            group.start_soon(b.mem.commit_async, sid, callbacks("commit"))
            with anyio.fail_after(5):
                await checking.wait()
            group.cancel_scope.cancel()
            go.set()
        held.release()
        results = await callbacks.wait(1, within=10)
        assert [(label, r.ok, r.value) for label, r in results] == [("commit", True, "committed")]
        assert await a.mem.session_state(sid) is State.IDLE
