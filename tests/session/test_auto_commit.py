"""Auto-commit: finished trajectories commit in the background, idle ones are flushed, idle
sessions expire; no step is extracted twice and none is lost."""

from __future__ import annotations

import math

import anyio
import pytest

import mnemo
from tests.conftest import REPO
from tests.fakes import EventLog, FakeEmbedder, FakeLLM, Hold, extracted_observations, js


async def episodic_indices(mem: mnemo.Memory) -> list[int]:
    nodes = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
    return sorted(js(n.data)["index"] for n in nodes)


async def test_boundary_commits_previous_trajectory_while_collecting(
    auto_mem: mnemo.Memory, llm: FakeLLM, events: EventLog
) -> None:
    """A trajectory boundary commits the previous trajectory in the background; the session
    keeps collecting."""
    sid = await auto_mem.start_session("explore", repo=REPO)
    await auto_mem.append(sid, "walk north", "go north")
    await auto_mem.append(sid, "walk east", "go east")
    info = await auto_mem.append(sid, "open door", "push door")
    assert info.boundary_detected
    event = await events.wait_for(lambda e: e.kind == "trajectory_committed")
    assert event.session_id == sid
    assert await auto_mem.session_state(sid) is mnemo.State.COLLECTING
    assert await episodic_indices(auto_mem) == [0, 1]
    for node_id in js(event.data)["node_ids"]:
        assert await auto_mem.get_node(REPO, node_id) is not None


async def test_close_commits_only_the_rest_and_ends_idle(
    auto_mem: mnemo.Memory, llm: FakeLLM, events: EventLog
) -> None:
    """close in auto-commit extracts only uncommitted steps and ends idle, never ready; the
    receipt of close_and_commit holds what the close committed."""
    sid = await auto_mem.start_session("explore", repo=REPO)
    for observation in ("walk north", "walk east", "open door", "open window"):
        await auto_mem.append(sid, observation, "act")
    await events.wait_for(lambda e: e.kind == "trajectory_committed")
    receipt = await auto_mem.close_and_commit(sid)
    assert await auto_mem.session_state(sid) is mnemo.State.IDLE
    assert (mnemo.State.EXTRACTING.value, mnemo.State.READY.value) not in [
        (str(a), str(b)) for a, b in events.transitions(sid)
    ]
    assert await episodic_indices(auto_mem) == [0, 1, 2, 3]
    assert sorted(extracted_observations(llm)) == sorted(
        ["walk north", "walk east", "open door", "open window"]
    )
    committed = {n.id for n in await auto_mem.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
                 if js(n.data)["index"] >= 2}
    assert committed <= set(receipt.node_ids)


async def test_close_waits_for_a_background_commit_in_flight(
    auto_mem: mnemo.Memory, llm: FakeLLM, events: EventLog
) -> None:
    """A close while a background trajectory extraction is in flight neither repeats nor
    loses its steps."""
    sid = await auto_mem.start_session("explore", repo=REPO)
    await auto_mem.append(sid, "walk north", "go north")
    held = llm.hold("semantic")
    await auto_mem.append(sid, "open door", "push door")
    with anyio.fail_after(5):
        await held.started.wait()
    await auto_mem.close(sid)
    assert await auto_mem.session_state(sid) is mnemo.State.EXTRACTING
    held.release()
    assert await events.wait_state(auto_mem, sid, mnemo.State.IDLE) is mnemo.State.IDLE
    assert sorted(extracted_observations(llm)) == ["open door", "walk north"]
    assert await episodic_indices(auto_mem) == [0, 1]


async def test_flush_timeout_commits_an_idle_trajectory(
    llm: FakeLLM, events: EventLog, store: str
) -> None:
    """After flush_timeout without an append, the current trajectory's steps are committed."""
    config = mnemo.Config(auto_commit=True, flush_timeout=0.05, session_timeout=None)
    async with mnemo.Memory(store, llm=llm, embedder=_embedder(), on_event=events) as mem:
        await mem.open_repo(REPO, config=config)
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, "walk north", "go north")
        await mem.append(sid, "walk east", "go east")
        # Both steps, in one commit or two: the flush may come between the appends (a pause
        # of 50 ms on a busy machine).
        await events.wait_for(
            lambda e: e.kind == "trajectory_committed" and 1 in js(e.data)["step_indices"]
        )
        assert await episodic_indices(mem) == [0, 1]
        assert await mem.session_state(sid) is mnemo.State.COLLECTING
        await mem.append(sid, "walk south", "go south")
        await mem.close_and_commit(sid)
        assert await episodic_indices(mem) == [0, 1, 2]
        assert extracted_observations(llm) == ["walk north", "walk east", "walk south"]


