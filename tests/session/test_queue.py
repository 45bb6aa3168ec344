"""The API contract's operation queue: run at once, queue while busy, project, fail in order."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

import mnemo
from mnemo import State
from tests.conftest import REPO, Enter
from tests.fakes import Callbacks, EventLog, FakeEmbedder, FakeLLM, Hold, maybe_await

Callback = Callable[[mnemo.OpResult], Any]
Op = Callable[[mnemo.Memory, str, Callback], Awaitable[None] | None]

OPS: dict[str, Op] = {
    "commit": lambda mem, sid, cb: mem.commit_async(sid, callback=cb),
    "discard": lambda mem, sid, cb: mem.discard_async(sid, callback=cb),
    "close": lambda mem, sid, cb: mem.close_async(sid, callback=cb),
    "start_episode": lambda mem, sid, cb: mem.start_episode_async(sid, "next goal", callback=cb),
    "append": lambda mem, sid, cb: mem.append_async(sid, "walk west", "go west", callback=cb),
}

VALUES = {
    "commit": "committed",
    "discard": "discarded",
    "close": "closed",
    "start_episode": "started",
    "append": "appended",
}


@pytest.fixture(params=["sync", "async"])
def callbacks(request: pytest.FixtureRequest) -> Callbacks:
    return Callbacks(request.param)


async def submit(
    mem: mnemo.Memory, sid: str, op: str, callbacks: Callbacks, label: str = ""
) -> None:
    """Submits `op` for `sid` with a callback recording its result under `label` (or `op`)."""
    await maybe_await(OPS[op](mem, sid, callbacks(label or op)))


async def state_of(mem: mnemo.Memory, sid: str) -> State:
    return await maybe_await(mem.session_state(sid))


@pytest.mark.parametrize(
    ("state", "op", "final"),
    [
        (State.READY, "commit", State.IDLE),
        (State.READY, "discard", State.IDLE),
        (State.IDLE, "start_episode", State.COLLECTING),
        (State.COLLECTING, "append", State.COLLECTING),
        (State.COLLECTING, "close", State.READY),
    ],
)
async def test_valid_op_runs_when_not_busy(
    mem: mnemo.Memory,
    enter: Enter,
    events: EventLog,
    callbacks: Callbacks,
    state: State,
    op: str,
    final: State,
) -> None:
    """A valid operation on a session that is not busy runs, and its callback gets the value."""
    sid = await enter(state)
    await submit(mem, sid, op, callbacks)
    [(_, result)] = await callbacks.wait(1)
    assert result.ok is True
    assert result.value == VALUES[op]
    assert result.error is None
    assert await events.wait_state(mem, sid, final, State.FAILED) == final


@pytest.mark.parametrize(
    ("state", "op"),
    [
        (State.IDLE, "append"),
        (State.IDLE, "close"),
        (State.IDLE, "commit"),
        (State.IDLE, "discard"),
        (State.COLLECTING, "start_episode"),
        (State.COLLECTING, "commit"),
        (State.COLLECTING, "discard"),
        (State.READY, "start_episode"),
        (State.READY, "append"),
        (State.READY, "close"),
    ],
)
async def test_invalid_op_when_not_busy(
    mem: mnemo.Memory, enter: Enter, callbacks: Callbacks, state: State, op: str
) -> None:
    """An operation invalid in the current state of an idle queue raises invalid_operation."""
    sid = await enter(state)
    with pytest.raises(mnemo.SessionError) as caught:
        await submit(mem, sid, op, callbacks)
    assert caught.value.reason == "invalid_operation"
    assert await state_of(mem, sid) == state


@pytest.mark.parametrize("op", list(OPS))
async def test_failed_refuses_every_async_op(
    mem: mnemo.Memory, enter: Enter, callbacks: Callbacks, op: str
) -> None:
    """In failed every *_async call raises session_failed, commit and discard included."""
    sid = await enter(State.FAILED)
    with pytest.raises(mnemo.SessionError) as caught:
        await submit(mem, sid, op, callbacks)
    assert caught.value.reason == "session_failed"
    assert await state_of(mem, sid) == State.FAILED


@pytest.mark.parametrize("sixth", ["commit", "append"])
async def test_sixth_pending_op_is_refused(
    mem: mnemo.Memory, enter: Enter, callbacks: Callbacks, sixth: str
) -> None:
    """Five operations queue while extracting; a sixth, valid or not, gets pending_queue_full."""
    sid = await enter(State.EXTRACTING)
    # ready -commit-> idle -start_episode-> collecting -append-> -append-> -close-> ready
    for op in ["commit", "start_episode", "append", "append", "close"]:
        await submit(mem, sid, op, callbacks)
    with pytest.raises(mnemo.SessionError) as caught:
        await submit(mem, sid, sixth, callbacks)
    assert caught.value.reason == "pending_queue_full"


async def test_queued_ops_follow_the_projection(
    mem: mnemo.Memory, llm: FakeLLM, enter: Enter, callbacks: Callbacks
) -> None:
    """Ops queued while extracting run in order once it ends, each callback with its value."""
    sid = await enter(State.EXTRACTING)
    sequence = ["commit", "start_episode", "append", "close", "commit"]
    for op in sequence:
        await submit(mem, sid, op, callbacks)
    assert await state_of(mem, sid) == State.EXTRACTING
    llm.holds["semantic"].release()
    results = await callbacks.wait(len(sequence))
    assert callbacks.labels() == sequence
    assert [(r.ok, r.value, r.error) for _, r in results] == [
        (True, VALUES[op], None) for op in sequence
    ]
    assert await state_of(mem, sid) == State.IDLE


@pytest.mark.parametrize(
    ("queued", "op"),
    [
        ([], "start_episode"),
        ([], "append"),
        ([], "close"),
        (["commit"], "discard"),
        (["commit"], "commit"),
        (["commit"], "append"),
        (["discard"], "close"),
        (["commit", "start_episode"], "start_episode"),
        (["commit", "start_episode"], "commit"),
        (["commit", "start_episode", "close"], "close"),
    ],
)
async def test_op_invalid_in_projection_is_refused(
    mem: mnemo.Memory, enter: Enter, callbacks: Callbacks, queued: list[str], op: str
) -> None:
    """An op invalid in the state projected from ready past the queue: invalid_queued_operation."""
    sid = await enter(State.EXTRACTING)
    for earlier in queued:
        await submit(mem, sid, earlier, callbacks)
    with pytest.raises(mnemo.SessionError) as caught:
        await submit(mem, sid, op, callbacks)
    assert caught.value.reason == "invalid_queued_operation"
    assert await state_of(mem, sid) == State.EXTRACTING


@pytest.mark.parametrize("third", ["discard", "start_episode"])
async def test_ops_right_behind_a_close_async_are_projected_from_ready(
    mem: mnemo.Memory, enter: Enter, callbacks: Callbacks, third: str,
    request: pytest.FixtureRequest,
) -> None:
    """Ops submitted right behind a `close_async` queue behind it here, projected from ready:
    a second discard is refused, a start_episode accepted, and they run in call order. The
    extraction's task had not started yet, so the session looked extracted by another Memory:
    a second discard was accepted and ran first, and a start_episode was refused (22 in
    30 tries); and, more rarely, a read landing inside the close's
    own write took it in half-way, with the same effect, or left the discard in the store's
    queue with nobody to run it. Ten sessions, each at once after the close; the extraction's
    semantic task is held until the ops are in (a fast extraction could end before the third
    op, which then met an idle session: invalid_operation, by the state table)."""
    llm: FakeLLM = request.getfixturevalue("llm")
    for i in range(10):
        sid = await enter(State.COLLECTING)
        await mem.append(sid, "walk north", "go north")
        labels = [f"close{i}", f"discard{i}"]
        before = len(callbacks.results)
        held = llm.hold("semantic")
        await submit(mem, sid, "close", callbacks, labels[0])
        await submit(mem, sid, "discard", callbacks, labels[1])
        if third == "discard":
            with pytest.raises(mnemo.SessionError) as caught:
                await submit(mem, sid, "discard", callbacks, f"again{i}")
            assert caught.value.reason == "invalid_queued_operation"
        else:
            labels.append(f"start{i}")
            await submit(mem, sid, "start_episode", callbacks, labels[-1])
        held.release()
        del llm.holds["semantic"]
        results = (await callbacks.wait(before + len(labels)))[before:]
        assert [(label, r.ok) for label, r in results] == [(label, True) for label in labels]
        await mem.end_session(sid)


async def test_a_read_older_than_the_close_does_not_take_the_session_back(
    mem: mnemo.Memory, enter: Enter, events: EventLog, callbacks: Callbacks,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read of the session that began before the close's writes and answers after them
    (PostgreSQL's pooled connections answer in any order) is older than the record: it is not
    taken in. It was: the ready session looked extracting again, with no extraction here, so
    an operation behind it went to the store's queue (then ran twice, or never, or refused
    the next one: one PostgreSQL run in eight). The late answers are
    placed deterministically here: the session's row, lease and version as read before the
    close."""
    sid = await enter(State.COLLECTING)
    await mem.append(sid, "walk north", "go north")
    live = mem._live
    before_row = await live.store.load_one(sid)
    before_lease = await live.coordination.lease(sid)
    before_version = await live.store.version(sid)
    assert before_row is not None
    assert before_lease is not None
    assert before_version == before_row.version
    await mem.close(sid)
    assert await events.wait_state(mem, sid, State.READY) == State.READY
    record = live.by_id[sid]
    assert record.state is State.READY
    assert record.version > before_row.version

    async def late_row(session_id: str) -> object:
        return before_row

    async def late_lease(session_id: str) -> object:
        return before_lease

    async def late_version(session_id: str) -> object:
        return before_version

    monkeypatch.setattr(live.store, "load_one", late_row)
    monkeypatch.setattr(live.coordination, "lease", late_lease)
    monkeypatch.setattr(live.store, "version", late_version)
    await live.reload(record)
    assert record.state is State.READY
    await submit(mem, sid, "discard", callbacks, "discard")
    assert record.state is State.READY
    assert not live.remote.get(sid)
    with pytest.raises(mnemo.SessionError) as caught:
        await submit(mem, sid, "discard", callbacks, "again")
    assert caught.value.reason == "invalid_queued_operation"
    monkeypatch.undo()
    [(label, result)] = await callbacks.wait(1)
    assert (label, result.ok, result.value) == ("discard", True, "discarded")
    assert await state_of(mem, sid) == State.IDLE


