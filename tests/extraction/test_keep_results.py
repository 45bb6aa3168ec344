"""Keeping what succeeded: a retried extraction re-asks only the tasks that failed, and
`mem.usage()` reports what it saved."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import anyio
import pytest

import mnemo
from mnemo.calls.retry import LimitedLLM
from mnemo.extraction import memo as memo_module
from mnemo.extraction.memo import TaskMemo, request_digest
from mnemo.extraction.pipeline import cumulative_returns
from mnemo.extraction.prompts import Instruction, parse_facts, semantic_request
from tests.backends import sql
from tests.conftest import REPO
from tests.fakes import EventLog, FakeEmbedder, FakeLLM

N = mnemo.NodeType
STEPS = (("walk north", "go north"), ("walk south", "go south"), ("open door", "push door"))


class FailsOnce(FakeLLM):
    """A `FakeLLM` whose first call of `task` raises; later calls answer."""

    def __init__(self, task: str) -> None:
        super().__init__()
        self.failing_task = task
        self.failed = False

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        if request.task == self.failing_task and not self.failed:
            self.failed = True
            self.calls.append(request)
            raise RuntimeError("boom once")
        return await super().generate(request)


async def _collect(mem: mnemo.Memory) -> str:
    """A session with two trajectories: "walk" (two steps) and "open" (one)."""
    sid = await mem.start_session("explore the house", repo=REPO)
    for observation, action in STEPS:
        await mem.append(sid, observation, action)
    return sid


async def test_commit_after_a_failed_procedural_reasks_only_procedural(
    events: EventLog, store: str
) -> None:
    """A failing `procedural` task fails the extraction; the retry (`commit` on the failed
    session) asks `procedural` again (which scores the last step) and not semantic, and the
    changeset holds the kept facts and the new instructions; usage shows the saved calls."""
    llm = FakeLLM()
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO)
        sid = await _collect(mem)
        llm.fail_tasks.add("procedural")
        mark = len(llm.calls)
        await mem.close(sid)
        assert await events.wait_state(mem, sid, mnemo.State.FAILED) is mnemo.State.FAILED
        first = Counter(llm.tasks()[mark:])
        assert first == {"semantic": 2, "procedural": 2}
        llm.fail_tasks.clear()
        mark = len(llm.calls)
        assert await mem.commit(sid) is None
        assert await events.wait_state(mem, sid, mnemo.State.READY) is mnemo.State.READY
        # "return": the walk trajectory has two instructions, and its procedural failed before.
        assert Counter(llm.tasks()[mark:]) == {"procedural": 2, "return": 1}
        receipt = await mem.commit(sid)
        assert receipt is not None
        nodes = [await mem.get_node(REPO, node_id) for node_id in receipt.node_ids]
        kinds = Counter(node.type for node in nodes if node is not None)
        assert kinds[N.SEMANTIC] == 3
        assert kinds[N.PROCEDURAL] == 3
        usage = mem.usage(sid)
        # The kept semantic results (two trajectories): one call and 1 + 1 tokens each with
        # the fake.
        assert (usage.saved_calls, usage.saved_input_tokens, usage.saved_output_tokens) == (
            2, 2, 2
        )
        assert mem.usage().saved_calls == 2


async def test_close_and_commit_retry_reasks_only_the_failed_call(
    events: EventLog, store: str
) -> None:
    """`close_and_commit`'s retry after one failed procedural call asks that one task again:
    every other task of the episode is asked exactly once in all (the commit's contradiction
    question, for the close facts of its trajectories, once)."""
    llm = FailsOnce("procedural")
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO)
        sid = await _collect(mem)
        mark = len(llm.calls)
        receipt = await mem.close_and_commit(sid, max_retries=1)
        assert Counter(llm.tasks()[mark:]) == {"semantic": 2, "procedural": 3, "return": 1,
                                               "contradiction": 1}
        assert mem.usage(sid).saved_calls >= 2
        nodes = [await mem.get_node(REPO, node_id) for node_id in receipt.node_ids]
        assert Counter(n.type for n in nodes if n is not None)[N.PROCEDURAL] == 3


async def test_auto_commit_close_reasks_only_what_the_background_commit_failed(
    events: EventLog, store: str
) -> None:
    """In auto-commit, a background commit whose procedural fails keeps its semantic result:
    the close that commits those steps asks the walk trajectory's semantic no more."""
    llm = FakeLLM()
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO, config=mnemo.Config(auto_commit=True))
        sid = await mem.start_session("explore the house", repo=REPO)
        await mem.append(sid, "walk north", "go north")
        await mem.append(sid, "walk south", "go south")
        held = llm.hold("procedural")
        await mem.append(sid, "open door", "push door")  # a boundary: "walk" commits behind
        with anyio.fail_after(5):
            await held.started.wait()
        failed = anyio.Event()
        results: list[mnemo.OpResult] = []

        def callback(result: mnemo.OpResult) -> None:
            results.append(result)
            failed.set()

        await mem.append_async(sid, "open window", "push window", callback)
        llm.fail_tasks.add("procedural")
        held.release()
        with anyio.fail_after(5):
            await failed.wait()
        assert results[0].error is not None
        assert results[0].error.reason == "extraction_failed"
        llm.fail_tasks.clear()
        del llm.holds["procedural"]
        mark = len(llm.calls)
        await mem.close_and_commit(sid)
        assert Counter(llm.tasks()[mark:]) == {"semantic": 1, "procedural": 2, "return": 1,
                                               "contradiction": 1}
        assert mem.usage(sid).saved_calls == 1