async def test_session_timeout_commits_the_rest_and_ends_the_session(
    llm: FakeLLM, events: EventLog, store: str
) -> None:
    """After session_timeout without activity the rest is committed and the session ends."""
    config = mnemo.Config(auto_commit=True, flush_timeout=None, session_timeout=0.05)
    async with mnemo.Memory(store, llm=llm, embedder=_embedder(), on_event=events) as mem:
        await mem.open_repo(REPO, config=config)
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, "walk north", "go north")
        event = await events.wait_for(lambda e: e.kind == "session_expired")
        assert event.session_id == sid
        assert await episodic_indices(mem) == [0]
        with pytest.raises(mnemo.NotFoundError) as caught:
            await mem.session_state(sid)
        assert caught.value.resource == "session"


async def test_failed_background_commit_keeps_collecting_and_retries_later(
    auto_mem: mnemo.Memory, llm: FakeLLM
) -> None:
    """A failed background extraction fails queued callbacks with extraction_failed, leaves the
    session collecting, and its steps are committed by the next close."""
    sid = await auto_mem.start_session("explore", repo=REPO)
    await auto_mem.append(sid, "walk north", "go north")
    held = llm.hold("semantic")
    await auto_mem.append(sid, "open door", "push door")
    with anyio.fail_after(5):
        await held.started.wait()
    results: list[mnemo.OpResult] = []
    delivered = anyio.Event()

    def callback(result: mnemo.OpResult) -> None:
        results.append(result)
        delivered.set()

    await auto_mem.append_async(sid, "open window", "push window", callback)
    llm.fail_tasks.add("semantic")  # the held call fails once released
    held.release()
    with anyio.fail_after(5):
        await delivered.wait()
    assert results[0].error is not None
    assert results[0].error.reason == "extraction_failed"
    assert await auto_mem.session_state(sid) is mnemo.State.COLLECTING
    llm.fail_tasks.clear()
    await auto_mem.close_and_commit(sid)
    assert await episodic_indices(auto_mem) == [0, 1]


def _embedder() -> FakeEmbedder:
    return FakeEmbedder()


# Sessions that expire 50 ms after their last activity, with no flush.
EXPIRING_AFTER = 0.05
EXPIRING = mnemo.Config(auto_commit=True, flush_timeout=None, session_timeout=EXPIRING_AFTER)


async def held_background_commit(mem: mnemo.Memory, llm: FakeLLM) -> tuple[str, Hold]:
    """A session of two steps whose first commits in the background, held at "semantic"."""
    sid = await mem.start_session("explore", repo=REPO)
    await mem.append(sid, "walk north", "go north")
    held = llm.hold("semantic")
    await mem.append(sid, "open door", "push door")  # a boundary: step 0 commits
    with anyio.fail_after(5):
        await held.started.wait()
    return sid, held


async def until_expiry_started(mem: mnemo.Memory, sid: str) -> None:
    """Until the session's expiry is due and its task started (it marks the session)."""
    record = mem._live.by_id[sid]
    with anyio.fail_after(5):
        while record.last_activity != math.inf:
            await anyio.wait_all_tasks_blocked()


async def test_an_expiry_due_while_work_runs_waits_for_it_and_loses_nothing(
    llm: FakeLLM, events: EventLog, store: str
) -> None:
    """session_timeout passes while a background commit is held and an append is queued:
    the expiry waits for them (it ended the session at once, cancelling the commit: no step
    reached the graph); the queued append is activity, so the session expires a timeout
    later, with every step committed."""
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO, config=EXPIRING)
        sid, held = await held_background_commit(mem, llm)
        results: list[mnemo.OpResult] = []
        await mem.append_async(sid, "open lid", "lift lid", callback=results.append)
        await until_expiry_started(mem, sid)
        await anyio.wait_all_tasks_blocked()
        held.release()
        await events.wait_for(lambda e: e.kind == "session_expired")
        assert [(r.ok, r.value) for r in results] == [(True, "appended")]
        assert await episodic_indices(mem) == [0, 1, 2]


async def test_an_expiry_waiting_for_work_waits_for_a_close_made_meanwhile(
    llm: FakeLLM, events: EventLog, store: str
) -> None:
    """The expiry waits for a held background commit; meanwhile the app closes the session:
    the expiry waits for that close's extraction too before ending the session (it ended it
    at once, cancelling the extraction: the last step was never committed)."""
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO, config=EXPIRING)
        sid, held = await held_background_commit(mem, llm)
        await until_expiry_started(mem, sid)
        await mem.close_async(sid)  # queued behind the background commit
        held.release()
        await events.wait_for(lambda e: e.kind == "session_expired")
        assert await episodic_indices(mem) == [0, 1]