async def test_a_record_ahead_of_its_store_takes_the_store_in_after_a_refused_write(
    mem: mnemo.Memory, events: EventLog
) -> None:
    """A record whose version is ahead of the store's (no code path makes one now; a store
    restored from a backup would) is read again after the store refuses its write, though
    the store's version is older: every write was refused and every read left out, so an
    append tried again for good."""
    sid = await mem.start_session("explore the house", repo=REPO)
    live = mem._live
    live.by_id[sid].version += 1
    with anyio.fail_after(10):
        info = await mem.append(sid, "walk north", "go north")
    assert info.index == 0
    await mem.close(sid)
    assert await events.wait_state(mem, sid, State.READY, State.FAILED) == State.READY
    assert await mem.commit(sid) is not None
    assert await state_of(mem, sid) == State.IDLE


async def test_a_read_during_a_commits_write_loses_no_transition(
    mem: mnemo.Memory, enter: Enter, events: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that takes in a manual commit's write while it is being made (it forced the
    record to idle) leaves the move to the commit, as `move` does for the others: the
    commit raised the state machine's MachineError from idle although it was stored. The read
    is placed deterministically, right after the write."""
    sid = await enter(State.READY)
    live = mem._live
    graph = live.graph
    apply = graph.apply

    async def apply_then_read(*args: object, **kwargs: object) -> object:
        receipt = await apply(*args, **kwargs)  # type: ignore[arg-type]
        await live.reload(live.by_id[sid])
        assert live.by_id[sid].state is State.IDLE
        return receipt

    monkeypatch.setattr(graph, "apply", apply_then_read)
    receipt = await mem.commit(sid)
    assert receipt is not None
    assert receipt.node_ids
    assert await state_of(mem, sid) == State.IDLE
    assert events.transitions(sid)[-1] == ("ready", "idle")


async def test_extraction_failure_fails_queued_ops(
    mem: mnemo.Memory, llm: FakeLLM, enter: Enter, callbacks: Callbacks
) -> None:
    """A failed extraction leaves the session failed and every queued op extraction_failed."""
    sid = await enter(State.EXTRACTING)
    llm.fail_tasks.add("semantic")
    await submit(mem, sid, "commit", callbacks)
    await submit(mem, sid, "start_episode", callbacks)
    llm.holds["semantic"].release()
    results = await callbacks.wait(2)
    assert sorted(callbacks.labels()) == ["commit", "start_episode"]
    for _, result in results:
        assert result.ok is False
        assert result.error is not None
        assert result.error.reason == "extraction_failed"
    assert await state_of(mem, sid) == State.FAILED


async def test_failing_queued_op_fails_the_ones_after_it(
    mem: mnemo.Memory, llm: FakeLLM, enter: Enter, callbacks: Callbacks,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A queued op failing as it runs gets its own error, and the later ones preceding_op_failed."""
    sid = await enter(State.EXTRACTING)
    for op in ["commit", "start_episode", "append"]:
        await submit(mem, sid, op, callbacks)
    await submit(mem, sid, "append", callbacks, label="later append")
    await submit(mem, sid, "close", callbacks)

    # The store refuses the first queued append's step (a model failure would not fail it:
    # the step is stored before it is annotated).
    async def refused(*args: object, **kwargs: object) -> int:
        raise mnemo.StorageError("busy", "the step's write was refused")

    monkeypatch.setattr(mem._sessions_store, "add_step", refused)
    llm.holds["semantic"].release()
    results = dict(await callbacks.wait(5))
    assert callbacks.labels() == ["commit", "start_episode", "append", "later append", "close"]
    assert (results["commit"].ok, results["commit"].value) == (True, "committed")
    assert (results["start_episode"].ok, results["start_episode"].value) == (True, "started")
    failed = results["append"]
    assert failed.ok is False
    assert isinstance(failed.error, mnemo.SessionError)
    assert failed.error.reason != "preceding_op_failed"
    for label in ["later append", "close"]:
        skipped = results[label]
        assert skipped.ok is False
        assert skipped.error is not None
        assert skipped.error.reason == "preceding_op_failed"
    assert await state_of(mem, sid) == State.COLLECTING


