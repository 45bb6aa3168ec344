"""The session state table of the API contract, call by call, and what one append does."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

import mnemo
from mnemo import State
from mnemo.calls.tasks import task_inputs
from tests.backends import sql
from tests.conftest import REPO, Enter
from tests.fakes import EventLog, FakeEmbedder, FakeLLM, js, maybe_await

Call = Callable[[mnemo.Memory, str], Awaitable[object]]

CALLS: dict[str, Call] = {
    "start_episode": lambda mem, sid: mem.start_episode(sid, "a new goal"),
    "append": lambda mem, sid: mem.append(sid, "walk east", "go east"),
    "close": lambda mem, sid: mem.close(sid),
    "commit": lambda mem, sid: mem.commit(sid),
    "discard": lambda mem, sid: mem.discard(sid),
}

REJECTED: list[tuple[State, str, str]] = [
    (State.IDLE, "append", "not_collecting"),
    (State.IDLE, "close", "not_collecting"),
    (State.IDLE, "commit", "not_ready"),
    (State.IDLE, "discard", "not_discardable"),
    (State.COLLECTING, "start_episode", "not_idle"),
    (State.COLLECTING, "commit", "not_ready"),
    (State.COLLECTING, "discard", "not_discardable"),
    *[(State.EXTRACTING, call, "extraction_in_progress") for call in CALLS],
    (State.READY, "start_episode", "not_idle"),
    (State.READY, "append", "not_idle"),
    (State.READY, "close", "not_idle"),
    (State.FAILED, "start_episode", "session_failed"),
    (State.FAILED, "append", "session_failed"),
    (State.FAILED, "close", "session_failed"),
]


async def state_of(mem: mnemo.Memory, sid: str) -> State:
    return await maybe_await(mem.session_state(sid))


@pytest.mark.parametrize(
    ("state", "call", "reason"), REJECTED, ids=[f"{s}-{c}" for s, c, _ in REJECTED]
)
async def test_call_refused_by_state(
    mem: mnemo.Memory, enter: Enter, state: State, call: str, reason: str
) -> None:
    """A call the state table refuses raises SessionError with its reason and leaves the state."""
    sid = await enter(state)
    with pytest.raises(mnemo.SessionError) as caught:
        await CALLS[call](mem, sid)
    assert caught.value.reason == reason
    assert caught.value.state == state
    assert await state_of(mem, sid) == state


async def test_start_session_is_collecting(mem: mnemo.Memory) -> None:
    """start_session returns a "session_" id already collecting an episode with the goal."""
    sid = await mem.start_session("explore the house", repo=REPO)
    assert sid.startswith("session_")
    assert await state_of(mem, sid) == State.COLLECTING
    context = await maybe_await(mem.session_context(sid))
    assert context is not None
    assert context.goal == "explore the house"


async def test_idle_start_episode_collects(mem: mnemo.Memory, enter: Enter) -> None:
    """start_episode in idle starts collecting towards the new goal."""
    sid = await enter(State.IDLE)
    await mem.start_episode(sid, "find the key")
    assert await state_of(mem, sid) == State.COLLECTING
    context = await maybe_await(mem.session_context(sid))
    assert context is not None
    assert context.goal == "find the key"


async def test_collecting_close_extracts(
    mem: mnemo.Memory, llm: FakeLLM, events: EventLog, enter: Enter
) -> None:
    """close in collecting leaves the session extracting, then it becomes ready."""
    sid = await enter(State.COLLECTING)
    await mem.append(sid, "walk north", "go north")
    held = llm.hold("semantic")
    await mem.close(sid)
    assert await state_of(mem, sid) == State.EXTRACTING
    held.release()
    assert await events.wait_state(mem, sid, State.READY, State.FAILED) == State.READY


async def test_ready_commit_goes_idle(mem: mnemo.Memory, events: EventLog, enter: Enter) -> None:
    """commit in ready returns a receipt of node ids, announced on the transition, then idle."""
    sid = await enter(State.READY)
    receipt = await mem.commit(sid)
    assert isinstance(receipt, mnemo.CommitReceipt)
    assert all(isinstance(node_id, str) for node_id in receipt.node_ids)
    assert await state_of(mem, sid) == State.IDLE
    announced = await events.wait_for(
        lambda e: e.kind == "transition" and e.session_id == sid and "node_ids" in e.data
    )
    assert sorted(js(announced.data)["node_ids"]) == sorted(receipt.node_ids)


async def test_ready_discard_goes_idle(mem: mnemo.Memory, enter: Enter) -> None:
    """discard in ready leaves the session idle."""
    sid = await enter(State.READY)
    await mem.discard(sid)
    assert await state_of(mem, sid) == State.IDLE


async def test_failed_discard_goes_idle(mem: mnemo.Memory, enter: Enter) -> None:
    """discard in failed leaves the session idle."""
    sid = await enter(State.FAILED)
    await mem.discard(sid)
    assert await state_of(mem, sid) == State.IDLE


async def test_failed_commit_retries_extraction(
    mem: mnemo.Memory, llm: FakeLLM, events: EventLog, enter: Enter
) -> None:
    """commit in failed returns None with the session extracting again; a success makes it ready."""
    sid = await enter(State.FAILED)
    held = llm.hold("semantic")
    assert await mem.commit(sid) is None
    assert await state_of(mem, sid) == State.EXTRACTING
    held.release()
    assert await events.wait_state(mem, sid, State.READY, State.FAILED) == State.READY


async def test_failed_commit_failing_again_is_failed(
    mem: mnemo.Memory, llm: FakeLLM, events: EventLog, enter: Enter
) -> None:
    """A retried extraction that fails again leaves the session failed."""
    sid = await enter(State.FAILED)
    llm.fail_tasks.add("semantic")
    assert await mem.commit(sid) is None
    assert await events.wait_state(mem, sid, State.READY, State.FAILED) == State.FAILED


async def test_close_while_append_runs(mem: mnemo.Memory, llm: FakeLLM, enter: Enter) -> None:
    """close while an append is annotating raises append_in_progress; the append still lands."""
    sid = await enter(State.COLLECTING)
    held = llm.hold("state")
    appended: list[mnemo.StepInfo] = []

    async def run_append() -> None:
        appended.append(await mem.append(sid, "walk north", "go north"))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_append)
            await held.started.wait()
            with pytest.raises(mnemo.SessionError) as caught:
                await mem.close(sid)
            held.release()
    assert caught.value.reason == "append_in_progress"
    assert caught.value.state == State.COLLECTING
    assert [info.index for info in appended] == [0]
    assert await state_of(mem, sid) == State.COLLECTING


async def test_appends_run_one_at_a_time_in_call_order(
    mem: mnemo.Memory, llm: FakeLLM, enter: Enter
) -> None:
    """A second append waits for the first: it does not annotate meanwhile and comes after it."""
    sid = await enter(State.COLLECTING)
    held = llm.hold("state")
    appended: dict[str, mnemo.StepInfo] = {}

    async def run_append(name: str, observation: str) -> None:
        appended[name] = await mem.append(sid, observation, "go")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_append, "first", "walk north")
            await held.started.wait()
            tg.start_soon(run_append, "second", "walk south")
            await anyio.wait_all_tasks_blocked()
            assert llm.tasks().count("state") == 1
            held.release()
    assert appended["first"].index == 0
    assert appended["second"].index == 1


@pytest.mark.parametrize(
    "call",
    [
        *CALLS,
        "end_session",
        "session_state",
        "session_context",
    ],
)
async def test_ended_session_is_unknown(mem: mnemo.Memory, enter: Enter, call: str) -> None:
    """After end_session every call on the id raises NotFoundError for the session."""
    sid = await enter(State.COLLECTING)
    await mem.end_session(sid)
    make_call = CALLS.get(call) or (lambda mem, sid: maybe_await(getattr(mem, call)(sid)))
    with pytest.raises(mnemo.NotFoundError) as caught:
        await make_call(mem, sid)
    assert caught.value.resource == "session"
    assert caught.value.id == sid


async def test_never_started_session_is_unknown(mem: mnemo.Memory) -> None:
    """A session id that was never started raises NotFoundError for the session."""
    with pytest.raises(mnemo.NotFoundError) as caught:
        await mem.append("session_nope", "walk north", "go north")
    assert caught.value.resource == "session"
    assert caught.value.id == "session_nope"


async def test_start_session_unknown_repo(mem: mnemo.Memory) -> None:
    """start_session on a repo that was never opened raises NotFoundError for the repo."""
    with pytest.raises(mnemo.NotFoundError) as caught:
        await mem.start_session("explore", repo="nope")
    assert caught.value.resource == "repo"
    assert caught.value.id == "nope"


async def test_session_context_idle_is_none(mem: mnemo.Memory, enter: Enter) -> None:
    """session_context is None while the session is idle."""
    sid = await enter(State.IDLE)
    assert await maybe_await(mem.session_context(sid)) is None


async def test_session_context_keeps_last_five_steps(mem: mnemo.Memory, enter: Enter) -> None:
    """session_context gives the goal and the last five steps as "obs -> act", oldest first."""
    sid = await enter(State.COLLECTING)
    for i in range(3):
        await mem.append(sid, f"walk step {i}", f"go {i}")
    context = await maybe_await(mem.session_context(sid))
    assert context is not None
    assert context.goal == "explore the house"
    assert list(context.recent_steps) == [f"walk step {i} -> go {i}" for i in range(3)]
    for i in range(3, 7):
        await mem.append(sid, f"walk step {i}", f"go {i}")
    context = await maybe_await(mem.session_context(sid))
    assert context is not None
    assert list(context.recent_steps) == [f"walk step {i} -> go {i}" for i in range(2, 7)]


async def test_recall_in_context_reports_its_session(
    mem: mnemo.Memory, events: EventLog, enter: Enter
) -> None:
    """recall_in_context's "recall_executed" names the session it ran for (it had None), the
    query it ran (goal and last steps added); a plain recall names none."""
    sid = await enter(State.COLLECTING)
    await mem.append(sid, "walk north", "go north")
    await mem.recall_in_context(REPO, sid, "where")
    await mem.recall(REPO, "where")
    recalls = [e for e in events.events if e.kind == "recall_executed"]
    assert [(e.session_id, e.repo) for e in recalls] == [(sid, REPO), (None, REPO)]
    assert recalls[0].data["query"] == "where\nexplore the house\nwalk north -> go north"


async def test_empty_episode_commits_nothing(
    mem: mnemo.Memory, events: EventLog, enter: Enter
) -> None:
    """Closing an episode with no steps is valid and its commit receipt has no node ids."""
    sid = await enter(State.COLLECTING)
    await mem.close(sid)
    assert await events.wait_state(mem, sid, State.READY, State.FAILED) == State.READY
    receipt = await mem.commit(sid)
    assert receipt is not None
    assert receipt.node_ids == []
    assert await state_of(mem, sid) == State.IDLE


async def test_close_and_commit_nodes_are_stored(mem: mnemo.Memory, enter: Enter) -> None:
    """close_and_commit returns a receipt whose node ids can be read back, and ends idle."""
    sid = await enter(State.COLLECTING)
    await mem.append(sid, "walk north", "go north")
    await mem.append(sid, "open door", "push door")
    with anyio.fail_after(5):
        receipt = await mem.close_and_commit(sid)
    assert receipt.node_ids
    for node_id in receipt.node_ids:
        node = await mem.get_node(REPO, node_id)
        assert node is not None
        assert node.id == node_id
    assert await state_of(mem, sid) == State.IDLE


async def test_close_and_commit_of_a_failed_session_without_retries_says_it_failed_before(
    mem: mnemo.Memory, enter: Enter
) -> None:
    """`max_retries=0` on a failed session runs no extraction: the error says the extraction
    failed before the call (it said "failed 0 times in this call"); the session stays failed."""
    sid = await enter(State.FAILED)
    with pytest.raises(mnemo.PipelineError, match="failed before this call, last: ") as caught:
        await mem.close_and_commit(sid, max_retries=0)
    assert "0 times" not in str(caught.value)
    assert await state_of(mem, sid) == State.FAILED


async def test_step_indices_count_from_zero(mem: mnemo.Memory, enter: Enter) -> None:
    """Each append returns a StepInfo whose index counts 0, 1, 2 within the episode."""
    sid = await enter(State.COLLECTING)
    infos = [await mem.append(sid, f"walk step {i}", f"go {i}") for i in range(3)]
    assert all(isinstance(info, mnemo.StepInfo) for info in infos)
    assert [info.index for info in infos] == [0, 1, 2]


async def test_subgoal_change_starts_trajectory(
    mem: mnemo.Memory, embedder: FakeEmbedder, enter: Enter
) -> None:
    """A new subgoal is a boundary with a new trajectory id; the same subgoal keeps the id."""
    assert embedder.axis("walk") != embedder.axis("open")
    sid = await enter(State.COLLECTING)
    walk_1 = await mem.append(sid, "walk north", "go north")
    walk_2 = await mem.append(sid, "walk south", "go south")
    open_1 = await mem.append(sid, "open door", "push door")
    open_2 = await mem.append(sid, "open window", "push window")
    assert not walk_2.boundary_detected
    assert walk_2.trajectory_id == walk_1.trajectory_id
    assert open_1.boundary_detected
    assert open_1.trajectory_id != walk_2.trajectory_id
    assert not open_2.boundary_detected
    assert open_2.trajectory_id == open_1.trajectory_id


async def episode_steps(mem: mnemo.Memory, sid: str) -> list[tuple[str, bool]]:
    """The open episode's steps as the store holds them: (line, annotated)."""
    return [(s.line, s.annotated) for s in (await mem.episodes(sid))[-1].steps]


