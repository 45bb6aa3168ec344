"""Extraction: trajectories in parallel, last reward ∥ semantic ∥ procedural within each, then
returns; the changeset holds the 7 node types and 4 link types, deduplicated against batch and
graph."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import anyio.abc
import anyio.lowlevel
import pytest

import mnemo
from mnemo.calls.tasks import task_inputs
from tests.conftest import REPO
from tests.fakes import EventLog, FakeEmbedder, FakeLLM, js

N = mnemo.NodeType
L = mnemo.LinkType


class CountingLLM:
    """Holds every call of `task` until `n` of them are in flight at once, then lets them go."""

    def __init__(self, inner: FakeLLM, task: str, n: int) -> None:
        self.inner, self.task, self.n = inner, task, n
        self.in_flight = 0
        self.peak = 0
        self.all_in = anyio.Event()

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        if request.task == self.task:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            if self.in_flight >= self.n:
                self.all_in.set()
            with anyio.fail_after(5):
                await self.all_in.wait()
            self.in_flight -= 1
        return await self.inner.generate(request)


async def test_trajectories_extract_in_parallel(events: EventLog, store: str) -> None:
    """Every trajectory's semantic call is in flight at the same time."""
    inner = FakeLLM()
    llm = CountingLLM(inner, "semantic", 4)
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("explore", repo=REPO)
        for word in ("walk", "open", "read", "take"):
            await mem.append(sid, f"{word} it", "act")
        await mem.close_and_commit(sid)
    assert llm.peak == 4


async def test_semantic_and_procedural_run_side_by_side_and_score_the_last_step(
    events: EventLog, store: str
) -> None:
    """Within a trajectory, the semantic and procedural calls are in flight together: both
    are held, and both start; the procedural one scores the last step (no "reward" call),
    whose reward is stored; a one-instruction trajectory takes its return from the
    cumulative reward, without a "return" call."""
    inner = FakeLLM()
    inner.last_reward = 0.25
    async with mnemo.Memory(store, llm=inner, embedder=FakeEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, "walk north", "go north")
        held = [inner.hold(task) for task in ("semantic", "procedural")]
        await mem.close(sid)
        with anyio.fail_after(5):
            for hold in held:
                await hold.started.wait()
        for hold in held:
            hold.release()
        await events.wait_state(mem, sid, mnemo.State.READY)
        assert "return" not in inner.tasks()
        assert "reward" not in inner.tasks()
        receipt = await mem.commit(sid)
        assert receipt is not None
        steps = await mem.get_nodes_by_type(REPO, [N.EPISODIC])
        assert [s.data["reward"] for s in steps] == [0.25]


TWO_TRAJECTORIES = (("walk north", "go north"), ("walk south", "go south"),
                    ("open door", "push door"), ("open window", "push window"))


class ScoresThree(FakeLLM):
    """A `FakeLLM` whose "return" task scores every instruction 3 (the cumulative reward
    gives 7): a changeset holding 3 took the task's scores."""

    def _answer(self, task: str, inputs: dict[str, object]) -> mnemo.LLMResponse:
        response = super()._answer(task, inputs)
        if task == "return":
            data = js(response.data)
            return mnemo.LLMResponse(data={"scores": [{**s, "return_score": 3}
                                                      for s in data["scores"]]},
                                     usage=response.usage)
        return response