async def test_a_failed_return_scoring_keeps_the_cumulative_scores(
    events: EventLog, store: str
) -> None:
    """The optional "return" task failing does not fail the extraction: each instruction
    keeps its score from the cumulative reward (0.7 with the fake -> 7)."""
    llm = FakeLLM()
    llm.fail_tasks.add("return")
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO)
        sid = await _collect(mem)
        receipt = await mem.close_and_commit(sid, max_retries=0)
        assert "return" in llm.tasks()
        nodes = [await mem.get_node(REPO, node_id) for node_id in receipt.node_ids]
        procedures = [n for n in nodes if n is not None and n.type is N.PROCEDURAL]
        assert [p.data["return_score"] for p in procedures] == [7, 7, 7]


async def test_memo_answers_the_same_request_once_and_books_the_saving() -> None:
    """The same trajectory, task and request is asked once; asking again books its calls and
    tokens as saved on the metered LLM; another trajectory or another request asks anew."""
    inner = FakeLLM()
    booked: list[mnemo.Usage] = []
    llm = LimitedLLM(inner, anyio.CapacityLimiter(4), booked.append)
    memo = TaskMemo("episode_1")
    request = semantic_request(
        goal="g", subgoal="s", steps=[{"index": 0, "observation": "walk", "action": "go"}]
    )
    first = await memo.ask(llm, "trajectory_a", request, parse_facts)
    again = await memo.ask(llm, "trajectory_a", request, parse_facts)
    assert again == first
    assert inner.tasks() == ["semantic"]
    saved = sum(booked, mnemo.Usage())
    assert (saved.calls, saved.saved_calls) == (1, 1)
    assert (saved.saved_input_tokens, saved.saved_output_tokens) == (1, 1)
    await memo.ask(llm, "trajectory_b", request, parse_facts)
    other = semantic_request(goal="g2", subgoal="s", steps=[])
    assert request_digest(other) != request_digest(request)
    await memo.ask(llm, "trajectory_a", other, parse_facts)
    assert inner.tasks() == ["semantic"] * 3
    assert len(memo) == 3