@pytest.mark.parametrize("task", ["state", "subgoal"])
async def test_an_append_whose_llm_fails_raises_and_adds_no_step(
    mem: mnemo.Memory, llm: FakeLLM, enter: Enter, store: str, task: str
) -> None:
    """The contract: an append whose LLM fails raises LLMError (the adapter's exception as
    `__cause__`), adds no step, in the store too, and leaves the session collecting; the
    next append takes the free index and is annotated as usual."""
    sid = await enter(State.COLLECTING)
    await mem.append(sid, "walk north", "go north")
    llm.fail_tasks.add(task)
    with pytest.raises(mnemo.LLMError) as caught:
        await mem.append(sid, "walk lost", "go lost")
    assert caught.value.__cause__ in llm.raised
    assert await state_of(mem, sid) == State.COLLECTING
    context = await maybe_await(mem.session_context(sid))
    assert context is not None
    assert context.recent_steps == ["walk north -> go north"]
    assert await episode_steps(mem, sid) == [("walk north -> go north", True)]
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as other:
        assert await episode_steps(other, sid) == [("walk north -> go north", True)]
    llm.fail_tasks.discard(task)
    info = await mem.append(sid, "walk south", "go south")
    assert (info.index, info.annotated, info.boundary_detected) == (1, True, False)
    assert await episode_steps(mem, sid) == [("walk north -> go north", True),
                                             ("walk south -> go south", True)]