class SignallingEmbedder(FakeEmbedder):
    """A `FakeEmbedder` that sets `embedded` at its first call once `armed`."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.embedded = anyio.Event()

    async def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        vectors = await super().embed(texts)
        if self.armed:
            self.embedded.set()
        return vectors


async def _two_trajectories(mem: mnemo.Memory) -> str:
    await mem.open_repo(REPO)
    sid = await mem.start_session("explore the house", repo=REPO)
    for observation, action in TWO_TRAJECTORIES:
        await mem.append(sid, observation, action)
    return sid


class WritesLater(FakeLLM):
    """A `FakeLLM` that sends each request in a task of its own, as aiohttp does on Python
    3.11 (the bytes leave when the loop comes to that task), recording for each how many
    semantic requests had been made by then."""

    def __init__(self, tg: anyio.abc.TaskGroup) -> None:
        super().__init__()
        self.tg = tg
        self.made: list[str] = []
        self.written: list[tuple[str, int]] = []

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        self.made.append(request.task)
        self.tg.start_soon(self._write, request.task)
        await anyio.lowlevel.checkpoint()  # the reply comes on a later turn
        return await super().generate(request)

    async def _write(self, task: str) -> None:
        self.written.append((task, self.made.count("semantic")))


async def test_the_procedural_requests_are_written_before_any_semantic_one_is_made(
    events: EventLog, store: str
) -> None:
    """Round 2 waits for the procedural replies: every procedural request is written before
    any semantic request is made, also by a transport that writes in a task of its own."""
    async with anyio.create_task_group() as tg:
        llm = WritesLater(tg)
        async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(),
                                on_event=events) as mem:
            sid = await _two_trajectories(mem)
            mark = len(llm.written)
            await mem.close(sid)
            assert await events.wait_state(mem, sid, mnemo.State.READY) is mnemo.State.READY
    procedural = [made for task, made in llm.written[mark:] if task == "procedural"]
    assert procedural == [0, 0]


async def test_a_trajectory_s_returns_are_asked_while_its_facts_are_still_out(
    events: EventLog, store: str
) -> None:
    """A trajectory's "return" task needs only its procedural reply: it is asked while the
    semantic replies are held (a slow semantic reply does not delay round 2)."""
    llm = FakeLLM()
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        sid = await _two_trajectories(mem)
        facts, scores = llm.hold("semantic"), llm.hold("return")
        await mem.close(sid)
        with anyio.fail_after(5):
            while llm.tasks().count("return") < 2:
                await anyio.wait_all_tasks_blocked()
        assert llm.tasks().count("semantic") == 2
        facts.release()
        scores.release()
        assert await events.wait_state(mem, sid, mnemo.State.READY) is mnemo.State.READY
        receipt = await mem.commit(sid)
        assert receipt is not None
        kinds = [n.type for n in [await mem.get_node(REPO, i) for i in receipt.node_ids] if n]
        assert (kinds.count(N.SEMANTIC), kinds.count(N.PROCEDURAL)) == (4, 4)


async def test_the_changeset_is_embedded_while_the_returns_are_out(
    events: EventLog, store: str
) -> None:
    """Once every trajectory's first round is in, the changeset's texts are embedded while
    the "return" tasks are still out; their scores are in the changeset all the same."""
    llm, embedder = ScoresThree(), SignallingEmbedder()
    async with mnemo.Memory(store, llm=llm, embedder=embedder, on_event=events) as mem:
        sid = await _two_trajectories(mem)
        scores = llm.hold("return")
        embedder.armed = True
        await mem.close(sid)
        with anyio.fail_after(5):
            await scores.started.wait()
            await embedder.embedded.wait()
        scores.release()
        assert await events.wait_state(mem, sid, mnemo.State.READY) is mnemo.State.READY
        receipt = await mem.commit(sid)
        assert receipt is not None
        procedures = [n for n in [await mem.get_node(REPO, i) for i in receipt.node_ids]
                      if n and n.type is N.PROCEDURAL]
        assert [p.data["return_score"] for p in procedures] == [3, 3, 3, 3]


async def test_an_embedding_that_fails_during_the_returns_keeps_them_for_the_retry(
    events: EventLog, store: str
) -> None:
    """The embedder fails while the "return" tasks are out: the extraction fails once they
    are in, and keeps them, so the retry embeds again and asks no task again."""
    llm, embedder = FakeLLM(), SignallingEmbedder()
    async with mnemo.Memory(store, llm=llm, embedder=embedder, on_event=events) as mem:
        sid = await _two_trajectories(mem)
        scores = llm.hold("return")
        embedder.fail = True
        mark = len(llm.calls)
        await mem.close(sid)
        with anyio.fail_after(5):
            await scores.started.wait()
            while not embedder.raised:
                await anyio.wait_all_tasks_blocked()
        scores.release()
        assert await events.wait_state(mem, sid, mnemo.State.FAILED) is mnemo.State.FAILED
        assert sorted(llm.tasks()[mark:]) == [
            "procedural", "procedural", "return", "return", "semantic", "semantic"]
        embedder.fail = False
        mark = len(llm.calls)
        assert await mem.commit(sid) is None
        assert await events.wait_state(mem, sid, mnemo.State.READY) is mnemo.State.READY
        assert llm.tasks()[mark:] == []


async def test_changeset_has_every_node_and_link_type(mem: mnemo.Memory, llm: FakeLLM) -> None:
    """A committed episode yields all 7 node types, linked by the 4 link types as specified."""
    sid = await mem.start_session("explore the house", repo=REPO)
    await mem.append(sid, "walk north", "go north")
    await mem.append(sid, "walk east", "go east")
    await mem.append(sid, "open door", "push door")
    receipt = await mem.close_and_commit(sid)
    nodes = {n.id: n for n in [await mem.get_node(REPO, i) for i in receipt.node_ids] if n}
    assert {n.type for n in nodes.values()} == set(N)
    facts = [n for n in nodes.values() if n.type is N.SEMANTIC]
    procedures = [n for n in nodes.values() if n.type is N.PROCEDURAL]
    for fact in facts:
        tags = await mem.get_linked_nodes(REPO, [fact.id], L.MEMBERSHIP)
        assert [t.text for t in tags] == [fact.text.split()[1]]
        steps = await mem.get_linked_nodes(REPO, [fact.id], L.PROVENANCE)
        assert steps
        assert all(s.type is N.EPISODIC for s in steps)
    walk_facts = [f for f in facts if "walk" in f.text]
    siblings = await mem.get_linked_nodes(REPO, [walk_facts[0].id], L.SIBLING)
    assert [s.id for s in siblings] == [walk_facts[1].id]
    for procedure in procedures:
        intents = await mem.get_linked_nodes(REPO, [procedure.id], L.HIERARCHICAL)
        assert [i.type for i in intents] == [N.INTENT]
        assert procedure.data["return_score"] == 7
    episodic = [n for n in nodes.values() if n.type is N.EPISODIC]
    for step in episodic:
        linked = await mem.get_linked_nodes(REPO, [step.id])
        assert {n.type for n in linked} >= {N.SUBGOAL, N.SOURCE}
    assert [js(n.data)["reward"] for n in sorted(episodic, key=lambda n: js(n.data)["index"])] == [
        0.7, 0.7, 0.7
    ]


async def test_tags_dedup_against_the_graph(mem: mnemo.Memory) -> None:
    """A second session's concept with another casing reuses the existing TAG node."""
    for observation in ("walk north", "Walk south"):
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, observation, "go")
        await mem.close_and_commit(sid)
    tags = await mem.get_nodes_by_type(REPO, [N.TAG])
    assert [t.text for t in tags] == ["walk"]
    members = await mem.get_linked_nodes(REPO, [tags[0].id], L.MEMBERSHIP)
    assert sorted(m.text for m in members) == ["fact: Walk south", "fact: walk north"]