async def test_an_extraction_that_succeeds_hashes_no_request(
    events: EventLog, store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request is hashed only to find a result kept before or to store one: a close whose
    tasks all succeed hashes none; one that fails hashes what it stores, and the retry what
    it looks up."""
    hashed: list[str] = []

    def counted(request: mnemo.LLMRequest) -> str:
        hashed.append(request.task)
        return request_digest(request)

    monkeypatch.setattr(memo_module, "request_digest", counted)
    llm = FakeLLM()
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO)
        sid = await _collect(mem)
        await mem.close(sid)
        assert await events.wait_state(mem, sid, mnemo.State.READY) is mnemo.State.READY
        assert hashed == []
        await mem.commit(sid)
        sid = await _collect(mem)
        llm.fail_tasks.add("procedural")
        await mem.close(sid)
        assert await events.wait_state(mem, sid, mnemo.State.FAILED) is mnemo.State.FAILED
        assert sorted(hashed) == ["semantic", "semantic"]
        llm.fail_tasks.clear()
        hashed.clear()
        assert await mem.commit(sid) is None
        assert await events.wait_state(mem, sid, mnemo.State.READY) is mnemo.State.READY
        assert sorted(hashed) == ["semantic", "semantic"]


async def test_memo_keeps_nothing_when_the_task_fails() -> None:
    """A failed task is not kept: asking again calls the LLM again."""
    inner = FakeLLM()
    inner.fail_tasks.add("semantic")
    memo = TaskMemo("episode_1")
    request = semantic_request(goal="g", subgoal="s", steps=[])
    with pytest.raises(mnemo.LLMError):
        await memo.ask(inner, "t", request, parse_facts)
    inner.fail_tasks.clear()
    await memo.ask(inner, "t", request, parse_facts)
    assert inner.tasks() == ["semantic", "semantic"]


def _instruction(*steps: int) -> Instruction:
    return Instruction("i", "c", "do", "ok", steps=steps or None)


def test_cumulative_returns_score_the_reward_to_go() -> None:
    """Each instruction's return is the mean known reward from its first step to the end,
    mapped onto 1..10; unknown rewards are skipped, none known scores 5."""
    rewards = [0.0, 1.0, None, 1.0]
    scores = cumulative_returns(
        [_instruction(), _instruction(1), _instruction(3, 2), _instruction(9)],
        rewards,
    )
    assert scores == {0: 7, 1: 10, 2: 10, 3: 7}
    assert cumulative_returns([_instruction()], [None, None]) == {0: 5}
    assert cumulative_returns([_instruction()], [0.0]) == {0: 1}


async def test_kept_results_survive_a_restart_and_go_with_the_commit(tmp_path: Path) -> None:
    """What a failed extraction kept is stored with the episode: a Memory reopened on the file
    retries asking only the failed task, and once the episode is committed nothing of it is
    left in the store."""
    path = tmp_path / "m.db"
    first = FakeLLM()
    first.fail_tasks.add("procedural")
    events = EventLog()
    async with mnemo.Memory(path, llm=first, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO)
        sid = await _collect(mem)
        await mem.close(sid)
        assert await events.wait_state(mem, sid, mnemo.State.FAILED) is mnemo.State.FAILED
    assert "semantic" in first.tasks()
    assert _kept_rows(path) > 0

    second, events = FakeLLM(), EventLog()
    async with mnemo.Memory(path, llm=second, embedder=FakeEmbedder(), on_event=events) as mem:
        assert await mem.commit(sid) is None  # failed: retries the extraction
        assert await events.wait_state(mem, sid, mnemo.State.READY) is mnemo.State.READY
        # Semantic and the last reward were kept; return scoring had not been reached.
        assert set(second.tasks()) == {"procedural", "return"}
        assert Counter(second.tasks())["procedural"] == 2
        assert mem.usage(sid).saved_calls > 0
        receipt = await mem.commit(sid)
        assert receipt is not None
        committed = set(receipt.node_ids)
        nodes = await mem.get_nodes_by_type(REPO, [N.SEMANTIC, N.PROCEDURAL])
        kinds = Counter(n.type for n in nodes if n.id in committed)
        assert kinds[N.SEMANTIC] > 0
        assert kinds[N.PROCEDURAL] > 0
    assert _kept_rows(path) == 0


def _kept_rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM task_results").fetchone()[0])


async def test_a_reply_given_after_its_session_was_forgotten_is_not_kept(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory A extracts; Memory B forgets the session while A's model answers: what A's
    extraction keeps after the forget is not kept for the gone episode, so once it ended no
    row holds the episode's replies."""
    from mnemo.session.extracting import Extraction

    ended = anyio.Event()
    run = Extraction.run

    async def extraction(self: Extraction) -> object:
        try:
            return await run(self)
        finally:
            ended.set()

    monkeypatch.setattr(Extraction, "run", extraction)
    llm = FakeLLM()
    held = llm.hold("semantic")
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as a, \
            mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as b:
        await a.open_repo(REPO)
        sid = await _collect(a)
        await a.close(sid)
        await held.started.wait()
        assert await b.forget(REPO, sid) == 0
        held.release()
        with anyio.fail_after(10):
            await ended.wait()
        assert await sql(a, "SELECT task FROM task_results") == []
        assert await sql(a, "SELECT id FROM episodes") == []