async def test_an_expiry_due_during_a_sync_append_waits_for_it(
    llm: FakeLLM, events: EventLog, store: str
) -> None:
    """session_timeout passes while a sync append is being annotated: the expiry waits for it
    (it closed and ended the session under the append, which raised NotFoundError and lost
    its step); the append is activity, so the session expires a timeout later, with both
    steps committed."""
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO, config=EXPIRING)
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, "walk north", "go north")
        held = llm.hold("subgoal")
        infos: list[mnemo.StepInfo] = []

        async def second() -> None:
            infos.append(await mem.append(sid, "walk east", "go east"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(second)
            with anyio.fail_after(5):
                await held.started.wait()
            await until_expiry_started(mem, sid)
            await anyio.wait_all_tasks_blocked()
            held.release()
        assert [info.index for info in infos] == [1]
        await events.wait_for(lambda e: e.kind == "session_expired")
        assert await episodic_indices(mem) == [0, 1]


async def test_operations_queued_behind_an_expirys_close_run_and_keep_the_session(
    llm: FakeLLM, events: EventLog, store: str
) -> None:
    """An episode started, a step and a close are queued while the expiry's close extracts:
    they run (the expiry ended the session under them: each was called back with an error,
    the step lost), they are activity, and the session expires a timeout later with both
    episodes' steps committed."""
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO, config=EXPIRING)
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, "walk north", "go north")
        held = llm.hold("semantic")
        await until_expiry_started(mem, sid)
        with anyio.fail_after(5):
            await held.started.wait()
        results: list[mnemo.OpResult] = []
        await mem.start_episode_async(sid, "explore again", callback=results.append)
        await mem.append_async(sid, "open door", "push door", callback=results.append)
        await mem.close_async(sid, callback=results.append)
        held.release()
        await events.wait_for(lambda e: e.kind == "session_expired")
        assert [(r.ok, r.value) for r in results] == [
            (True, "started"), (True, "appended"), (True, "closed")
        ]
        assert await episodic_indices(mem) == [0, 0]


async def test_a_session_whose_close_outlasts_its_timeout_expires_once_committed(
    llm: FakeLLM, events: EventLog, store: str
) -> None:
    """session_timeout passes while a close extracts: once committed, the session expires (the
    timers skipped it while it extracted and were never woken again: it stayed idle for
    good)."""
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO, config=EXPIRING)
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, "walk north", "go north")
        held = llm.hold("semantic")
        await mem.close(sid)
        with anyio.fail_after(5):
            await held.started.wait()
        record = mem._live.by_id[sid]
        with anyio.fail_after(5):
            while anyio.current_time() < record.last_activity + EXPIRING_AFTER:
                await anyio.wait_all_tasks_blocked()
        held.release()
        event = await events.wait_for(lambda e: e.kind == "session_expired")
        assert event.session_id == sid
        assert await episodic_indices(mem) == [0]


async def test_an_append_is_activity_until_it_returns_from_its_annotation(
    llm: FakeLLM, events: EventLog, store: str
) -> None:
    """session_timeout passes while an append waits for its step's annotation (the step
    stored): the expiry waits for the append, and its idle time runs from the append's
    return, so a close right after is the caller's (the expiry had closed it under them)."""
    timeout = 1.0
    config = mnemo.Config(auto_commit=True, flush_timeout=None, session_timeout=timeout)
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO, config=config)
        sid = await mem.start_session("explore", repo=REPO)
        record = mem._live.by_id[sid]
        held = llm.hold("state")
        async with anyio.create_task_group() as tg:
            tg.start_soon(mem.append, sid, "walk north", "go north")
            with anyio.fail_after(5):
                await held.started.wait()
            with anyio.fail_after(timeout * 5):
                while record.last_activity != math.inf:  # the expiry is due, and waits
                    await anyio.wait_all_tasks_blocked()
            held.release()
        await mem.close(sid)
        assert await mem.session_state(sid) in (mnemo.State.EXTRACTING, mnemo.State.IDLE)
        assert not [e for e in events.events if e.kind == "session_expired"]