async def auto_extracting(auto_mem: mnemo.Memory, llm: FakeLLM) -> tuple[str, Hold]:
    """An auto-commit session with one step, closed: extracting until the returned hold (of
    the "semantic" task) is released."""
    sid = await auto_mem.start_session("explore the house", repo=REPO)
    await auto_mem.append(sid, "walk north", "go north")
    held = llm.hold("semantic")
    await auto_mem.close(sid)
    with anyio.fail_after(5):
        await held.started.wait()
    return sid, held


async def test_auto_commit_projection_starts_idle(
    auto_mem: mnemo.Memory, llm: FakeLLM, events: EventLog, callbacks: Callbacks
) -> None:
    """In auto-commit, ops queued while extracting project from idle, and close projects to idle."""
    sid, held = await auto_extracting(auto_mem, llm)
    assert await state_of(auto_mem, sid) == State.EXTRACTING
    with pytest.raises(mnemo.SessionError) as caught:
        await submit(auto_mem, sid, "commit", callbacks)
    assert caught.value.reason == "invalid_queued_operation"
    sequence = ["start_episode", "append", "close", "start_episode"]
    for op in sequence:
        await submit(auto_mem, sid, op, callbacks)
    held.release()
    results = await callbacks.wait(len(sequence))
    assert callbacks.labels() == sequence
    assert [(r.ok, r.value) for _, r in results] == [(True, VALUES[op]) for op in sequence]
    assert await events.wait_state(auto_mem, sid, State.COLLECTING) == State.COLLECTING


