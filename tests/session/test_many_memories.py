"""Several `Memory` objects on one store in one process (the API contract, "Storage backends and
many processes"): the store is the one truth, so a session or a repo made through one is known to
every other, appends are serialised, a closed episode is committed once, reads never write,
an accepted async operation calls back where it was accepted, and only a Memory with the
work's model resumes it.

Each Memory has its own fakes and event log, as a separate worker would. The tests marked
xfail stated the contract before its mechanism existed; none is left.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

import mnemo
from mnemo import State
from mnemo.session import machine, operations, timers, transitions
from mnemo.session.machine import Op, SessionRecord
from mnemo.session.ports import StaleSession, StoredOp
from mnemo.session.registry import Sessions
from tests.backends import sql
from tests.fakes import Callbacks, EventLog, FakeEmbedder, FakeLLM, Hold, extracted_observations

REPO = "r"
STEPS = [("walk north", "go north"), ("walk east", "go east"), ("walk south", "go south")]
# The rows a read could change: everything a session, its work or a commit writes.
TABLES = ["repos", "sessions", "episodes", "steps", "changesets", "task_results", "nodes",
          "links", "applied_changesets"]


@dataclass
class Worker:
    """One Memory with its own fakes, as one worker process of an app would hold it."""

    mem: mnemo.Memory
    llm: FakeLLM = field(default_factory=FakeLLM)
    events: EventLog = field(default_factory=EventLog)


class OtherLLM(FakeLLM):
    """The fake's answers under another model's name."""

    name = "other:model"


@asynccontextmanager
async def workers(
    store: str, n: int, *, open_repo: bool = True, llm: FakeLLM | None = None
) -> AsyncIterator[list[Worker]]:
    """`n` Memory objects open on `store` at once (each with repo "r" unless told not to)."""
    async with AsyncExitStack() as stack:
        opened: list[Worker] = []
        for _ in range(n):
            opened.append(await open_worker(stack, store, open_repo=open_repo, llm=llm))
        try:
            yield opened
        finally:
            for worker in opened:
                worker.llm.release_all()


async def open_worker(
    stack: AsyncExitStack, store: str, *, open_repo: bool = True, llm: FakeLLM | None = None,
    config: mnemo.Config | None = None,
) -> Worker:
    """A Memory entered on `stack` (closed with it)."""
    chosen = llm if llm is not None else FakeLLM()
    events = EventLog()
    mem = await stack.enter_async_context(
        mnemo.Memory(store, llm=chosen, embedder=FakeEmbedder(), on_event=events, config=config)
    )
    if open_repo:
        await mem.open_repo(REPO)
    return Worker(mem, chosen, events)


async def extracting(worker: Worker, sid: str) -> Hold:
    """Closes the session through `worker`, whose extraction then waits at its semantic call
    until the returned hold is released."""
    held = worker.llm.hold("semantic")
    await worker.mem.close(sid)
    with anyio.fail_after(5):
        await held.started.wait()
    return held


class Called:
    """A callback that keeps its results and sets `done` at the first."""

    def __init__(self) -> None:
        self.results: list[mnemo.OpResult] = []
        self.done = anyio.Event()

    def __call__(self, result: mnemo.OpResult) -> None:
        self.results.append(result)
        self.done.set()


async def fill(mem: mnemo.Memory) -> str:
    """A session in repo "r" collecting its first episode, with the three STEPS."""
    sid = await mem.start_session("explore the house", repo=REPO)
    for observation, action in STEPS:
        await mem.append(sid, observation, action)
    return sid


async def ready(worker: Worker, sid: str) -> None:
    """Closes the session through `worker` and waits for its extraction there to end: READY,
    then the stored operations it takes on (`operations.run_stored`) taken."""
    await worker.mem.close(sid)
    landed = await worker.events.wait_state(worker.mem, sid, State.READY, State.FAILED)
    assert landed is State.READY
    record = worker.mem._live.by_id.get(sid)
    with anyio.fail_after(5):
        while record is not None and record.handing_over:
            await record.changed.wait()


async def node_texts(mem: mnemo.Memory) -> Counter[str]:
    """How many times each SEMANTIC and PROCEDURAL node's text is in repo "r"."""
    nodes = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC, mnemo.NodeType.PROCEDURAL])
    return Counter(node.text for node in nodes)


async def rows(mem: mnemo.Memory) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the tables a session writes, in a stable order."""
    return {table: sorted(await sql(mem, f"SELECT * FROM {table}"), key=repr) for table in TABLES}


async def test_a_session_started_in_one_is_known_to_the_others(store: str) -> None:
    """A session started through A is seen and driven through B and C: state, context,
    appends, close and commit, each seen at once through the others."""
    async with workers(store, 3) as (a, b, c):
        sid = await a.mem.start_session("explore the house", repo=REPO)
        for other in (b, c):
            assert await other.mem.session_state(sid) is State.COLLECTING
            context = await other.mem.session_context(sid)
            assert context is not None
            assert context.goal == "explore the house"
        assert (await b.mem.append(sid, "walk north", "go north")).index == 0
        assert (await c.mem.append(sid, "walk east", "go east")).index == 1
        context = await a.mem.session_context(sid)
        assert context is not None
        assert context.recent_steps == ["walk north -> go north", "walk east -> go east"]
        assert [(s.id, s.steps) for s in await c.mem.list_sessions()] == [(sid, 2)]
        await ready(b, sid)
        assert await a.mem.session_state(sid) is State.READY
        receipt = await c.mem.commit(sid)
        assert receipt is not None
        for worker in (a, b, c):
            assert await worker.mem.session_state(sid) is State.IDLE
        assert await node_texts(a.mem) == Counter(
            {"fact: walk north": 1, "fact: walk east": 1, "go north": 1, "go east": 1}
        )


async def test_a_repo_opened_by_one_is_known_to_another(store: str) -> None:
    """A repo opened through A after B opened is listed by B, and B can start sessions in
    it with the repo's models."""
    async with workers(store, 2, open_repo=False) as (a, b):
        await a.mem.open_repo(REPO)
        assert await b.mem.list_repos() == [REPO]
        sid = await b.mem.start_session("explore the house", repo=REPO)
        assert await a.mem.session_state(sid) is State.COLLECTING


async def test_every_call_of_another_memory_knows_a_repo_opened_by_one(store: str) -> None:
    """A repo opened through A after B opened is B's too for every call that names a repo,
    not only for sessions: each used to raise NotFoundError("repo") in B."""
    trajectory = mnemo.Trajectory("explore", [mnemo.Step("walk north", "go north")])
    calls: dict[str, Any] = {
        "recall": lambda mem: mem.recall(REPO, "walk north"),
        "ingest": lambda mem: mem.ingest(REPO, trajectory, source_id="s1"),
        "forget": lambda mem: mem.forget(REPO, "unknown source"),
        "get_nodes_by_type": lambda mem: mem.get_nodes_by_type(REPO, list(mnemo.NodeType)),
        "latest": lambda mem: mem.latest(REPO, top_k=3),
        "consolidate": lambda mem: mem.consolidate(REPO),
        "decay": lambda mem: mem.decay(REPO),
        "validate_episodic": lambda mem: mem.validate_episodic(REPO),
        "history": lambda mem: mem.history(REPO),
    }
    for name, call in calls.items():
        async with workers(store, 2, open_repo=False) as (a, b):
            await a.mem.open_repo(REPO)
            await a.mem.ingest(REPO, trajectory, source_id=f"before {name}")
            await call(b.mem)  # raises if B does not know the repo
    async with workers(store, 1, open_repo=False) as (only,):
        with pytest.raises(mnemo.NotFoundError):
            await only.mem.recall("no such repo", "walk north")


async def test_recall_in_context_bounds_its_query_by_the_repos_config(store: str) -> None:
    """A repo opened through A with max_text_chars=5000 takes a 500-character query through
    B (whose own config allows 100) in recall_in_context as in recall: the repo is learned
    before its bound is read (B checked the query against its own 100)."""
    async with (
        mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as a,
        mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder(),
                     config=mnemo.Config(max_text_chars=100)) as b,
    ):
        await a.open_repo(REPO, config=mnemo.Config(max_text_chars=5000))
        query = "walk north " * 50
        await b.recall_in_context(REPO, "no such session", query)  # first: B knows no repo
        await b.recall(REPO, query)