async def test_a_run_on_concept_is_left_out_on_every_backend(mem: mnemo.Memory) -> None:
    """A concept of thousands of characters (an LLM's run-on label) is no label: its fact
    commits on every backend without it (PostgreSQL refused its index entry, and the
    session stayed ready with a changeset it could never commit)."""
    long = "north" * 600
    for observation in (f"{long}a east", f"{long}b west"):
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, observation, "go")
        await mem.close_and_commit(sid)
    assert await mem.get_nodes_by_type(REPO, [N.TAG]) == []
    assert len(await mem.get_nodes_by_type(REPO, [N.SEMANTIC])) == 2


async def test_intent_merge_uses_the_llm_and_keeps_links(
    llm: FakeLLM, events: EventLog, store: str
) -> None:
    """An intent between the merge and identity thresholds is merged through the LLM into the
    existing node; the one procedure both sessions hold ("go") is linked to it, from both
    sessions' steps."""

    class TiltedEmbedder:
        """Intents "do walk" and "do run" at cosine 0.9; everything else orthogonal."""

        dim = 4

        async def embed(self, texts: Sequence[str]) -> list[list[float]]:
            table = {"do walk": [1.0, 0.0, 0.0, 0.0], "do run": [0.9, 0.43589, 0.0, 0.0]}
            return [table.get(t, [0.0, 0.0, 1.0, 0.0] if t.startswith("walk") else
                              [0.0, 0.0, 0.0, 1.0]) for t in texts]

    async with mnemo.Memory(store, llm=llm, embedder=TiltedEmbedder(), on_event=events) as mem:
        await mem.open_repo(REPO)
        for observation in ("walk north", "run east"):
            sid = await mem.start_session("explore", repo=REPO)
            await mem.append(sid, observation, "go")
            await mem.close_and_commit(sid)
        intents = await mem.get_nodes_by_type(REPO, [N.INTENT])
        assert [i.text for i in intents] == ["do walk"]
        merges = [task_inputs(r) for r in llm.calls if r.task == "merge_intent"]
        assert merges == [{"existing": "do walk", "new": "do run"}]
        (procedure,) = await mem.get_linked_nodes(REPO, [intents[0].id], L.HIERARCHICAL)
        assert procedure.text == "go"
        steps = await mem.get_linked_nodes(REPO, [procedure.id], L.PROVENANCE)
        assert sorted(str(s.data["observation"]) for s in steps) == ["run east", "walk north"]