async def test_auto_commit_trajectory_in_flight_is_busy(
    auto_mem: mnemo.Memory, llm: FakeLLM, callbacks: Callbacks
) -> None:
    """While a trajectory commits in the background, ops queue and project from collecting."""
    sid = await auto_mem.start_session("explore the house", repo=REPO)
    held = llm.hold("semantic")
    await auto_mem.append(sid, "walk north", "go north")
    boundary = await auto_mem.append(sid, "open door", "push door")
    assert boundary.boundary_detected
    with anyio.fail_after(5):
        await held.started.wait()
    assert await state_of(auto_mem, sid) == State.COLLECTING
    with pytest.raises(mnemo.SessionError) as caught:
        await submit(auto_mem, sid, "commit", callbacks)
    assert caught.value.reason == "invalid_queued_operation"
    await submit(auto_mem, sid, "append", callbacks)
    held.release()
    [(_, result)] = await callbacks.wait(1)
    assert (result.ok, result.value, result.error) == (True, "appended", None)


async def test_auto_commit_background_failure(
    auto_mem: mnemo.Memory, llm: FakeLLM, events: EventLog, callbacks: Callbacks
) -> None:
    """A failed background trajectory commit fails queued ops, keeps collecting, loses no step."""
    sid = await auto_mem.start_session("explore the house", repo=REPO)
    held = llm.hold("semantic")
    await auto_mem.append(sid, "walk north", "go north")
    await auto_mem.append(sid, "open door", "push door")
    with anyio.fail_after(5):
        await held.started.wait()
    await submit(auto_mem, sid, "append", callbacks)
    llm.fail_tasks.add("semantic")
    held.release()
    [(_, result)] = await callbacks.wait(1)
    assert result.ok is False
    assert result.error is not None
    assert result.error.reason == "extraction_failed"
    assert await state_of(auto_mem, sid) == State.COLLECTING
    llm.fail_tasks.discard("semantic")
    await auto_mem.close(sid)
    assert await events.wait_state(auto_mem, sid, State.IDLE, State.FAILED) == State.IDLE
    stored = await auto_mem.latest(REPO, types=(mnemo.NodeType.SEMANTIC,), top_k=50)
    assert "fact: walk north" in {node.text for node in stored}