async def test_an_append_stored_before_a_close_through_another_memory_lands(
    store: str,
) -> None:
    """An append through A, its step stored and its annotation held, while B closes the
    session: the step landed before the close (durable first), so B's close waits for A's
    annotation of it (A holds its claim) and extracts both steps; A's append returns it
    annotated."""
    async with workers(store, 2) as (a, b):
        sid = await a.mem.start_session("explore the house", repo=REPO)
        await a.mem.append(sid, "walk north", "go north")
        held = a.llm.hold("state")
        infos: list[mnemo.StepInfo] = []

        async def append() -> None:
            infos.append(await a.mem.append(sid, "walk east", "go east"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(append)
            with anyio.fail_after(5):
                await held.started.wait()
            await b.mem.close(sid)
            held.release()
        assert [(i.index, i.annotated) for i in infos] == [(1, True)]
        landed = await b.events.wait_state(b.mem, sid, State.READY, State.FAILED)
        assert landed is State.READY
        assert "state" not in b.llm.tasks()  # A's step was annotated by A alone
        assert extracted_observations(b.llm) == ["walk north", "walk east"]


async def test_a_write_that_finds_the_session_moved_tries_until_the_busy_timeout(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close whose write finds the session moved six times in a row (another Memory
    appending in a loop) reads it again and tries until `busy_timeout`, waiting a little
    between: it lands (it gave up `busy` after three tries, in about 40 ms); past the
    timeout it is `busy`, saying for how long."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store, config=mnemo.Config(busy_timeout=0.6))
        real_hold = transitions.hold
        moved = [6]

        async def hold(*args: Any, **kwargs: Any) -> bool:
            if moved[0] > 0:
                moved[0] -= 1
                return False
            return await real_hold(*args, **kwargs)

        monkeypatch.setattr(transitions, "hold", hold)
        sid = await a.mem.start_session("explore the house", repo=REPO)
        await a.mem.append(sid, "walk north", "go north")
        await a.mem.close(sid)
        assert moved == [0]
        assert await a.mem.session_state(sid) in (State.EXTRACTING, State.READY)

        other = await a.mem.start_session("explore the garden", repo=REPO)
        await a.mem.append(other, "walk east", "go east")
        moved[0] = 10**6
        with pytest.raises(mnemo.StorageError, match=r"kept moving it for 0\.6 s") as refused:
            await a.mem.close(other)
        assert refused.value.reason == "busy"


async def test_appends_through_several_memories_are_serialised(store: str) -> None:
    """Appends racing through A, B and C to one session all land, with unique, contiguous
    indexes, and the stored episode holds every one."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        sid = await a.mem.start_session("explore the house", repo=REPO)
        # B and C open after the session exists: they know it from the store even today, so
        # what this test checks is the serialisation alone.
        b = await open_worker(stack, store)
        c = await open_worker(stack, store)
        indexes: list[int] = []
        outcomes: list[BaseException] = []

        async def append_all(worker: Worker, name: str) -> None:
            for i in range(4):
                try:
                    info = await worker.mem.append(sid, f"walk {name}{i}", f"go {name}{i}")
                except mnemo.MnemoError as exc:
                    outcomes.append(exc)
                else:
                    indexes.append(info.index)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for worker, name in ((a, "a"), (b, "b"), (c, "c")):
                    tg.start_soon(append_all, worker, name)
        assert outcomes == []
        assert sorted(indexes) == list(range(12))
        (episode,) = await a.mem.episodes(sid)
        assert sorted(step.index for step in episode.steps) == list(range(12))
        assert {step.observation for step in episode.steps} == {
            f"walk {name}{i}" for name in "abc" for i in range(4)
        }


async def test_a_session_closed_in_one_and_committed_in_another_is_committed_once(
    store: str,
) -> None:
    """A closes, B commits; then A's commit changes nothing and says so (not_ready), and
    every fact is in the repo once."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        sid = await fill(a.mem)
        await ready(a, sid)
        b = await open_worker(stack, store)
        receipt = await b.mem.commit(sid)
        assert receipt is not None
        before = await rows(a.mem)
        with pytest.raises(mnemo.SessionError) as caught:
            await a.mem.commit(sid)
        assert caught.value.reason == "not_ready"
        assert await rows(a.mem) == before
        assert await a.mem.session_state(sid) is State.IDLE
        assert set((await node_texts(b.mem)).values()) == {1}


async def test_a_session_committed_through_another_is_never_committed_again(store: str) -> None:
    """The issue's case: B brings back A's live session and commits it; A's append and close
    are then refused (the session is idle) and no fact is in the repo twice."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        sid = await fill(a.mem)
        b = await open_worker(stack, store)
        await b.mem.close_and_commit(sid)
        with pytest.raises(mnemo.SessionError) as refused_append:
            await a.mem.append(sid, "walk west", "go west")
        assert refused_append.value.reason == "not_collecting"
        with pytest.raises(mnemo.SessionError) as refused_close:
            await a.mem.close(sid)
        assert refused_close.value.reason == "not_collecting"
        with pytest.raises(mnemo.SessionError) as not_ready:
            await a.mem.commit(sid)
        assert not_ready.value.reason == "not_ready"
        texts = await node_texts(b.mem)
        assert texts["fact: walk north"] == 1
        assert set(texts.values()) == {1}


async def test_reads_through_another_memory_never_write(store: str) -> None:
    """session_state, session_context, list_sessions, episodes and latest through B, on
    sessions A holds collecting, extracting and ready, leave every row as it was, and B
    does none of A's work. A's lease is long: its heartbeat, which rewrites the lease of
    what it holds every third of it, would otherwise change a row during a slow run."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store, config=mnemo.Config(lease_timeout=3600))
        collecting = await fill(a.mem)
        ready_sid = await fill(a.mem)
        await ready(a, ready_sid)
        extracting = await fill(a.mem)
        held = a.llm.hold("semantic")
        await a.mem.close(extracting)
        with anyio.fail_after(5):
            await held.started.wait()
        before = await rows(a.mem)
        # B's model is A's: were B to take A's live work, its LLM would be asked (and held).
        b_llm = FakeLLM()
        b_held = b_llm.hold("semantic")
        b = await open_worker(stack, store, llm=b_llm)
        for sid in (collecting, extracting, ready_sid):
            await b.mem.session_state(sid)
            await b.mem.session_context(sid)
            await b.mem.episodes(sid)
        listed = await b.mem.list_sessions()
        await b.mem.latest(REPO)
        assert {(s.id, s.state) for s in listed} == {
            (collecting, State.COLLECTING), (extracting, State.EXTRACTING),
            (ready_sid, State.READY),
        }
        assert not b_held.started.is_set()
        assert "semantic" not in b_llm.tasks()
        assert await rows(b.mem) == before


def the_holder_takes_first(
    monkeypatch: pytest.MonkeyPatch, accepting: Worker, holder: Worker
) -> None:
    """The stored operations `accepting` stored while `holder` extracts go to `holder`: the
    accepting Memory's watcher takes only once the holder has. When an extraction ends, its
    holder and the watcher both take (`operations.run_stored`), and either may win: one runs
    them, once, which is right both ways. A test of what the holder does with them was left
    to that race and lost it under load (CI: the watcher took the commit whose
    result was to meet the holder's store fault)."""
    took = anyio.Event()
    holder_take = holder.mem._backend.coordination.take_ops
    accepting_take = accepting.mem._backend.coordination.take_ops

    async def holder_takes(*args: Any) -> list[StoredOp]:
        try:
            return await holder_take(*args)
        finally:
            took.set()

    async def accepting_takes(*args: Any) -> list[StoredOp]:
        with anyio.fail_after(10):  # the holder never took: a test failure, not a hang
            await took.wait()
        return await accepting_take(*args)

    monkeypatch.setattr(holder.mem._backend.coordination, "take_ops", holder_takes)
    monkeypatch.setattr(accepting.mem._backend.coordination, "take_ops", accepting_takes)


async def test_an_operation_accepted_while_this_memory_annotates_and_another_extracts_runs(
    store: str,
) -> None:
    """Regression: A's step is still being annotated (its own task on the session) when B
    closes and extracts the session; a commit accepted through A was taken as queued behind an
    extraction of A's, kept in A's queue, never run, never called back. It is stored for B's
    extraction, runs there, and calls back in A."""
    config = mnemo.Config(append_timeout=0.5)
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store, config=config)
        b = await open_worker(stack, store, config=config)
        sid = await a.mem.start_session("explore the house", repo=REPO)
        await a.mem.append(sid, *STEPS[0])
        annotation = a.llm.hold("state")
        info = await a.mem.append(sid, *STEPS[1])
        assert not info.annotated  # its annotation goes on in A
        held = b.llm.hold("semantic")
        await b.mem.close(sid)  # B extracts, once A's annotation is over
        callback = Called()
        await a.mem.commit_async(sid, callback)
        annotation.release()
        with anyio.fail_after(10):
            await held.started.wait()
        held.release()
        with anyio.fail_after(10):
            await callback.done.wait()
        assert callback.results == [mnemo.OpResult(ok=True, value="committed", error=None)]
        assert await b.mem.session_state(sid) is State.IDLE


@pytest.mark.slow
@pytest.mark.parametrize("finish_faults", [0, 1, 4], ids=["", "finish-fault", "past-budget"])
async def test_an_async_operation_calls_back_where_it_was_accepted(
    store: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    finish_faults: int,
) -> None:
    """A commit accepted through A while B extracts the session runs when B's extraction
    ends and calls back in A, with the commit's result. A fault when B stores that result
    is tried again (the result was lost, and A waited for it for good), and so are faults
    past `FINISH_BUDGET`, in the background (B gave up after it, and A waited for good)."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        sid = await fill(a.mem)
        b = await open_worker(stack, store)
        held = await extracting(b, sid)
        callback = Called()
        await a.mem.commit_async(sid, callback)
        coordination = b.mem._backend.coordination
        finish_op = coordination.finish_op
        faults = [mnemo.StorageError("unavailable", "the store is away")] * finish_faults
        if finish_faults > 1:  # their pauses, 0.05 + 0.1 + 0.2 + 0.4 s, outlast this budget
            monkeypatch.setattr(operations, "FINISH_BUDGET", 0.05)

        async def failing(op_id: str, result: Any) -> None:
            if faults:
                raise faults.pop()
            await finish_op(op_id, result)

        monkeypatch.setattr(coordination, "finish_op", failing)
        the_holder_takes_first(monkeypatch, a, b)
        held.release()
        with anyio.fail_after(10):
            await callback.done.wait()
        assert callback.results == [mnemo.OpResult(ok=True, value="committed", error=None)]
        assert faults == []  # the fault, if any, was met
        still_trying = [r for r in caplog.records if "still trying" in r.getMessage()]
        assert len(still_trying) == (1 if finish_faults > 1 else 0)  # in the background
        assert await b.mem.session_state(sid) is State.IDLE
        assert set((await node_texts(b.mem)).values()) == {1}
        assert "semantic" not in a.llm.tasks()
        assert await sql(b.mem, "SELECT id FROM ops") == []  # nobody is left to call back


async def test_an_answer_for_a_memory_that_only_accepted_an_operation_is_kept_for_it(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C, which did nothing but accept a commit while B extracts, gets its callback though
    B's takeover look runs between B storing the answer and C's watcher reading it: C
    records itself as a holder when it stores the operation, so the look keeps the answer
    for it."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        sid = await fill(a.mem)
        b = await open_worker(stack, store)
        held = await extracting(b, sid)
        c = await open_worker(stack, store)
        callback = Called()
        await c.mem.commit_async(sid, callback)
        looked = anyio.Event()
        watched = c.mem._backend.coordination
        token = watched.change_token

        async def after_the_look() -> int:
            await looked.wait()
            return await token()

        monkeypatch.setattr(watched, "change_token", after_the_look)
        answered = anyio.Event()
        storing = b.mem._backend.coordination
        finish_op = storing.finish_op

        async def finishing(op_id: str, result: Any) -> None:
            await finish_op(op_id, result)
            answered.set()

        monkeypatch.setattr(storing, "finish_op", finishing)
        held.release()
        with anyio.fail_after(10):
            await answered.wait()
        await timers.take_over(b.mem._live)
        looked.set()
        with anyio.fail_after(10):
            await callback.done.wait()
        assert callback.results == [mnemo.OpResult(ok=True, value="committed", error=None)]


async def test_a_memory_is_entered_once(store: str) -> None:
    """Entering a Memory again, open or closed, is StorageError("closed") and leaves it as it
    was (its parts, the word index and the connection pool among them, open once); a new
    Memory opens the store again and goes on."""
    mem = mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder())
    async with mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("explore", repo=REPO)
        with pytest.raises(mnemo.StorageError, match="opens once") as nested:
            await mem.__aenter__()
        assert nested.value.reason == "closed"
        await mem.append(sid, "walk north", "go north")
    with pytest.raises(mnemo.StorageError, match="opens once"):
        async with mem:
            pass
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as again:
        await again.append(sid, "walk east", "go east")
        await again.close_and_commit(sid)
        assert (await again.recall(REPO, "walk north")).memories


async def test_the_times_a_memory_compares_with_others_are_the_stores(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stored operation's acceptance (the order stored operations run in) and a session's
    last use as the timers put it on the event loop's clock are read from the store's clock
    (`Coordination.now`), as leases and heartbeats are, never from the host's. Here the
    store's clock reads an hour behind this host."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        sid = await fill(a.mem)
        b = await open_worker(stack, store)
        held = await extracting(b, sid)
        behind = timedelta(hours=1)
        monkeypatch.setattr(a.mem._backend.coordination, "now",
                            lambda: datetime.now(UTC) - behind)
        callback = Called()
        await a.mem.commit_async(sid, callback)
        [(accepted,)] = await sql(b.mem, "SELECT created_at FROM ops")
        assert abs(datetime.fromisoformat(accepted) - (datetime.now(UTC) - behind)) < timedelta(
            minutes=1)
        live = a.mem._live
        five_ago = live.clock_of(datetime.now(UTC) - behind - timedelta(seconds=5))
        assert abs(five_ago - (anyio.current_time() - 5)) < 1
        held.release()
        with anyio.fail_after(10):
            await callback.done.wait()
        assert callback.results[0].ok


async def test_a_failure_run_in_another_memory_calls_back_with_its_cause(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append accepted through A, run by B (which held the extraction) and failed by B's
    store: A's callback gets operation_failed with the StorageError as its cause, named (the
    cause was lost on the way through the store)."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        sid = await fill(a.mem)
        b = await open_worker(stack, store)
        held = await extracting(b, sid)
        called = {name: Called() for name in ["commit", "start", "append"]}
        await a.mem.commit_async(sid, called["commit"])
        await a.mem.start_episode_async(sid, "next", called["start"])
        await a.mem.append_async(sid, "walk west", "go west", called["append"])

        async def refused(*args: object, **kwargs: object) -> int:
            raise mnemo.StorageError("busy", "the step's write was refused")

        monkeypatch.setattr(b.mem._sessions_store, "add_step", refused)
        the_holder_takes_first(monkeypatch, a, b)
        held.release()
        with anyio.fail_after(10):
            for callback in called.values():
                await callback.done.wait()
        assert [c.results[0].value for c in called.values()] == ["committed", "started", None]
        [failed] = called["append"].results
        assert failed.error is not None
        assert failed.error.reason == "operation_failed"
        assert isinstance(failed.error.__cause__, mnemo.MnemoError)
        assert "StorageError" in str(failed.error.__cause__)
        assert "refused" in str(failed.error.__cause__)


async def test_end_session_calls_back_the_operations_it_stored_for_another(store: str) -> None:
    """B accepts a commit while A extracts (stored with the session), then B ends the
    session: B's callback gets session_ended once (the watcher was cancelled and nothing
    called it back)."""
    async with workers(store, 2) as (a, b):
        sid = await fill(a.mem)
        held = await extracting(a, sid)
        callback = Called()
        await b.mem.commit_async(sid, callback)
        await b.mem.end_session(sid)
        with anyio.fail_after(5):
            await callback.done.wait()
        held.release()
        [result] = callback.results
        assert result.error is not None
        assert result.error.reason == "session_ended"


def results_stored(monkeypatch: pytest.MonkeyPatch, mem: mnemo.Memory, count: int) -> anyio.Event:
    """An event set once `mem` has stored `count` results of operations another Memory
    accepted."""
    stored, done = anyio.Event(), []
    coordination = mem._live.coordination
    finish = coordination.finish_op

    async def finish_op(op_id: str, result: Any) -> None:
        await finish(op_id, result)
        done.append(op_id)
        if len(done) == count:
            stored.set()

    monkeypatch.setattr(coordination, "finish_op", finish_op)
    return stored


@pytest.mark.parametrize("end", ["end_session by B", "end_session by C", "forget by C",
                                 "B closes"])
async def test_an_operation_that_ran_before_its_end_calls_back_its_result(
    store: str, monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    """B accepts a commit while A extracts; A runs it and stores its result; then, before B
    looked for it, the session ends (through B or C, or C forgets it) or B closes: B's
    callback gets the commit's own result, not session_ended or memory_closed (it happened)."""
    from mnemo.session import operations

    monkeypatch.setattr(operations, "watch", lambda live, session: None)  # B never looks
    async with AsyncExitStack() as stack, AsyncExitStack() as of_b:
        a, c = await open_worker(stack, store), await open_worker(stack, store)
        b = await open_worker(of_b, store)
        stored = results_stored(monkeypatch, a.mem, 1)
        sid = await fill(a.mem)
        held = await extracting(a, sid)
        callback = Called()
        await b.mem.commit_async(sid, callback)
        held.release()
        with anyio.fail_after(10):
            await stored.wait()
        if end == "end_session by B":
            await b.mem.end_session(sid)
        elif end == "end_session by C":
            await c.mem.end_session(sid)
        elif end == "forget by C":
            await c.mem.forget(REPO, sid)
        else:
            await of_b.aclose()
        if end.endswith("by C"):  # B learns of it at its next call
            with pytest.raises(mnemo.NotFoundError):
                await b.mem.session_state(sid)
        with anyio.fail_after(5):
            await callback.done.wait()
        [result] = callback.results
        assert (result.ok, result.value) == (True, "committed")


async def test_a_commit_overtaken_by_a_forget_of_its_session_is_not_found(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's commit reaches the store after B forgot the session (its steps gone): the commit
    raises NotFoundError, as one that came after the forget does, not an internal error."""
    async with workers(store, 2) as (a, b):
        sid = await fill(a.mem)
        await ready(a, sid)
        reached, go = anyio.Event(), anyio.Event()
        graph = a.mem._live.graph
        apply = graph.apply

        async def held(*args: Any, **kwargs: Any) -> Any:
            reached.set()
            await go.wait()
            return await apply(*args, **kwargs)

        monkeypatch.setattr(graph, "apply", held)

        async def commit() -> None:
            with pytest.raises(mnemo.NotFoundError):
                await a.mem.commit(sid)

        async with anyio.create_task_group() as group:
            group.start_soon(commit)
            with anyio.fail_after(5):
                await reached.wait()
            await b.mem.forget(REPO, sid)
            go.set()
        assert await sql(a.mem, "SELECT id FROM steps") == []


async def test_a_forgotten_open_episode_leaves_its_answered_operations_results_not_words(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B accepts a new episode and an append while A extracts; A runs both and stores their
    results; C forgets the new, open episode before B looked: no row holds the append's words,
    and B's callbacks still get what A answered."""
    from mnemo.session import operations

    monkeypatch.setattr(operations, "watch", lambda live, session: None)  # B never looks
    async with workers(store, 3) as (a, b, c):
        answered = results_stored(monkeypatch, a.mem, 3)
        sid = await fill(a.mem)
        held = await extracting(a, sid)
        called = Callbacks()
        await b.mem.commit_async(sid, called("commit"))
        await b.mem.start_episode_async(sid, "again", called("start"))
        await b.mem.append_async(sid, "walk to the zqwordqz", "go", called("append"))
        held.release()
        with anyio.fail_after(10):
            await answered.wait()
        episode = (await a.mem.episodes(sid))[-1]
        await c.mem.forget(REPO, episode.id)
        assert not [args for args, in await sql(a.mem, "SELECT args FROM ops")
                    if "zqwordqz" in str(args)]
        await b.mem.end_session(sid)
        results = dict(await called.wait(3))
        assert [(results[k].ok, results[k].value) for k in ("commit", "start", "append")] == [
            (True, "committed"), (True, "started"), (True, "appended")]


@pytest.mark.slow
async def test_a_storage_fault_while_waiting_for_another_memory_loses_no_callback(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit accepted through A while B extracts: A's wait for the result meets storage
    faults (the store unreachable for a while) and goes on waiting; the callback comes, once,
    when B's extraction ends. Before, the first fault ended the wait and the callback never
    came."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        sid = await fill(a.mem)
        b = await open_worker(stack, store)
        held = await extracting(b, sid)
        monkeypatch.setattr(operations, "WATCH_BACKOFF", 2)  # pauses of 0.1 s, not up to 3.2
        coordination = a.mem._backend.coordination
        # Faults while B still extracts (the change token, the results), then one when A
        # drops the finished operation's row, after its result is there.
        faults = {"change_token": 3, "op_results": 2, "drop_ops": 1}
        met = anyio.Event()  # the wait has met its faults before the result
        for name in faults:
            real = getattr(coordination, name)

            async def failing(*args: Any, _name: str = name, _real: Any = real) -> Any:
                if faults[_name] > 0 and (_name != "drop_ops" or args[0]):
                    faults[_name] -= 1
                    if not faults["change_token"] and not faults["op_results"]:
                        met.set()
                    raise mnemo.StorageError("unavailable", "the store is unreachable")
                return await _real(*args)

            monkeypatch.setattr(coordination, name, failing)
        callback = Called()
        await a.mem.commit_async(sid, callback)
        with anyio.fail_after(10):
            await met.wait()
        the_holder_takes_first(monkeypatch, a, b)  # the drop fault asserted is A's, as waiter
        held.release()
        with anyio.fail_after(10):
            await callback.done.wait()
        assert faults["drop_ops"] == 0  # met after the result was in the store
        assert callback.results == [mnemo.OpResult(ok=True, value="committed", error=None)]
        assert await sql(b.mem, "SELECT id FROM ops") == []
        assert set((await node_texts(b.mem)).values()) == {1}


async def test_a_memory_with_another_model_never_resumes_the_work(store: str) -> None:
    """An extraction A started and left (A closed mid-extraction) is not resumed by B, whose
    model for the repo is another; C, with A's model, finishes it, with C's LLM alone."""
    async with AsyncExitStack() as stack:
        a_stack = await stack.enter_async_context(AsyncExitStack())
        a = await open_worker(a_stack, store)
        sid = await fill(a.mem)
        held = a.llm.hold("semantic")
        await a.mem.close(sid)
        with anyio.fail_after(5):
            await held.started.wait()
        await a_stack.aclose()  # A goes away holding the extraction
        b = await open_worker(stack, store, llm=OtherLLM())
        assert await b.mem.session_state(sid) is State.EXTRACTING
        c = await open_worker(stack, store)
        landed = await c.events.wait_state(c.mem, sid, State.READY, State.FAILED)
        assert landed is State.READY
        assert "semantic" in c.llm.tasks()
        assert b.llm.calls == []
        receipt = await c.mem.commit(sid)
        assert receipt is not None
        assert set((await node_texts(c.mem)).values()) == {1}


async def test_work_started_with_a_session_override_is_resumed_with_the_repos_model(
    store: str,
) -> None:
    """A session with its own LLM (an override, never persisted) left extracting when its
    Memory went away is resumed by a Memory with the repo's model, with that model, as a
    restored session runs (it used to stay extracting: the override's name matched no one)."""
    async with AsyncExitStack() as stack:
        a_stack = await stack.enter_async_context(AsyncExitStack())
        a = await open_worker(a_stack, store)
        override = OtherLLM()
        sid = await a.mem.start_session("explore the house", repo=REPO, llm=override)
        for observation, action in STEPS:
            await a.mem.append(sid, observation, action)
        held = override.hold("semantic")
        await a.mem.close(sid)
        with anyio.fail_after(5):
            await held.started.wait()
        await a_stack.aclose()  # A goes away holding the extraction
        c = await open_worker(stack, store)
        landed = await c.events.wait_state(c.mem, sid, State.READY, State.FAILED)
        assert landed is State.READY
        assert "semantic" in c.llm.tasks()
        assert await c.mem.commit(sid) is not None


async def test_close_and_commit_sees_an_extraction_that_ends_while_it_starts_to_wait(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's extraction ends after A read the session (extracting) and before A took the
    store's change token to wait on: A still sees it ready, at once. Before, A waited for
    the next write to the store by anyone, B's heartbeat 10 s later (a flaky 10 s test)."""
    async with workers(store, 2) as (a, b):
        sid = await fill(a.mem)
        held = await extracting(b, sid)
        coordination = a.mem._backend.coordination
        change_token = coordination.change_token

        released: list[bool] = []

        async def after_b_is_ready() -> int:  # A's only caller: the wait for B's work
            if not released:
                released.append(True)
                held.release()
                await b.events.wait_state(b.mem, sid, State.READY)
            return await change_token()

        monkeypatch.setattr(coordination, "change_token", after_b_is_ready)
        with anyio.fail_after(5):
            receipt = await a.mem.close_and_commit(sid)
        assert receipt.node_ids
        assert set((await node_texts(a.mem)).values()) == {1}


@pytest.mark.parametrize("drop_fails", [False, True], ids=["", "drop-fault"])
async def test_an_operation_stored_by_a_closed_memory_still_runs(
    store: str, monkeypatch: pytest.MonkeyPatch, drop_fails: bool
) -> None:
    """A commit accepted through A while B extracts is stored with the session: A closes
    (its callback says so), and B runs the commit when its extraction ends. With a fault
    when B drops that operation's row (B has taken it by then), B still runs it and the row
    stays, taken (before, the fault ended B's run of the stored operations, and failed its
    extraction)."""
    async with AsyncExitStack() as stack:
        a_stack = await stack.enter_async_context(AsyncExitStack())
        a = await open_worker(a_stack, store)
        sid = await fill(a.mem)
        b = await open_worker(stack, store)
        held = await extracting(b, sid)
        results: list[mnemo.OpResult] = []
        await a.mem.commit_async(sid, results.append)
        await a_stack.aclose()  # A goes away before the work ends
        assert [r.error.reason for r in results if r.error] == ["memory_closed"]
        coordination = b.mem._backend.coordination
        drop_ops = coordination.drop_ops
        faults = [mnemo.StorageError("unavailable", "the store is away")] if drop_fails else []

        async def failing(op_ids: Any) -> None:
            if op_ids and faults:
                raise faults.pop()
            await drop_ops(op_ids)

        monkeypatch.setattr(coordination, "drop_ops", failing)
        held.release()
        landed = await b.events.wait_state(b.mem, sid, State.IDLE)
        assert landed is State.IDLE
        assert faults == []  # the fault, if any, was met
        assert set((await node_texts(b.mem)).values()) == {1}
        assert "semantic" not in a.llm.tasks()
        # Nobody is left to call back; a row whose drop failed stays, taken.
        assert len(await sql(b.mem, "SELECT id FROM ops")) == (1 if drop_fails else 0)


async def test_close_and_commit_waits_for_an_extraction_another_memory_runs(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's close_and_commit on a session B is extracting waits for B's extraction (seen in the
    store) and commits it once, with B's result. B's extraction is let go only once A waits
    (`wait_all_tasks_blocked` returned while A's read was still on its thread or socket, and
    A often found the extraction over without waiting at all)."""
    async with workers(store, 2) as (a, b):
        sid = await fill(a.mem)
        held = await extracting(b, sid)
        live = a.mem._live
        wait_moved = transitions.wait_moved
        waiting = anyio.Event()

        async def spied(on: Sessions, session: Any) -> None:
            if on is live:
                waiting.set()
            await wait_moved(on, session)

        monkeypatch.setattr(transitions, "wait_moved", spied)
        async with anyio.create_task_group() as tg:
            receipts: list[mnemo.CommitReceipt] = []

            async def commit_through_a() -> None:
                receipts.append(await a.mem.close_and_commit(sid))

            tg.start_soon(commit_through_a)
            with anyio.fail_after(5):
                await waiting.wait()
            held.release()
        assert receipts[0].node_ids
        assert await b.mem.session_state(sid) is State.IDLE
        assert set((await node_texts(a.mem)).values()) == {1}
        assert "semantic" not in a.llm.tasks()


def take_faked(monkeypatch: pytest.MonkeyPatch, live: Sessions,
               take_ops: Callable[..., Awaitable[list[StoredOp]]]) -> None:
    """The store's take replaced by `take_ops`, and its checks before a taken operation runs
    by ones that always pass (the operation handed over has no row to check)."""

    async def still_taken(op_id: str, holder_id: str) -> bool:
        return True

    monkeypatch.setattr(live.coordination, "take_ops", take_ops)
    monkeypatch.setattr(live.coordination, "still_taken", still_taken)
    monkeypatch.setattr(live.coordination, "drop_queued", still_taken)


async def with_a_stored_commit(
    worker: Worker, callbacks: Callbacks
) -> tuple[str, Sessions, SessionRecord]:
    """A session made ready through `worker`, for which it stored a `commit` (as it does while
    another Memory holds the work), calling back to `callbacks("commit")`."""
    sid = await fill(worker.mem)
    await ready(worker, sid)
    live = worker.mem._live
    live.remote[sid] = [("op_stored", "commit", callbacks("commit"))]
    return sid, live, live.by_id[sid]


@pytest.mark.parametrize("drop_fails", [False, True], ids=["", "drop-fault"])
async def test_stored_operations_are_in_the_queue_before_it_starts(
    store: str, monkeypatch: pytest.MonkeyPatch, drop_fails: bool
) -> None:
    """The extraction's end and the store's watcher both take the session's stored operations
    (`operations.run_stored`): the one that took nothing started the queue while the other's
    were still on their way into it, so a `start_episode` queued here ran before the stored
    `commit` it was accepted behind, and was refused. Taking is one at
    a time now. Placed deterministically: the first take answers only once everything else
    has run. With a fault when the stored commit's row is taken off the queue before it runs,
    both callbacks still come, as failures."""
    async with workers(store, 1) as [w]:
        recorded = Callbacks()
        sid, live, session = await with_a_stored_commit(w, recorded)
        accepted = live.coordination.now() - timedelta(seconds=1)  # the stored commit
        # A start_episode this Memory queued behind its stored commit once the work was its own.
        session.pending.append(Op("start_episode", ("walk west",), recorded("start"),
                                  at=live.coordination.now()))
        gate = anyio.Event()
        takes = 0

        async def take_ops(session_id: str, holder_id: str, *_: object) -> list[StoredOp]:
            nonlocal takes
            takes += 1
            if takes > 1:
                return []
            await gate.wait()
            return [StoredOp("op_stored", sid, "commit", [], holder_id, accepted)]

        faults = [mnemo.StorageError("unavailable", "the store is away")] if drop_fails else []

        async def failing(op_id: str, holder_id: str) -> bool:
            if faults:
                raise faults.pop()
            return True

        take_faked(monkeypatch, live, take_ops)
        monkeypatch.setattr(live.coordination, "drop_queued", failing)
        async with anyio.create_task_group() as tg:
            tg.start_soon(operations.run_stored, live, session)
            tg.start_soon(operations.run_stored, live, session)
            await anyio.wait_all_tasks_blocked()
            gate.set()
        ran = not drop_fails  # a commit whose row cannot be taken off the queue is not run
        assert [(label, r.ok, r.value) for label, r in await recorded.wait(2)] == [
            ("commit", ran, "committed" if ran else None),
            ("start", ran, "started" if ran else None)]
        assert faults == []  # the fault, if any, was met
        assert await w.mem.session_state(sid) is (State.COLLECTING if ran else State.READY)


async def test_a_call_made_while_a_stored_operation_runs_queues_behind_it(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once this Memory takes its own stored `commit` into its queue, the commit is no longer
    counted as stored too: a `start_episode` made while it runs is accepted behind it. It was
    refused `invalid_queued_operation`, projected from ready through two commits. The commit is
    held at its write, deterministically."""
    async with workers(store, 1) as [w]:
        recorded = Callbacks()
        sid, live, session = await with_a_stored_commit(w, recorded)
        in_store = [StoredOp("op_stored", sid, "commit", [], live.holder_id or "",
                           datetime.now(UTC))]

        async def take_ops(session_id: str, holder_id: str, *_: object) -> list[StoredOp]:
            taken = in_store[:]
            in_store.clear()
            return taken

        apply = live.graph.apply
        applying, release = anyio.Event(), anyio.Event()

        async def held_apply(*args: Any, **kwargs: Any) -> Any:
            applying.set()
            await release.wait()
            return await apply(*args, **kwargs)

        take_faked(monkeypatch, live, take_ops)
        monkeypatch.setattr(live.graph, "apply", held_apply)
        await operations.run_stored(live, session)
        with anyio.fail_after(5):
            await applying.wait()
        await w.mem.start_episode_async(sid, "walk west", recorded("start"))
        release.set()
        assert [(label, r.ok, r.value) for label, r in await recorded.wait(2)] == [
            ("commit", True, "committed"), ("start", True, "started")]
        assert await w.mem.session_state(sid) is State.COLLECTING


async def test_a_call_made_while_stored_operations_are_taken_queues_behind_them(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the store hands this Memory's stored `commit` over (the take's round trip), the
    ready session is busy for a new call: a `start_episode` queues behind the commit. It was
    checked against ready alone and refused `invalid_operation`. The
    take is held, deterministically."""
    async with workers(store, 1) as [w]:
        recorded = Callbacks()
        sid, live, session = await with_a_stored_commit(w, recorded)
        taking, gate = anyio.Event(), anyio.Event()

        async def take_ops(session_id: str, holder_id: str, *_: object) -> list[StoredOp]:
            # The first take (the extraction's own, or the one started here) is held and
            # hands the commit over; any later one finds nothing.
            if taking.is_set():
                return []
            taking.set()
            await gate.wait()
            return [StoredOp("op_stored", sid, "commit", [], holder_id, accepted)]

        take_faked(monkeypatch, live, take_ops)
        accepted = live.coordination.now() - timedelta(seconds=1)  # before the start
        async with anyio.create_task_group() as tg:
            tg.start_soon(operations.run_stored, live, session)
            with anyio.fail_after(5):
                await taking.wait()
            await w.mem.start_episode_async(sid, "walk west", recorded("start"))
            gate.set()
        assert [(label, r.ok, r.value) for label, r in await recorded.wait(2)] == [
            ("commit", True, "committed"), ("start", True, "started")]
        assert await w.mem.session_state(sid) is State.COLLECTING


@pytest.mark.parametrize("call", ["append", "start_episode"])
async def test_a_call_is_not_refused_by_a_record_the_store_moved_past(
    store: str, call: str
) -> None:
    """A's extraction leaves A's record ready; through B the session is committed, and for
    the append started collecting again. The append (or the start_episode) through A then
    goes through: before, A's record refused it (`not_idle`, state ready), as these calls
    checked the state on the record alone. Found by the two-Memory stateful test."""
    async with workers(store, 2) as (a, b):
        sid = await fill(a.mem)
        await ready(a, sid)
        assert await b.mem.commit(sid) is not None
        if call == "append":
            await b.mem.start_episode(sid, "read the note")
            info = await a.mem.append(sid, "walk south", "go south")
            assert info.index == 0
            assert await b.mem.session_state(sid) is State.COLLECTING
        else:
            await a.mem.start_episode(sid, "read the note")
            assert await b.mem.session_state(sid) is State.COLLECTING
        # And a refusal that the store confirms still comes: the session is collecting.
        with pytest.raises(mnemo.SessionError) as refused:
            await a.mem.start_episode(sid, "again")
        assert refused.value.reason == "not_idle"


async def test_operations_running_into_an_end_through_another_memory_get_session_ended(
    store: str,
) -> None:
    """A's append waits on its LLM with a close queued behind it when B ends the session: the
    append's write finds the session gone, and both are answered session_ended, as
    end_session answers what it stops (before: operation_failed with the NotFoundError as
    its cause, then preceding_op_failed). The id is then unknown through A too."""
    async with workers(store, 2) as (a, b):
        sid = await fill(a.mem)
        held = a.llm.hold("state")
        callbacks = Callbacks()
        await a.mem.append_async(sid, "walk west", "go west", callbacks("append"))
        await a.mem.close_async(sid, callbacks("close"))
        with anyio.fail_after(5):
            await held.started.wait()
        await b.mem.end_session(sid)
        held.release()
        await callbacks.wait(2)
        # In either order: the queue is answered as the record goes, the append as its
        # write fails (as end_session through A answers its queue before what it cancels).
        assert sorted((label, r.error.reason if r.error else None)
                      for label, r in callbacks.results) == [
            ("append", "session_ended"), ("close", "session_ended")]
        with pytest.raises(mnemo.NotFoundError):
            await a.mem.session_state(sid)


class SpiedLock:
    """A session's lock that says when a second caller waits for it."""

    def __init__(self, lock: anyio.Lock) -> None:
        self._lock = lock
        self.waited = anyio.Event()

    def locked(self) -> bool:
        return self._lock.locked()

    async def __aenter__(self) -> None:
        if self._lock.locked():
            self.waited.set()
        await self._lock.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()


@pytest.mark.parametrize("call", ["append", "append_async"])
async def test_a_refusal_is_checked_against_the_store_after_this_memorys_own_write(
    store: str, call: str
) -> None:
    """A's record is ready and A's own commit is under way (it holds the session's lock, held
    at the graph's apply) when B commits first and starts an episode. An append through A
    waits for A's write to end, reads the store, and is accepted. Before, the read was
    skipped while the lock was held (a fresh fetch leaves a write of this Memory's own
    alone), and A's record refused it (not_idle, or invalid_operation for the async call)."""
    async with workers(store, 2) as (a, b):
        sid = await fill(a.mem)
        await ready(a, sid)
        live = a.mem._live
        spied = SpiedLock(live.by_id[sid].lock)
        live.by_id[sid].lock = spied  # type: ignore[assignment]
        apply, applying, go = live.graph.apply, anyio.Event(), anyio.Event()

        async def held_apply(*args: Any, **kwargs: Any) -> Any:
            applying.set()
            await go.wait()
            return await apply(*args, **kwargs)

        live.graph.apply = held_apply  # type: ignore[method-assign]
        refused: list[mnemo.SessionError] = []

        async def commit_through_a() -> None:
            with pytest.raises(mnemo.SessionError) as lost:
                await a.mem.commit(sid)  # B's commit came first
            refused.append(lost.value)

        async def let_go_once_waited() -> None:
            await spied.waited.wait()
            go.set()

        appended = Called()
        async with anyio.create_task_group() as tg:
            tg.start_soon(commit_through_a)
            with anyio.fail_after(5):
                await applying.wait()
            assert await b.mem.commit(sid) is not None
            await b.mem.start_episode(sid, "read the note")
            tg.start_soon(let_go_once_waited)
            try:
                if call == "append":
                    await a.mem.append(sid, "walk south", "go south")
                else:
                    await a.mem.append_async(sid, "walk south", "go south", appended)
                    with anyio.fail_after(5):
                        await appended.done.wait()
                    assert appended.results[0].ok
            finally:
                go.set()
        assert [e.reason for e in refused] == ["not_ready"]
        [info] = [s for s in await b.mem.list_sessions() if s.id == sid]
        assert info.steps == 1


@pytest.mark.parametrize("how", ["extraction-ends", "read-finds-it-gone"])
async def test_operations_queued_here_are_answered_when_another_memory_ends_the_session(
    store: str, how: str
) -> None:
    """What A queued is answered session_ended when B ends the session and A finds out:
    a commit queued behind A's own extraction, once that extraction ends and its write finds
    the session gone; or a close queued behind A's running append, when a read of the
    session through A finds it gone (the append, cancelled, gets session_ended too). Before,
    the record was dropped and the queued operation never called back."""
    async with workers(store, 2) as (a, b):
        sid = await fill(a.mem)
        callbacks = Callbacks()
        if how == "extraction-ends":
            held = a.llm.hold("semantic")
            await a.mem.close_async(sid, callbacks("close"))
            with anyio.fail_after(5):
                await held.started.wait()
            await a.mem.commit_async(sid, callbacks("commit"))
            await b.mem.end_session(sid)
            held.release()
            expected = [("close", "closed"), ("commit", "session_ended")]
        else:
            held = a.llm.hold("state")
            await a.mem.append_async(sid, "walk west", "go west", callbacks("append"))
            await a.mem.close_async(sid, callbacks("close"))
            with anyio.fail_after(5):
                await held.started.wait()
            await b.mem.end_session(sid)
            with pytest.raises(mnemo.NotFoundError):
                await a.mem.session_state(sid)
            held.release()
            expected = [("append", "session_ended"), ("close", "session_ended")]
        await callbacks.wait(2)
        got = [(label, r.error.reason if r.error else r.value) for label, r in callbacks.results]
        assert sorted(got) == sorted(expected)


async def test_concurrent_calls_stored_for_another_memory_keep_the_queues_bound(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two async calls through A at once, while B extracts the session, with room for one
    pending operation: the second is checked while the first's row is being stored. One is
    accepted (and called back once B's extraction ends), the other refused
    pending_queue_full. Before, both passed the bound while the first's row was being
    stored, and A held two."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store, config=mnemo.Config(max_pending_ops=1))
        sid = await fill(a.mem)
        b = await open_worker(stack, store)
        held = await extracting(b, sid)
        second_arrived = anyio.Event()
        arrivals: list[str] = []
        check_args = machine.check_args

        def counting(session: SessionRecord, kind: str, args: tuple[Any, ...]) -> None:
            arrivals.append(kind)
            if len(arrivals) == 2:
                second_arrived.set()
            check_args(session, kind, args)

        coordination = a.mem._backend.coordination
        queue_op = coordination.queue_op

        async def storing_slowly(op: StoredOp) -> None:
            if len(arrivals) == 1:  # the first call's row waits for the other call's check
                with anyio.fail_after(5):
                    await second_arrived.wait()
            await queue_op(op)

        monkeypatch.setattr(operations, "check_args", counting)
        monkeypatch.setattr(coordination, "queue_op", storing_slowly)
        callbacks = Callbacks()
        refused: list[str] = []

        async def call(submit: Callable[[], Awaitable[None]]) -> None:
            try:
                await submit()
            except mnemo.SessionError as exc:
                refused.append(exc.reason)

        async with anyio.create_task_group() as group:
            for label in ["first", "second"]:
                group.start_soon(call, lambda label=label: a.mem.commit_async(
                    sid, callbacks(label)))
        assert arrivals == ["commit", "commit"]
        assert refused == ["pending_queue_full"]
        assert len(await sql(a.mem, "SELECT id FROM ops")) == 1
        held.release()
        await callbacks.wait(1)
        [(_, result)] = callbacks.results
        assert result == mnemo.OpResult(ok=True, value="committed", error=None)


async def test_a_failed_refusal_is_checked_against_the_store(store: str) -> None:
    """A's extraction failed; B extracted the session again and left it ready. A's record
    still says failed, and a write of A's own holds the session's lock (here the test holds
    it): a commit_async through A waits for it, reads the store, and is accepted. Before,
    A's record refused it session_failed without the store's check that invalid_operation
    gets."""
    async with workers(store, 2) as (a, b):
        sid = await fill(a.mem)
        a.llm.fail_tasks.add("semantic")
        await a.mem.close(sid)
        assert await a.events.wait_state(a.mem, sid, State.READY, State.FAILED) is State.FAILED
        assert await b.mem.commit(sid) is None  # extracts again, in B
        assert await b.events.wait_state(b.mem, sid, State.READY, State.FAILED) is State.READY
        live = a.mem._live
        spied = SpiedLock(live.by_id[sid].lock)
        live.by_id[sid].lock = spied  # type: ignore[assignment]
        callbacks = Callbacks()
        holding = anyio.Event()

        async def a_write_of_as_own() -> None:  # under way until the commit waits for it
            async with spied:
                holding.set()
                await spied.waited.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(a_write_of_as_own)
            with anyio.fail_after(5):
                await holding.wait()
                await a.mem.commit_async(sid, callbacks("commit"))
        await callbacks.wait(1)
        assert [(label, r.value) for label, r in callbacks.results] == [("commit", "committed")]
        assert await b.mem.session_state(sid) is State.IDLE


def held_look(
    monkeypatch: pytest.MonkeyPatch, mem: mnemo.Memory, *, shielded: bool = False
) -> tuple[anyio.Event, anyio.Event]:
    """The Memory's looks at the store's change token (its watchers'), held: the first event
    is set when one waits, and they go on when the second is; `shielded`, a cancel does not
    stop one either, as it does not stop a store call under way."""
    coordination = mem._backend.coordination
    change_token, looking, go = coordination.change_token, anyio.Event(), anyio.Event()

    async def a_held_look() -> int:
        with anyio.CancelScope(shield=shielded):
            looking.set()
            await go.wait()
            token: int = await change_token()
        return token

    monkeypatch.setattr(coordination, "change_token", a_held_look)
    return looking, go


def held_after_its_row(
    monkeypatch: pytest.MonkeyPatch, mem: mnemo.Memory
) -> tuple[anyio.Event, anyio.Event]:
    """The Memory's insert of an operation it stores (for another, or queued for itself), held
    once written: the first event is set then, and the call goes on when the second is."""
    coordination = mem._backend.coordination
    queue_op, written, go = coordination.queue_op, anyio.Event(), anyio.Event()

    async def written_then_held(op: StoredOp, *, own: bool = False) -> None:
        await queue_op(op, own=own)
        written.set()
        await go.wait()

    monkeypatch.setattr(coordination, "queue_op", written_then_held)
    return written, go


async def outcome_of(outcome: list[BaseException | None],
                     call: Callable[[], Awaitable[None]]) -> None:
    """Runs `call`, and keeps what it raised (None: it returned)."""
    try:
        await call()
    except Exception as exc:
        outcome.append(exc)
    else:
        outcome.append(None)


async def test_a_call_stored_while_the_session_ends_is_answered_though_a_watcher_lingers(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit through A is stored for B's extraction, and A's watcher waits on the store.
    A start_episode through A is being stored when the session is ended through A: the end
    answers the commit, and cancels the watcher, which is still in a store call that does
    not stop at once. The start's entry comes after the end's answer; it is answered
    session_ended where it is kept. Before, it found that watcher still there, so no new
    one was started, and nobody answered it on PostgreSQL: accepted, never called back
    (on SQLite every store call is shielded, so the cancelled watcher
    went on to read the session, found it gone and answered)."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        sid = await fill(a.mem)
        b = await open_worker(stack, store)
        held = await extracting(b, sid)
        # The watcher's look, shielded as a store call is: it does not stop when cancelled.
        looking, looked = held_look(monkeypatch, a.mem, shielded=True)
        coordination = a.mem._backend.coordination
        queue_op, writing, written = coordination.queue_op, anyio.Event(), anyio.Event()

        async def a_slow_write(op: StoredOp) -> None:
            if op.kind == "start_episode":
                writing.set()
                await written.wait()
            await queue_op(op)

        monkeypatch.setattr(coordination, "queue_op", a_slow_write)
        callbacks = Callbacks()
        await a.mem.commit_async(sid, callbacks("commit"))
        with anyio.fail_after(5):
            await looking.wait()
        async with anyio.create_task_group() as group:
            group.start_soon(a.mem.start_episode_async, sid, "next", callbacks("start"))
            with anyio.fail_after(5):
                await writing.wait()
            await a.mem.end_session(sid)
            written.set()
        looked.set()
        held.release()
        await callbacks.wait(2)
        got = [(label, r.error.reason if r.error else r.value) for label, r in callbacks.results]
        assert got == [("commit", "session_ended"), ("start", "session_ended")]
        assert await sql(b.mem, "SELECT id FROM ops") == []  # written after the end dropped


async def test_a_call_stored_while_its_memory_closes_is_answered_and_runs_once(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit through A is stored for B's extraction; its row is written when A closes.
    The close answers it memory_closed and leaves it to B, which runs it once and forgets
    it. Before, the close answered what it had found (nothing yet), the call then raised
    RuntimeError (A's tasks had ended) and its row stayed A's: B ran the commit all the
    same, and its result stayed in the store for good."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        sid = await fill(a.mem)
        b = await open_worker(stack, store)
        held = await extracting(b, sid)
        written, go = held_after_its_row(monkeypatch, a.mem)
        spied = SpiedLock(a.mem._live.by_id[sid].storing)
        a.mem._live.by_id[sid].storing = spied  # type: ignore[assignment]
        callbacks = Callbacks()
        outcome: list[BaseException | None] = []
        closed = anyio.Event()

        async def close_a() -> None:
            await a.mem.aclose()
            closed.set()

        async def let_go_once_the_close_waits_or_is_done() -> None:
            async with anyio.create_task_group() as either:
                async def on(event: anyio.Event) -> None:
                    await event.wait()
                    either.cancel_scope.cancel()

                either.start_soon(on, closed)
                either.start_soon(on, spied.waited)
            go.set()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(outcome_of, outcome,
                                 lambda: a.mem.commit_async(sid, callbacks("commit")))
                await written.wait()
                group.start_soon(close_a)
                group.start_soon(let_go_once_the_close_waits_or_is_done)
        assert outcome == [None]  # accepted
        await callbacks.wait(1)
        assert [(label, r.error.reason if r.error else r.value)
                for label, r in callbacks.results] == [("commit", "memory_closed")]
        held.release()
        assert await b.events.wait_state(b.mem, sid, State.IDLE) is State.IDLE
        assert await sql(b.mem, "SELECT id FROM ops") == []
        assert set((await node_texts(b.mem)).values()) == {1}


@pytest.mark.parametrize("through", ["a", "b"])
async def test_an_ended_session_leaves_no_stored_operations(store: str, through: str) -> None:
    """Operations A stored for B's extraction are answered session_ended when the session
    ends, through A or through B, and their rows go with the end: nobody will run an ended
    session's operations. Before, the rows stayed in the store for good."""
    async with workers(store, 2) as (a, b):
        sid = await fill(a.mem)
        held = await extracting(b, sid)
        callbacks = Callbacks()
        await a.mem.commit_async(sid, callbacks("commit"))
        await a.mem.start_episode_async(sid, "next", callbacks("start"))
        assert len(await sql(a.mem, "SELECT id FROM ops")) == 2
        await (a if through == "a" else b).mem.end_session(sid)
        assert await sql(a.mem, "SELECT id FROM ops") == []
        held.release()
        await callbacks.wait(2)
        assert {(label, r.error.reason if r.error else r.value)
                for label, r in callbacks.results} == {("commit", "session_ended"),
                                                       ("start", "session_ended")}


async def test_an_end_refused_as_stale_leaves_the_stored_operations(store: str) -> None:
    """An expiry's end of a version the session has moved past is refused, and writes
    nothing: the operations A stored for B's extraction stay, and run when it ends. Before,
    on SQLite, the refused end still dropped them, and A waited for them for good."""
    async with workers(store, 2) as (a, b):
        sid = await fill(a.mem)
        held = await extracting(b, sid)
        callbacks = Callbacks()
        await a.mem.commit_async(sid, callbacks("commit"))
        with pytest.raises(StaleSession):
            await a.mem._live.store.end(sid, version=-1)
        assert len(await sql(a.mem, "SELECT id FROM ops")) == 1
        held.release()
        await callbacks.wait(1)
        assert [(label, r.value) for label, r in callbacks.results] == [("commit", "committed")]


async def test_a_call_stored_as_its_session_ends_and_its_memory_closes_is_answered(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit through A is stored for B's extraction; while its row is written the session
    is ended through A and A closes. The call is accepted and answered session_ended. Before
    the end answered it where it was kept, the call returned as accepted and was never
    called back: the close answers only the sessions it still knows."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        sid = await fill(a.mem)
        b = await open_worker(stack, store)
        held = await extracting(b, sid)
        written, go = held_after_its_row(monkeypatch, a.mem)
        callbacks = Callbacks()
        outcome: list[BaseException | None] = []
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(outcome_of, outcome,
                                 lambda: a.mem.commit_async(sid, callbacks("commit")))
                await written.wait()
                await a.mem.end_session(sid)
                await a.mem.aclose()
                go.set()
        held.release()
        assert outcome == [None]  # accepted
        await callbacks.wait(1)
        assert [(label, r.error.reason if r.error else r.value)
                for label, r in callbacks.results] == [("commit", "session_ended")]


async def test_a_result_recorded_before_the_session_ends_elsewhere_is_delivered(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B runs a commit A stored and records its result; the session is ended through B
    before A's watcher looks. A is called back with the commit's result, not session_ended:
    the end leaves a row with a result (or taken) for its Memory to read. Before, with the
    end dropping every row of the session, A was told session_ended for a commit that was
    applied."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        sid = await fill(a.mem)
        b = await open_worker(stack, store)
        held = await extracting(b, sid)
        looking, go = held_look(monkeypatch, a.mem)
        holder = b.mem._backend.coordination
        finish_op, recorded = holder.finish_op, anyio.Event()

        async def recording(op_id: str, result: Any) -> None:
            await finish_op(op_id, result)
            recorded.set()

        monkeypatch.setattr(holder, "finish_op", recording)
        callbacks = Callbacks()
        await a.mem.commit_async(sid, callbacks("commit"))
        with anyio.fail_after(5):
            await looking.wait()
            held.release()
            await recorded.wait()
        await b.mem.end_session(sid)
        go.set()
        await callbacks.wait(1)
        got = [(label, r.error.reason if r.error else r.value) for label, r in callbacks.results]
        assert got == [("commit", "committed")]
        assert await sql(b.mem, "SELECT id FROM ops") == []


async def _end_elsewhere_before_the_holder_checks(
    store: str, monkeypatch: pytest.MonkeyPatch, *, accepting_memory_answers_first: bool
) -> None:
    """B takes a commit A stored and, at its check that it still holds it, queues a start
    behind it while the session is ended through C (with `accepting_memory_answers_first`,
    A's watcher answers its commit and drops the row before B checks). Both operations are
    answered session_ended, and the session is gone."""
    async with AsyncExitStack() as stack:
        a = await open_worker(stack, store)
        sid = await fill(a.mem)
        b = await open_worker(stack, store)
        c = await open_worker(stack, store)
        held = await extracting(b, sid)
        callbacks = Callbacks()
        await a.mem.commit_async(sid, callbacks("a commit"))
        holder = b.mem._backend.coordination
        still_taken, checks = holder.still_taken, []

        async def ended_first(op_id: str, holder_id: str) -> bool:
            checks.append(op_id)
            if len(checks) == 1:
                await b.mem.start_episode_async(sid, "next", callbacks("b start"))
                await c.mem.end_session(sid)
                if accepting_memory_answers_first:
                    await callbacks.wait(1)  # A's watcher answered, and dropped the row
            taken: bool = await still_taken(op_id, holder_id)
            return taken

        monkeypatch.setattr(holder, "still_taken", ended_first)
        the_holder_takes_first(monkeypatch, a, b)
        held.release()
        await callbacks.wait(2)
        got = sorted((label, r.error.reason if r.error else r.value)
                     for label, r in callbacks.results)
        assert got == [("a commit", "session_ended"), ("b start", "session_ended")]
        with pytest.raises(mnemo.NotFoundError):
            await b.mem.session_state(sid)


async def test_an_end_elsewhere_while_the_holder_runs_stored_operations(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end dropped the rows B had taken before B checked: before, B's failed check gave
    A operation_failed with a cause saying A had answered it, and B's start
    preceding_op_failed."""
    await _end_elsewhere_before_the_holder_checks(
        store, monkeypatch, accepting_memory_answers_first=False)


async def test_an_end_the_accepting_memory_answers_before_the_holder_checks(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's watcher sees the end first and answers its commit: B's start queued behind the
    commit whose check failed is answered session_ended (the session is gone), not
    preceding_op_failed, since B reads whether the session still exists before it blames the
    failed commit."""
    await _end_elsewhere_before_the_holder_checks(
        store, monkeypatch, accepting_memory_answers_first=True)