async def test_a_read_during_the_closes_commit_loses_no_transition(
    auto_mem: mnemo.Memory, events: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read of the session landing while the close's commit is written leaves the move to
    the close, and so does a reload that takes in the new version and state: the close's
    "transition" event is emitted and the operation queued behind it runs. The read had
    forced the record to idle, the move's event then failed from idle, and the queued
    start_episode never ran nor called back (2 in 100 tries). The read is placed
    there deterministically, right after the write."""
    sid = await auto_mem.start_session("explore", repo=REPO)
    await auto_mem.append(sid, "walk north", "go north")
    live = auto_mem._live
    graph = live.graph
    apply = graph.apply

    async def apply_then_read(*args: object, **kwargs: object) -> object:
        receipt = await apply(*args, **kwargs)  # type: ignore[arg-type]
        if kwargs.get("also"):
            # A read leaves a record this Memory is moving alone (it is the move's to end);
            # a reload from anywhere else takes the stored state in.
            assert await auto_mem.session_state(sid) is mnemo.State.EXTRACTING
            await live.reload(live.by_id[sid])
            assert live.by_id[sid].state is mnemo.State.IDLE
        return receipt

    monkeypatch.setattr(graph, "apply", apply_then_read)
    results: list[mnemo.OpResult] = []
    both = anyio.Event()

    def record(result: mnemo.OpResult) -> None:
        results.append(result)
        if len(results) == 2:
            both.set()

    await auto_mem.close_async(sid, callback=record)
    await auto_mem.start_episode_async(sid, "explore more", callback=record)
    # Waited for by the callbacks: the session is collecting before the close moves it too
    # (waiting for "collecting" returned at once whenever the close had not begun yet).
    with anyio.fail_after(5):
        await both.wait()
    assert [(r.ok, r.value) for r in results] == [(True, "closed"), (True, "started")]
    assert await auto_mem.session_state(sid) is mnemo.State.COLLECTING
    assert events.transitions(sid)[-2:] == [("extracting", "idle"), ("idle", "collecting")]


@pytest.mark.slow
async def test_a_store_fault_at_a_deadline_is_a_warning_and_looked_at_again(
    auto_mem: mnemo.Memory, events: EventLog, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store failing when a flush comes due is logged as a warning and the deadline is
    looked at again later, when the flush goes through. It was logged as a crash of the
    session's background work, with its traceback, at every look (once a second
    while PostgreSQL was down)."""
    config = mnemo.Config(auto_commit=True, flush_timeout=0.2, session_timeout=None)
    sid = await auto_mem.start_session("explore", repo=REPO, config=config)
    live = auto_mem._live
    fetch = live.fetch
    faults = [mnemo.StorageError("unavailable", "the server went away")]

    async def failing_once(session_id: str, *, fresh: bool = False) -> object:
        if fresh and faults:
            raise faults.pop()
        return await fetch(session_id, fresh=fresh)

    await auto_mem.append(sid, "walk north", "go north")
    monkeypatch.setattr(live, "fetch", failing_once)
    with anyio.fail_after(10):
        committed = await events.wait_for(lambda e: e.kind == "trajectory_committed")
    assert committed.data["step_indices"] == [0]
    assert not faults
    assert "timers could not read the store" in caplog.text
    assert "background work crashed" not in caplog.text


async def test_a_boundary_found_by_a_late_annotation_commits_the_trajectory_before_it(
    auto_mem: mnemo.Memory, llm: FakeLLM, events: EventLog
) -> None:
    """Steps stored but not annotated yet (their model slower than append_timeout) belong to
    no trajectory: nothing is committed for them; when the late annotation finds the boundary,
    the trajectory before it is committed in the background, and the close commits the rest,
    each step once."""
    config = mnemo.Config(auto_commit=True, append_timeout=0.3)
    sid = await auto_mem.start_session("explore", repo=REPO, config=config)
    await auto_mem.append(sid, "walk north", "go north")
    await auto_mem.append(sid, "walk east", "go east")
    held = llm.hold("subgoal")
    late = [await auto_mem.append(sid, "open door", "push door"),
            await auto_mem.append(sid, "open window", "push window")]
    assert [(i.index, i.annotated, i.boundary_detected) for i in late] == [
        (2, False, None), (3, False, None)]
    assert await episodic_indices(auto_mem) == []
    held.release()
    event = await events.wait_for(lambda e: e.kind == "trajectory_committed")
    assert js(event.data)["step_indices"] == [0, 1]
    await auto_mem.close_and_commit(sid)
    assert await episodic_indices(auto_mem) == [0, 1, 2, 3]
    assert sorted(extracted_observations(llm)) == sorted(
        ["walk north", "walk east", "open door", "open window"])