async def test_queued_close_is_not_held_by_appends_queued_after_it(
    auto_mem: mnemo.Memory, llm: FakeLLM, callbacks: Callbacks
) -> None:
    """A queued close runs: only appends before it (or running) are in progress, not those
    queued after it, which run once it is done (it used to fail with append_in_progress and
    fail the rest as preceding_op_failed)."""
    sid, held = await auto_extracting(auto_mem, llm)
    sequence = ["start_episode", "close", "start_episode", "append"]
    for op in sequence:
        await submit(auto_mem, sid, op, callbacks)
    held.release()
    results = await callbacks.wait(len(sequence))
    assert [(r.ok, r.value) for _, r in results] == [(True, VALUES[op]) for op in sequence]


async def test_queued_close_behind_a_running_append(
    mem: mnemo.Memory, llm: FakeLLM, callbacks: Callbacks
) -> None:
    """Manual commit: an append runs, then close, commit, start_episode and an append are
    queued behind it; each runs in turn with its value."""
    sid = await mem.start_session("explore the house", repo=REPO)
    held = llm.hold("state")
    await submit(mem, sid, "append", callbacks, label="running append")
    with anyio.fail_after(5):
        await held.started.wait()
    sequence = ["close", "commit", "start_episode", "append"]
    for op in sequence:
        await submit(mem, sid, op, callbacks)
    held.release()
    results = await callbacks.wait(1 + len(sequence))
    assert callbacks.labels() == ["running append", *sequence]
    assert [(r.ok, r.value) for _, r in results] == [
        (True, VALUES[op]) for op in ["append", *sequence]
    ]
    assert await state_of(mem, sid) == State.COLLECTING


async def test_a_close_async_during_a_synchronous_append_is_refused_as_not_busy(
    mem: mnemo.Memory, llm: FakeLLM, callbacks: Callbacks
) -> None:
    """A synchronous append is no accepted operation: the session is not busy (the contract's
    word), so a close_async made while it runs is checked at once and refused
    invalid_operation, and nothing is queued; the append ends as it would, and a close after
    it works. Queuing it instead let the append's event handler deadlock on it."""
    sid = await mem.start_session("explore the house", repo=REPO)
    held = llm.hold("state")
    async with anyio.create_task_group() as group:
        group.start_soon(mem.append, sid, "The hall is dark.", "Switch on the light.")
        with anyio.fail_after(5):
            await held.started.wait()
        with pytest.raises(mnemo.SessionError) as refused:
            await submit(mem, sid, "close", callbacks)
        assert refused.value.reason == "invalid_operation"
        held.release()
    await mem.close(sid)
    assert callbacks.results == []
    assert [len(e.steps) for e in await mem.episodes(sid)] == [1]