async def test_an_append_whose_model_timed_out_keeps_its_step(
    mem: mnemo.Memory, llm: FakeLLM, enter: Enter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model call that gave up on time (the adapter's LLMTimeout, after its retries) is a
    timeout, not a failure: the append returns its step kept and unannotated, and the close
    annotates it once the model answers."""
    sid = await enter(State.COLLECTING)
    answer = llm.generate

    async def timed_out(request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        if request.task == "state":
            raise mnemo.LLMTimeout("no reply within 1 s, after 3 attempts")
        return await answer(request)

    monkeypatch.setattr(llm, "generate", timed_out)
    info = await mem.append(sid, "walk north", "go north")
    assert (info.index, info.annotated) == (0, False)
    assert await episode_steps(mem, sid) == [("walk north -> go north", False)]
    monkeypatch.setattr(llm, "generate", answer)
    await mem.close_and_commit(sid)
    assert await episode_steps(mem, sid) == [("walk north -> go north", True)]


async def test_an_append_whose_embedder_fails_raises_and_adds_no_step(
    mem: mnemo.Memory, embedder: FakeEmbedder, enter: Enter
) -> None:
    """An append whose embedder fails raises EmbeddingError and adds no step; the close
    commits the steps that were added."""
    sid = await enter(State.COLLECTING)
    await mem.append(sid, "walk north", "go north")
    embedder.fail = True
    # A new subgoal ("look"), so no implementation can reuse an earlier embedding.
    with pytest.raises(mnemo.EmbeddingError) as caught:
        await mem.append(sid, "look around", "stare")
    assert caught.value.__cause__ in embedder.raised
    assert await state_of(mem, sid) == State.COLLECTING
    embedder.fail = False
    receipt = await mem.close_and_commit(sid)
    steps = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
    assert [n.text for n in steps if "look around" in n.text] == []
    assert any("walk north" in n.text for n in steps)
    assert receipt.node_ids


class _FailsOn(FakeLLM):
    """Fails the "state" task of the step whose observation is `observation`, once released."""

    def __init__(self, observation: str) -> None:
        super().__init__()
        self.observation = observation
        self.gate = anyio.Event()

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        if request.task == "state" and task_inputs(request).get("observation") == (
                self.observation):
            await self.gate.wait()
            raise RuntimeError(f"boom for {self.observation}")
        return await super().generate(request)


async def test_an_earlier_kept_steps_failure_takes_no_later_append_back(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step kept past `append_timeout` whose annotation fails later fails no other append:
    the append waiting behind it keeps its step (annotated later), nothing is raised or
    removed. Before, the later append raised the earlier step's error and lost its step."""
    llm = _FailsOn("walk A")
    config = mnemo.Config(append_timeout=1.0)
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO, config=config)
        sid = await mem.start_session("explore the house", repo=REPO)
        await mem.append(sid, "walk north", "go north")
        assert not (await mem.append(sid, "walk A", "go A")).annotated
        stored, add = anyio.Event(), mem._sessions_store.add_step

        async def add_step(*args: Any, **kwargs: Any) -> int:
            version = await add(*args, **kwargs)
            stored.set()
            return version

        monkeypatch.setattr(mem._sessions_store, "add_step", add_step)
        got: list[mnemo.StepInfo] = []

        async def append_b() -> None:
            got.append(await mem.append(sid, "walk B", "go B"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(append_b)
            await stored.wait()
            llm.gate.set()  # A's annotation fails while B's append waits behind it
        assert [(i.index, i.annotated) for i in got] == [(2, False)]
        assert [line for line, _ in await episode_steps(mem, sid)] == [
            "walk north -> go north", "walk A -> go A", "walk B -> go B"]


async def test_an_append_waiting_when_the_session_ends_raises_no_older_failure(
    mem: mnemo.Memory, llm: FakeLLM, enter: Enter, store: str
) -> None:
    """An append still waiting when `end_session` cancels the annotation raises no failure of
    an earlier append's, and removes no step of the ended session. Before, it raised that
    earlier LLMError and deleted its own step from the ended session."""
    sid = await enter(State.COLLECTING)
    await mem.append(sid, "walk north", "go north")
    llm.fail_tasks.add("state")
    with pytest.raises(mnemo.LLMError):
        await mem.append(sid, "walk lost", "go lost")
    llm.fail_tasks.discard("state")
    held = llm.hold("state")
    outcome: list[object] = []

    async def third() -> None:
        try:
            outcome.append(await mem.append(sid, "walk east", "go east"))
        except mnemo.MnemoError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(third)
        with anyio.fail_after(5):
            await held.started.wait()
        await mem.end_session(sid)
    held.release()
    assert not any(isinstance(o, mnemo.LLMError) for o in outcome), outcome
    rows = await sql(mem, "SELECT observation FROM steps WHERE session_id = ? ORDER BY idx", sid)
    assert [r[0] for r in rows] == ["walk north", "walk east"]


async def test_an_embedder_timeout_keeps_the_step(
    mem: mnemo.Memory, embedder: FakeEmbedder, enter: Enter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An embedder that times out is the model not answering in time: the step is kept
    (`annotated=False`), as for an LLM's timeout; only a failure takes it back."""
    sid = await enter(State.COLLECTING)

    async def slow(texts: object) -> object:
        raise TimeoutError("the embedder took too long")

    monkeypatch.setattr(embedder, "embed", slow)
    info = await mem.append(sid, "look around", "stare")
    assert (info.index, info.annotated) == (0, False)
    assert [line for line, _ in await episode_steps(mem, sid)] == ["look around -> stare"]


async def test_unparsable_reward_does_not_fail_append(
    mem: mnemo.Memory, llm: FakeLLM, enter: Enter
) -> None:
    """A reward reply that cannot be parsed (scored 0.5) does not fail the append."""
    sid = await enter(State.COLLECTING)
    llm.garbage_tasks.add("reward")
    first = await mem.append(sid, "walk north", "go north")
    second = await mem.append(sid, "walk south", "go south")
    assert "reward" in llm.tasks()
    assert [first.index, second.index] == [0, 1]


@pytest.mark.slow
async def test_append_timeout(mem: mnemo.Memory, llm: FakeLLM) -> None:
    """An append running past append_timeout returns its stored step unannotated; the model's
    late answer annotates it in the background, and the next append comes after it. The
    timeout is long enough for the next append to finish within it on a busy machine."""
    sid = await mem.start_session(
        "explore the house", repo=REPO, config=mnemo.Config(append_timeout=0.5)
    )
    held = llm.hold("state")
    with anyio.fail_after(5):
        slow = await mem.append(sid, "walk north", "go north")
    assert slow == mnemo.StepInfo(0, None, None, annotated=False)
    assert held.started.is_set()
    assert await state_of(mem, sid) == State.COLLECTING
    held.release()
    info = await mem.append(sid, "walk south", "go south")
    assert (info.index, info.annotated, info.boundary_detected) == (1, True, False)
    assert await episode_steps(mem, sid) == [("walk north -> go north", True),
                                             ("walk south -> go south", True)]


async def test_auto_commit_close_ends_idle(auto_mem: mnemo.Memory, events: EventLog) -> None:
    """In auto-commit, close extracts and commits what is left and ends idle, never ready."""
    sid = await auto_mem.start_session("explore the house", repo=REPO)
    await auto_mem.append(sid, "walk north", "go north")
    await auto_mem.close(sid)
    assert await events.wait_state(auto_mem, sid, State.IDLE, State.FAILED) == State.IDLE
    assert all(to != State.READY for _, to in events.transitions(sid))