@pytest.mark.parametrize("knows_batches", [True, False])
async def test_intent_merges_of_one_commit_reach_a_contract_model(
    store: str, knows_batches: bool
) -> None:
    """Several intents of one commit are merged in one "merge_intents" call; a model that
    answers only the contract's tasks ("merge_intent") still merges each of them, one call a
    pair (it left them unmerged, as new intents beside the old)."""
    llm = FakeLLM()
    if not knows_batches:
        llm.garbage_tasks.add("merge_intents")

    class TiltedEmbedder:
        """"do walk" ~ "do run" and "do swim" ~ "do dive" at cosine 0.9; other texts on
        one of four further axes (the subgoals of a session's two steps on two)."""

        dim = 8

        async def embed(self, texts: Sequence[str]) -> list[list[float]]:
            table = {"do walk": 0, "do run": 0, "do swim": 1, "do dive": 1}
            rows = []
            for text in texts:
                row = [0.0] * 8
                if text in table:
                    row[table[text]] = 0.9 if text in ("do run", "do dive") else 1.0
                    row[2 + table[text]] = 0.43589 if text in ("do run", "do dive") else 0.0
                else:
                    row[4 + sum(map(ord, text)) % 4] = 1.0
                rows.append(row)
            return rows

    async with mnemo.Memory(store, llm=llm, embedder=TiltedEmbedder()) as mem:
        await mem.open_repo(REPO)
        for pair in (("walk north", "swim east"), ("run south", "dive west")):
            sid = await mem.start_session("explore", repo=REPO)
            for observation in pair:
                await mem.append(sid, observation, "go")
            await mem.close_and_commit(sid)
        intents = await mem.get_nodes_by_type(REPO, [N.INTENT])
    assert sorted(i.text for i in intents) == ["do swim", "do walk"]
    asked = llm.tasks()
    assert "merge_intents" in asked  # asked again once when refused
    assert asked.count("merge_intent") == (0 if knows_batches else 2)


async def test_a_models_timeout_is_a_failed_extraction_whichever_model() -> None:
    """An embedder's timeout (`EmbeddingTimeout`) fails an extraction as an LLM's does
    ("extraction_failed"; "extraction_timeout" is the extraction's own deadline), and a
    deadline around the embedder passes it through as itself."""
    from mnemo.extraction.pipeline import failure_reason
    from mnemo.graph.vectors import embed_within

    assert failure_reason(mnemo.EmbeddingTimeout("slow")) == "extraction_failed"
    assert failure_reason(mnemo.LLMTimeout("slow")) == "extraction_failed"
    assert failure_reason(TimeoutError()) == "extraction_timeout"

    class Slow(FakeEmbedder):
        async def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
            raise TimeoutError("no answer")

    with pytest.raises(mnemo.EmbeddingTimeout) as caught:
        await embed_within(Slow(), ["x"], 5)
    assert isinstance(caught.value.__cause__, TimeoutError)


async def test_an_extraction_timeout_names_the_tasks_still_unanswered(store: str) -> None:
    """An extraction past `extraction_timeout` fails naming the task whose reply never came."""
    inner = FakeLLM()
    inner.hold("semantic")
    config = mnemo.Config(extraction_timeout=0.2)
    async with mnemo.Memory(store, llm=inner, embedder=FakeEmbedder(), config=config) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, "walk north", "go north")
        with pytest.raises(mnemo.PipelineError, match=r"\(unanswered: semantic\)"):
            await mem.close_and_commit(sid, max_retries=0)
        inner.release_all()