async def test_a_sync_call_keeps_call_order_with_the_queue(
    mem: mnemo.Memory, llm: FakeLLM, callbacks: Callbacks
) -> None:
    """A sync append made after a close_async was accepted (behind a running append) runs
    after it: the close succeeds and the append is refused as extracting. Before, the sync
    append ran first and the accepted close failed with `append_in_progress`."""
    sid = await mem.start_session("explore the house", repo=REPO)
    held = llm.hold("state")
    await submit(mem, sid, "append", callbacks, label="running append")
    with anyio.fail_after(5):
        await held.started.wait()
    await submit(mem, sid, "close", callbacks)
    extraction = llm.hold("semantic")
    outcome: list[object] = []

    async def late_append() -> None:
        try:
            outcome.append(await mem.append(sid, "walk late", "go late"))
        except mnemo.SessionError as exc:
            outcome.append(exc.reason)

    async with anyio.create_task_group() as tg:
        tg.start_soon(late_append)
        held.release()
    results = await callbacks.wait(2)
    assert [(r.ok, r.value) for _, r in results] == [(True, "appended"), (True, "closed")]
    assert outcome == ["extraction_in_progress"]
    extraction.release()


async def test_a_sync_call_from_a_callback_goes_before_the_queued_operations(
    mem: mnemo.Memory, llm: FakeLLM
) -> None:
    """A sync append made in an operation's callback, while another append waits in the
    queue, runs at once (the queued one starts after the callback, then takes its turn).
    Before, the sync append waited for the queued append's turn, taken when it was accepted,
    which waited for the callback: both hung, and so did the Memory's close."""
    sid = await mem.start_session("explore the house", repo=REPO)
    held = llm.hold("state")
    order: list[str] = []
    appended = anyio.Event()

    async def then_append(result: mnemo.OpResult) -> None:
        order.append(f"first: {result.value}")
        info = await mem.append(sid, "walk inside", "go inside")
        order.append(f"sync append {info.index}")
        appended.set()

    await mem.append_async(sid, "walk north", "go north", callback=then_append)
    with anyio.fail_after(5):
        await held.started.wait()
    done = anyio.Event()

    def second(result: mnemo.OpResult) -> None:
        order.append(f"second: {result.value}")
        done.set()

    await mem.append_async(sid, "walk east", "go east", callback=second)
    held.release()
    with anyio.fail_after(10):
        await done.wait()
        await appended.wait()
    assert order == ["first: appended", "sync append 1", "second: appended"]


@pytest.mark.parametrize("close", ["close", "close_async"])
async def test_a_close_from_an_appends_callback_runs(
    mem: mnemo.Memory, events: EventLog, close: str
) -> None:
    """An append's callback closing the session: the append is over when it is called
    back, so the close runs (it was refused, append_in_progress or invalid_operation: the
    append still counted as in progress)."""
    sid = await mem.start_session("explore the house", repo=REPO)
    outcome: list[object] = []
    done = anyio.Event()

    async def then_close(result: mnemo.OpResult) -> None:
        outcome.append(result.value)
        try:
            if close == "close":
                await mem.close(sid)
            else:
                await mem.close_async(sid)
            outcome.append("close accepted")
        except mnemo.SessionError as exc:
            outcome.append(exc.reason)
        done.set()

    await mem.append_async(sid, "walk north", "go north", callback=then_close)
    with anyio.fail_after(5):
        await done.wait()
    assert outcome == ["appended", "close accepted"]
    assert await events.wait_state(mem, sid, State.READY, State.FAILED) == State.READY


