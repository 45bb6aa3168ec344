"""Operations stored for a session that another `Memory` took and then left without a result
(the API contract, "The async operation queue": every accepted operation gets exactly one callback).

A Memory that accepts an async operation while another holds the session's work stores it;
whoever ends that work takes it and records its result, and the accepting Memory calls back.
When the taker is killed, or closes or loses the store before it records the result, nobody
else would: the accepting Memory's takeover task answers it as failed (whether it took effect is
unknown, so it is not run again). Before, its callback never came.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import anyio
import msgspec
import pytest

import mnemo
from mnemo import State
from mnemo.session import timers
from mnemo.session.ports import HolderInfo, StoredOp, StoredResult
from tests.backends import sql
from tests.fakes import Hold
from tests.session.test_many_memories import Called, Worker, extracting, fill, open_worker

COMMITTED = StoredResult(True, "committed")


def holder(holder_id: str, seen_ago: timedelta) -> HolderInfo:
    seen = datetime.now(UTC) - seen_ago
    return HolderInfo(holder_id, "elsewhere", 1, seen, seen)


@dataclass
class Stored:
    """A session A filled and B closed, B's extraction held at its semantic task, and what A
    accepted meanwhile (stored for whoever ends B's work): a commit, then a start_episode."""

    a: Worker
    b: Worker
    sid: str
    held: Hold
    commit: Called = field(default_factory=Called)
    start: Called = field(default_factory=Called)


@asynccontextmanager
async def stored_while_b_extracts(store: str, *, start: bool = False) -> AsyncIterator[Stored]:
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        sid = await fill(a.mem)
        b = await open_worker(stack, store)
        it = Stored(a, b, sid, await extracting(b, sid))
        await a.mem.commit_async(sid, it.commit)
        if start:
            await a.mem.start_episode_async(sid, "next", it.start)
        try:
            yield it
        finally:
            it.held.release()


@pytest.mark.parametrize("taker", ["retired", "unseen"])
async def test_operations_taken_by_a_memory_that_left_are_called_back_as_failed(
    store: str, taker: str
) -> None:
    """A's commit and start_episode, stored while B extracts, are taken by a Memory that then
    left (retired: no holder row; unseen: not seen for a day). A's takeover task answers each
    operation_failed, once, its cause saying the taker left; the rows are gone, and neither
    ran (B's extraction ends ready, nothing committed)."""
    async with stored_while_b_extracts(store, start=True) as it:
        a, b, sid, commit, start = it.a, it.b, it.sid, it.commit, it.start
        coordination = a.mem._backend.coordination
        if taker == "unseen":
            await coordination.register(holder("holder_left", timedelta(days=1)))
        assert len(await coordination.take_ops(sid, "holder_left")) == 2
        await timers.take_over(a.mem._live)
        with anyio.fail_after(5):
            await commit.done.wait()
            await start.done.wait()
        for called in (commit, start):
            [failed] = called.results
            assert failed.error is not None
            assert failed.error.reason == "operation_failed"
            assert isinstance(failed.error.__cause__, mnemo.MnemoError)
            assert "left before it recorded a result" in str(failed.error.__cause__)
        assert await sql(a.mem, "SELECT id FROM ops") == []
        it.held.release()
        landed = await b.events.wait_state(b.mem, sid, State.READY, State.FAILED)
        assert landed is State.READY
        assert (len(commit.results), len(start.results)) == (1, 1)


async def test_a_late_taker_runs_none_of_what_was_answered_for_it(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B, alive but late with its heartbeat, takes A's commit and start_episode when its
    extraction ends; while B stores the commit's result, A takes B for gone and answers both
    operation_failed. B then does not run the start (A's caller heard it failed); before,
    it ran it."""
    async with stored_while_b_extracts(store, start=True) as it:
        a, b, sid, commit, start = it.a, it.b, it.sid, it.commit, it.start
        runner = b.mem._backend.coordination
        finish_op = runner.finish_op
        reported: list[StoredResult] = []

        async def took_nothing(session_id: str, holder_id: str) -> list[StoredOp]:
            return []

        # A's watcher leaves the taking to B (it may look between B's end of extraction
        # and B's take, and take its own operations first).
        monkeypatch.setattr(a.mem._backend.coordination, "take_ops", took_nothing)
        storing, go, second = anyio.Event(), anyio.Event(), anyio.Event()

        async def held_once(op_id: str, result: StoredResult) -> None:
            reported.append(result)
            if len(reported) == 1:
                storing.set()
                await go.wait()
            else:
                second.set()
            await finish_op(op_id, result)

        monkeypatch.setattr(runner, "finish_op", held_once)
        it.held.release()
        with anyio.fail_after(5):
            await storing.wait()  # the commit ran; its result is on its way
        a_live = a.mem._live
        # B's heartbeat is a day late as A sees it.
        await timers.answer_abandoned(a_live, datetime.now(UTC) + timedelta(days=1), [])
        with anyio.fail_after(5):
            await commit.done.wait()
            await start.done.wait()
        assert [c.results[0].error.reason for c in (commit, start)  # type: ignore[union-attr]
                ] == ["operation_failed", "operation_failed"]
        go.set()
        with anyio.fail_after(5):
            await second.wait()
        assert reported[0].value == "committed"
        assert (reported[1].ok, reported[1].error) == (False, "operation_failed")
        assert await b.mem.session_state(sid) is State.IDLE  # committed, never started
        assert await sql(a.mem, "SELECT id FROM ops") == []
        assert (len(commit.results), len(start.results)) == (1, 1)


async def test_operations_a_live_memory_took_are_left_to_it(store: str) -> None:
    """Taken by a Memory seen a moment ago, the operations are its to finish: A's takeover task
    neither calls back nor drops them, and the result it records reaches A's callback."""
    async with stored_while_b_extracts(store) as it:
        a, sid, commit = it.a, it.sid, it.commit
        # The runner writes through B's connection: on SQLite a Memory's watcher sees only
        # other connections' writes, as another process's would be.
        runner = it.b.mem._backend.coordination
        await runner.register(holder("holder_alive", timedelta(0)))
        [taken] = await runner.take_ops(sid, "holder_alive")
        await timers.take_over(a.mem._live)
        assert commit.results == []
        assert [row[0] for row in await sql(a.mem, "SELECT id FROM ops")] == [taken.id]
        await runner.finish_op(taken.id, COMMITTED)
        with anyio.fail_after(5):
            await commit.done.wait()
        assert commit.results == [mnemo.OpResult(ok=True, value="committed", error=None)]


async def test_a_result_recorded_before_its_taker_left_is_delivered_as_it_is(
    store: str,
) -> None:
    """The taker recorded the commit's result, then retired: the result is the answer, not
    a failure (only operations left without a result are answered as failed)."""
    async with stored_while_b_extracts(store) as it:
        runner = it.b.mem._backend.coordination
        await runner.register(holder("holder_left", timedelta(0)))
        [taken] = await runner.take_ops(it.sid, "holder_left")
        await runner.finish_op(taken.id, COMMITTED)
        await runner.retire("holder_left", datetime.now(UTC))
        await timers.take_over(it.a.mem._live)
        with anyio.fail_after(5):
            await it.commit.done.wait()
        assert it.commit.results == [mnemo.OpResult(ok=True, value="committed", error=None)]


async def test_an_operation_of_a_closed_memory_left_by_its_taker_is_forgotten(
    store: str,
) -> None:
    """A commit A stored while B extracts; A closes (nobody waits for it now), and a holder
    took it without a result. While that holder is only late (unseen for more than a lease,
    less than `ORPHAN_GRACE`) B's takeover task leaves the row to it; once it is gone for good,
    the takeover task forgets the row: nobody would take it again or read it. Before, it stayed
    in the store for good."""
    async with stored_while_b_extracts(store) as it:
        await it.a.mem.aclose()
        co = it.b.mem._backend.coordination
        [(accepted_by,)] = await sql(it.b.mem, "SELECT accepted_by FROM ops")
        assert accepted_by == ""  # left to whoever runs the work
        await co.register(holder("taker", seen_ago=timedelta(minutes=10)))
        assert [op.kind for op in await co.take_ops(it.sid, "taker")] == ["commit"]
        await timers.take_over(it.b.mem._live)  # the takeover task's look, at once
        assert len(await sql(it.b.mem, "SELECT id FROM ops")) == 1  # late, not gone
        await co.register(holder("taker", seen_ago=timers.ORPHAN_GRACE * 2))
        await timers.take_over(it.b.mem._live)
        assert await sql(it.b.mem, "SELECT id FROM ops") == []
        it.held.release()  # B's extraction ends with nothing stored left to run
        assert await it.b.events.wait_state(it.b.mem, it.sid, State.READY) is State.READY
        assert await sql(it.b.mem, "SELECT id FROM ops") == []


def test_a_stored_result_that_does_not_read_as_one_is_a_failure() -> None:
    """The JSON text of a stored result reads back the same; one that is not a result (a
    field of the wrong type, not JSON) is the operation's failure."""
    result = StoredResult(False, None, "operation_failed", ("LLMError", "down"))
    assert StoredResult.decode(msgspec.json.encode(result)) == result
    failed = StoredResult(False, error="operation_failed")
    assert StoredResult.decode('{"ok": "yes"}') == failed
    assert StoredResult.decode("{") == failed
