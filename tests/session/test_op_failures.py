"""An async operation that fails with any error reports it, and the queue and
the session go on (they used to wedge for good on an error that was not a `MnemoError`)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import mnemo
from mnemo import State
from tests.conftest import REPO, Enter
from tests.fakes import EventLog, FakeEmbedder, FakeLLM, Hold, busy_once, extracted_observations


class Results:
    def __init__(self) -> None:
        self.got: dict[str, mnemo.OpResult] = {}
        self._arrived = anyio.Event()

    def __call__(self, label: str) -> Any:
        def record(result: mnemo.OpResult) -> None:
            assert label not in self.got, f"{label} called back twice"
            self.got[label] = result
            self._arrived.set()

        return record

    async def wait(self, *labels: str) -> None:
        with anyio.fail_after(5):
            while not set(labels) <= set(self.got):
                self._arrived = anyio.Event()
                await self._arrived.wait()


@pytest.mark.parametrize("error", [ValueError("bad vector"), RuntimeError("driver blew up")])
async def test_a_foreign_error_in_a_queued_commit_is_reported_and_the_session_goes_on(
    mem: mnemo.Memory,
    enter: Enter,
    llm: FakeLLM,
    events: EventLog,
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
) -> None:
    """A queued commit whose graph write raises a non-mnemo error gets operation_failed with
    that error as cause; the op queued after it gets preceding_op_failed; then the session,
    still ready, commits normally."""
    sid = await enter(State.EXTRACTING)
    graph = mem._graph
    real_apply = graph.apply

    async def failing_apply(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(graph, "apply", failing_apply)
    results = Results()
    await mem.commit_async(sid, callback=results("commit"))
    await mem.start_episode_async(sid, "next", callback=results("start"))
    llm.holds["semantic"].release()
    await results.wait("commit", "start")

    failed = results.got["commit"]
    assert failed.ok is False
    assert failed.error is not None
    assert failed.error.reason == "operation_failed"
    assert failed.error.__cause__ is error
    assert results.got["start"].error is not None
    assert results.got["start"].error.reason == "preceding_op_failed"
    assert await mem.session_state(sid) is State.READY

    monkeypatch.setattr(graph, "apply", real_apply)
    await mem.commit_async(sid, callback=results("again"))
    await results.wait("again")
    assert results.got["again"].ok is True
    assert await events.wait_state(mem, sid, State.IDLE) is State.IDLE


async def test_an_op_cancelled_by_end_session_still_gets_its_callback(
    mem: mnemo.Memory, enter: Enter, llm: FakeLLM
) -> None:
    """An append running when its session ends is called back once, with session_ended, and so
    is the op queued behind it."""
    sid = await enter(State.COLLECTING)
    held = llm.hold("state")
    results = Results()
    await mem.append_async(sid, "walk", "go", callback=results("append"))
    with anyio.fail_after(5):
        await held.started.wait()
    await mem.close_async(sid, callback=results("close"))
    await mem.end_session(sid)
    await results.wait("append", "close")
    assert {r.error.reason for r in results.got.values() if r.error} == {"session_ended"}


async def test_ops_still_queued_when_the_memory_closes_get_their_callback(
    llm: FakeLLM, embedder: Any, store: str
) -> None:
    """Closing the Memory calls back every accepted operation that had not run."""
    results = Results()
    async with mnemo.Memory(store, llm=llm, embedder=embedder) as m:
        await m.open_repo(REPO)
        sid = await m.start_session("goal", repo=REPO)
        await m.append(sid, "walk", "go")
        held = llm.hold("semantic")
        await m.close(sid)
        with anyio.fail_after(5):
            await held.started.wait()
        await m.commit_async(sid, callback=results("commit"))
    llm.release_all()
    assert results.got["commit"].error is not None
    assert results.got["commit"].error.reason == "memory_closed"


async def test_an_async_append_whose_step_was_stored_is_appended_when_the_memory_closes(
    llm: FakeLLM, embedder: Any, store: str
) -> None:
    """The Memory closes while an append_async's step, stored, waits for its annotation: it
    is called back "appended" (it was "memory_closed", and an app that tried again stored the
    step twice), and the next Memory finds the step once."""
    results = Results()
    async with mnemo.Memory(store, llm=llm, embedder=embedder) as m:
        await m.open_repo(REPO)
        sid = await m.start_session("goal", repo=REPO)
        held = llm.hold("state")
        await m.append_async(sid, "walk north", "go north", callback=results("append"))
        with anyio.fail_after(5):
            await held.started.wait()
    llm.release_all()
    assert results.got["append"] == mnemo.OpResult(True, "appended", None)
    async with mnemo.Memory(store, llm=llm, embedder=embedder) as m:
        assert [[s.observation for s in e.steps] for e in await m.episodes(sid)] == [
            ["walk north"]]


async def test_an_async_append_whose_step_a_model_failure_removed_is_not_appended(
    llm: FakeLLM, embedder: Any, store: str
) -> None:
    """The model fails the step's annotation, and the Memory closes while the step's removal
    is under way: the removal ends first, the step is gone, and the callback is no success
    (it said "appended" of a step no longer stored; on PostgreSQL a cancelled removal rolled
    back and left the step stored, answered `memory_closed`)."""
    results = Results()
    entered, go = anyio.Event(), anyio.Event()
    async with mnemo.Memory(store, llm=llm, embedder=embedder) as m:
        await m.open_repo(REPO)
        sid = await m.start_session("goal", repo=REPO)
        remove_step = m._live.store.remove_step

        async def held_back(*args: Any) -> Any:
            entered.set()
            await go.wait()
            return await remove_step(*args)

        setattr(m._live.store, "remove_step", held_back)  # noqa: B010
        llm.fail_tasks.add("state")
        await m.append_async(sid, "walk north", "go north", callback=results("append"))
        with anyio.fail_after(5):
            await entered.wait()
        async with anyio.create_task_group() as group:
            group.start_soon(m.aclose)
            await anyio.wait_all_tasks_blocked()
            go.set()
    llm.fail_tasks.clear()
    assert not results.got["append"].ok
    async with mnemo.Memory(store, llm=llm, embedder=embedder) as m:
        assert [[s.observation for s in e.steps] for e in await m.episodes(sid)] == [[]]


async def test_a_close_while_a_failed_steps_removal_waits_reports_it_appended(
    llm: FakeLLM, store: str
) -> None:
    """The model fails an async append's step, and the Memory closes while the step's removal
    waits for the session (another move holds it): the step stays stored, and its callback
    says "appended" (it said memory_closed: a retry stored it twice)."""
    results = Results()
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as m:
        await m.open_repo(REPO)
        sid = await m.start_session("goal", repo=REPO)
        session = m._live.by_id[sid]
        held = llm.hold("state")
        await m.append_async(sid, "walk north", "go north", callback=results("append"))
        with anyio.fail_after(5):
            await held.started.wait()
        await session.lock.acquire()  # released by nobody: the close comes first
        llm.fail_tasks.add("state")
        held.release()
        with anyio.fail_after(5):
            while not session.lock.statistics().tasks_waiting:
                await anyio.wait_all_tasks_blocked()
    llm.fail_tasks.clear()
    assert results.got["append"] == mnemo.OpResult(True, "appended", None)
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as m:
        assert [[s.observation for s in e.steps] for e in await m.episodes(sid)] == [
            ["walk north"]]


async def test_an_append_in_a_callback_as_the_memory_closes_is_stored_unannotated(
    llm: FakeLLM, store: str
) -> None:
    """An async append's callback, run as its Memory closes, appends again: that step is
    stored and returns unannotated, to be annotated by the next Memory (it raised a raw
    RuntimeError, the annotation's task group gone, for a step it had stored)."""
    inside: list[object] = []

    async def append_again(result: mnemo.OpResult) -> None:
        try:
            with anyio.fail_after(10):
                inside.append(await m.append(sid, "open the window", "push it"))
        except Exception as exc:  # what it raises is checked below
            inside.append(exc)

    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as m:
        await m.open_repo(REPO)
        sid = await m.start_session("goal", repo=REPO)
        held = llm.hold("state")
        for step in ("north", "south"):
            await m.append_async(sid, f"walk {step}", f"go {step}", callback=append_again)
        with anyio.fail_after(5):
            await held.started.wait()
    llm.release_all()
    assert [type(i) for i in inside] == [mnemo.StepInfo, mnemo.StepInfo], inside
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as m:
        [episode] = await m.episodes(sid)
        assert len(episode.steps) == 1 + len(inside)
        await m.close_and_commit(sid)


async def extracting(
    m: mnemo.Memory, llm: FakeLLM, config: mnemo.Config | None = None
) -> tuple[str, Hold]:
    """A session of `m` closed after one step, its extraction held at the semantic task."""
    await m.open_repo(REPO, config=config)
    sid = await m.start_session("explore the house", repo=REPO)
    await m.append(sid, "walk north", "go north")
    held = llm.hold("semantic")
    await m.close(sid)
    with anyio.fail_after(5):
        await held.started.wait()
    return sid, held


async def test_an_async_append_that_fails_before_its_turn_passes_its_turn_on(
    llm: FakeLLM, store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stored async append (accepted while the session extracts) whose run fails as it
    starts (its stored row cannot be dropped) is answered as failed, and an append in its
    callback runs, as the next one does: they waited for good behind the failed one's turn
    (the one in the callback, and so the Memory's close, until its turn was passed on
    before the callback)."""
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as m:
        sid, held = await extracting(m, llm)
        coordination = m._live.coordination
        drop_queued = coordination.drop_queued
        calls = []

        async def faulty_for_the_append(*args: Any, **kwargs: Any) -> bool:
            calls.append(args)
            if len(calls) == 3:  # commit, start_episode, then the append
                raise mnemo.StorageError("busy", "injected: database is locked")
            return await drop_queued(*args, **kwargs)

        monkeypatch.setattr(coordination, "drop_queued", faulty_for_the_append)
        results = Results()
        inside: list[int] = []

        async def append_inside(result: mnemo.OpResult) -> None:
            results("append")(result)
            with anyio.fail_after(10):
                inside.append((await m.append(sid, "open the window", "push it")).index)

        await m.commit_async(sid, callback=results("commit"))
        await m.start_episode_async(sid, "explore again", callback=results("start"))
        await m.append_async(sid, "open door", "push door", callback=append_inside)
        held.release()
        await results.wait("commit", "start", "append")
        assert [results.got[k].ok for k in ("commit", "start", "append")] == [True, True, False]
        with anyio.fail_after(10):
            info = await m.append(sid, "close the window", "pull it")
        assert (inside, info.index) == ([0], 1)


@pytest.mark.parametrize("failing", ["llm", "embedder", "store"])
async def test_a_failure_in_an_async_append(
    mem: mnemo.Memory, llm: FakeLLM, embedder: FakeEmbedder, failing: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failing model, embedder or store fails an async append as a sync one raises (the
    error is no session error: it arrives as SessionError("operation_failed") with it as
    `__cause__`), and no step is added."""
    sid = await mem.start_session("explore the house", repo=REPO)
    if failing == "llm":
        llm.fail_tasks.add("state")
    elif failing == "embedder":
        embedder.fail = True
    else:
        async def refused(*args: object, **kwargs: object) -> int:
            raise mnemo.StorageError("busy", "the step's write was refused")

        monkeypatch.setattr(mem._sessions_store, "add_step", refused)
    results = Results()
    await mem.append_async(sid, "walk north", "go north", callback=results("append"))
    await results.wait("append")
    result = results.got["append"]
    assert await mem.session_state(sid) is State.COLLECTING
    context = await mem.session_context(sid)
    assert context is not None
    assert result.error is not None
    assert result.error.reason == "operation_failed"
    cause = {"llm": mnemo.LLMError, "embedder": mnemo.EmbeddingError, "store": mnemo.StorageError}
    assert isinstance(result.error.__cause__, cause[failing])
    assert context.recent_steps == []


@pytest.mark.parametrize("auto_commit", [False, True], ids=["manual", "auto_commit"])
async def test_a_fault_taking_stored_ops_after_an_extraction_still_runs_the_queue(
    llm: FakeLLM, store: str, monkeypatch: pytest.MonkeyPatch, auto_commit: bool
) -> None:
    """The store fails once as the operations stored for a session are taken, right after its
    extraction succeeded: the operations queued here still run and call back, and the session
    goes on (the fault was taken for a failed extraction, whose move from ready or idle was
    stale: no callback came, and every later operation queued behind them for good)."""
    config = mnemo.Config(auto_commit=auto_commit, flush_timeout=None, session_timeout=None)
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as m:
        sid, held = await extracting(m, llm, config)
        coordination = m._live.coordination
        take_ops = coordination.take_ops
        faults = [mnemo.StorageError("unavailable", "injected: connection lost")]

        async def flaky_take_ops(*args: Any, **kwargs: Any) -> Any:
            if faults:
                raise faults.pop()
            return await take_ops(*args, **kwargs)

        monkeypatch.setattr(coordination, "take_ops", flaky_take_ops)
        results = Results()
        labels = ["start", "append"] if auto_commit else ["commit", "start", "append"]
        if not auto_commit:
            await m.commit_async(sid, callback=results("commit"))
        await m.start_episode_async(sid, "explore again", callback=results("start"))
        await m.append_async(sid, "open door", "push door", callback=results("append"))
        held.release()
        await results.wait(*labels)
        assert not faults
        values = {"commit": "committed", "start": "started", "append": "appended"}
        assert {label: (r.ok, r.value) for label, r in results.got.items()} == {
            label: (True, values[label]) for label in labels
        }
        assert await m.session_state(sid) is State.COLLECTING


@pytest.mark.parametrize("auto_commit", [False, True])
async def test_a_close_whose_write_finds_the_store_busy_tries_again(
    store: str, llm: FakeLLM, embedder: FakeEmbedder, events: EventLog,
    monkeypatch: pytest.MonkeyPatch, auto_commit: bool,
) -> None:
    """A close whose write (the ready changeset; with auto-commit, the graph commit) meets a
    lock held past `busy_timeout` tries again within its extraction time: the session ends
    ready (idle), not failed, each step asked of the model once and in the graph once."""
    async with mnemo.Memory(store, llm=llm, embedder=embedder, on_event=events) as mem:
        await mem.open_repo(REPO, config=mnemo.Config(auto_commit=auto_commit))
        sid = await mem.start_session("explore", repo=REPO)
        for observation in ("walk north", "walk east"):
            await mem.append(sid, observation, "act")
        target, write = ((mem._live.graph, "apply") if auto_commit
                         else (mem._live.store, "save_extraction"))
        refused: list[bool] = []
        monkeypatch.setattr(target, write, busy_once(getattr(target, write), refused))
        await mem.close(sid)
        end = State.IDLE if auto_commit else State.READY
        assert await events.wait_state(mem, sid, end, State.FAILED) is end
        assert refused == [True]
        assert sorted(extracted_observations(llm)) == ["walk east", "walk north"]
        if auto_commit:
            nodes = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
            assert len(nodes) == 2