async def test_aclose_from_a_callback_is_refused_at_once_and_the_memory_stays_usable(
    mem: mnemo.Memory, events: EventLog
) -> None:
    """A callback closing its own Memory would wait for itself (the close waits for every
    callback): it raises at once (it hung, whatever timeout the caller set), nothing closes,
    and a close after the callback returns works."""
    sid = await mem.start_session("explore the house", repo=REPO)
    outcome: list[object] = []
    done = anyio.Event()

    async def then_aclose(result: mnemo.OpResult) -> None:
        outcome.append(result.value)
        try:
            with anyio.fail_after(5):
                await mem.aclose()
            outcome.append("closed")
        except (RuntimeError, TimeoutError) as exc:
            outcome.append(type(exc).__name__)
        done.set()

    await mem.append_async(sid, "walk north", "go north", callback=then_aclose)
    with anyio.fail_after(10):
        await done.wait()
    assert outcome == ["appended", "RuntimeError"]
    await mem.close(sid)
    assert await events.wait_state(mem, sid, State.READY, State.FAILED) == State.READY


async def test_a_task_a_callback_starts_may_close_the_memory(
    store: str, llm: FakeLLM, embedder: FakeEmbedder
) -> None:
    """A callback that schedules the shutdown in a task of its own: that task is no part of
    the Memory's work, so its aclose() closes the Memory (it was refused as the callback's)."""
    closed = anyio.Event()
    outcome: list[str] = []

    async def shut_down(mem: mnemo.Memory) -> None:
        await mem.aclose()
        outcome.append("closed")
        closed.set()

    mem = mnemo.Memory(store, llm=llm, embedder=embedder)
    await mem.__aenter__()
    try:
        await mem.open_repo(REPO)
        sid = await mem.start_session("explore the house", repo=REPO)
        tasks: list[asyncio.Task[None]] = []
        await mem.append_async(sid, "walk north", "go north",
                               callback=lambda _: tasks.append(asyncio.create_task(shut_down(mem))))
        with anyio.fail_after(10):
            await closed.wait()
        assert outcome == ["closed"]
        with pytest.raises(mnemo.StorageError):
            await mem.start_session("explore the garden", repo=REPO)
    finally:
        await mem.aclose()


async def test_a_failed_background_commit_fails_every_queued_op_even_with_slow_callbacks(
    auto_mem: mnemo.Memory, llm: FakeLLM
) -> None:
    """While the callbacks of a failed background commit's queue are delivered one by one
    (each waiting on the app), the operation that finished before gets to its end: none of
    the queued ones may start then (the close did, and ran)."""
    gates = {"open door": anyio.Event(), "open lid": anyio.Event()}
    results: dict[str, mnemo.OpResult] = {}
    arrived = {name: anyio.Event() for name in ["open door", "open lid", "close", "start"]}

    def record(name: str) -> Callback:
        async def callback(result: mnemo.OpResult) -> None:
            results[name] = result
            arrived[name].set()
            if name in gates:
                await gates[name].wait()
        return callback

    sid = await auto_mem.start_session("explore the house", repo=REPO)
    await auto_mem.append(sid, "walk north", "go north")
    held = llm.hold("semantic")
    llm.fail_tasks.add("semantic")  # decided when the held call is let go
    await auto_mem.append_async(sid, "open door", "push door", callback=record("open door"))
    with anyio.fail_after(5):
        await held.started.wait()  # the boundary's background commit of step 0
        await arrived["open door"].wait()  # its callback now waits on the app
    await auto_mem.append_async(sid, "open lid", "lift lid", callback=record("open lid"))
    await auto_mem.close_async(sid, callback=record("close"))
    await auto_mem.start_episode_async(sid, "next", callback=record("start"))
    held.release()
    with anyio.fail_after(5):
        await arrived["open lid"].wait()  # the failure's first callback waits on the app
    gates["open door"].set()  # the finished append ends: it must start nothing
    await anyio.wait_all_tasks_blocked()
    gates["open lid"].set()
    with anyio.fail_after(5):
        for event in arrived.values():
            await event.wait()
    assert [(results[n].ok, results[n].value) for n in ["open door"]] == [(True, "appended")]
    for name in ["open lid", "close", "start"]:
        error = results[name].error
        assert error is not None
        assert error.reason == "extraction_failed", name
    llm.fail_tasks.clear()
    assert await state_of(auto_mem, sid) == State.COLLECTING
