"""ingest and forget: a trajectory in one call, idempotent by source id, and removable."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import mnemo
from mnemo import State
from mnemo.ingest.service import _digest
from tests.backends import sql
from tests.conftest import REPO, Enter
from tests.fakes import EventLog, FakeEmbedder, FakeLLM, js

N = mnemo.NodeType
L = mnemo.LinkType


def trajectory(*observations: str, goal: str = "explore") -> mnemo.Trajectory:
    return mnemo.Trajectory(
        goal,
        [mnemo.Step(o, f"do {o}", metadata={"turn": i}) for i, o in enumerate(observations)],
        metadata={"origin": "test"},
    )


async def test_ingest_stores_a_trajectory_and_keeps_step_metadata(mem: mnemo.Memory) -> None:
    """An ingest commits the trajectory's nodes; each EPISODIC node keeps its step metadata."""
    receipt = await mem.ingest(REPO, trajectory("walk north", "open door"), source_id="s1")
    assert receipt.created
    assert receipt.source_id == "s1"
    episodic = await mem.get_nodes_by_type(REPO, [N.EPISODIC])
    assert sorted(js(n.data)["metadata"]["turn"] for n in episodic) == [0, 1]
    assert {n.id for n in episodic} <= set(receipt.node_ids)
    for node_id in receipt.node_ids:
        assert await mem.get_node(REPO, node_id) is not None
    hits = await mem.recall(REPO, "open door")
    assert hits.memories


async def test_every_commit_to_the_graph_is_reported_as_changeset_applied(
    mem: mnemo.Memory, events: EventLog, enter: Enter
) -> None:
    """An ingest, a `remember`, a `correct` and a session's commit each report
    "changeset_applied" with the nodes it names (an app mirroring commits missed every ingested
    node: only sessions reported); an ingest that finds its source stored commits nothing and
    reports nothing."""
    def applied() -> list[tuple[str | None, list[str]]]:
        return [(e.session_id, list(e.data["node_ids"]))  # type: ignore[arg-type]
                for e in events.events if e.kind == "changeset_applied" and e.repo == REPO]

    ingested = await mem.ingest(REPO, trajectory("walk north"), source_id="s1")
    await mem.ingest(REPO, trajectory("walk north"), source_id="s1")
    remembered = await mem.remember(REPO, "The hall light is broken.", source_id="note")
    corrected = await mem.correct(REPO, remembered.node_ids[0], "The hall light works.")
    sid = await enter(State.IDLE)
    assert applied()[:3] == [(None, ingested.node_ids), (None, remembered.node_ids),
                             (None, corrected.node_ids)]
    assert [session for session, _ in applied()[3:]] == [sid]


async def test_same_payload_again_adds_nothing(mem: mnemo.Memory, llm: FakeLLM) -> None:
    """Ingesting the same payload under the same id returns the first receipt, created=False,
    and asks the LLM nothing."""
    first = await mem.ingest(REPO, trajectory("walk north"), source_id="s1")
    calls = len(llm.calls)
    again = await mem.ingest(REPO, trajectory("walk north"), source_id="s1")
    assert (again.source_id, again.node_ids, again.created) == ("s1", first.node_ids, False)
    assert len(llm.calls) == calls
    assert len(await mem.get_nodes_by_type(REPO, list(N))) == len(first.node_ids)


async def test_an_ingest_checks_its_trajectory_once(
    mem: mnemo.Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Memory.ingest` checks the trajectory once, before the store is read; the service and
    the payload's digest take it checked (each walked it again, a 32 MB payload three times)."""
    from mnemo.ingest import service

    checks: list[mnemo.Trajectory] = []
    check = service.check_ingest

    def counted(given: mnemo.Trajectory, source_id: str, progress: service.Progress | None,
                config: mnemo.Config) -> None:
        checks.append(given)
        check(given, source_id, progress, config)

    monkeypatch.setattr(service, "check_ingest", counted)
    await mem.ingest(REPO, trajectory("walk north", "open door"), source_id="s1")
    assert len(checks) == 1


async def test_different_payload_under_the_same_id_conflicts(mem: mnemo.Memory) -> None:
    """A different payload under a used source id raises ConflictError and stores nothing."""
    await mem.ingest(REPO, trajectory("walk north"), source_id="s1")
    before = len(await mem.get_nodes_by_type(REPO, list(N)))
    with pytest.raises(mnemo.ConflictError):
        await mem.ingest(REPO, trajectory("walk south"), source_id="s1")
    assert len(await mem.get_nodes_by_type(REPO, list(N))) == before


async def test_concurrent_identical_ingests_do_the_work_once(
    mem: mnemo.Memory, llm: FakeLLM
) -> None:
    """Concurrent identical ingests coalesce: one created=True, the rest created=False, one
    extraction."""
    receipts: list[mnemo.IngestReceipt] = []

    async def one() -> None:
        receipts.append(await mem.ingest(REPO, trajectory("walk north"), source_id="s1"))

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(one)
    assert sorted(r.created for r in receipts) == [False] * 4 + [True]
    assert len({tuple(r.node_ids) for r in receipts}) == 1
    assert llm.tasks().count("semantic") == 1


async def test_concurrent_ingests_of_a_conflicting_payload_all_conflict(
    mem: mnemo.Memory, llm: FakeLLM
) -> None:
    """Regression: of two identical calls whose payload differs from the one
    stored, the one that joined the other got `PipelineError("extraction_failed")` instead
    of the `ConflictError` it would have had alone."""
    await mem.ingest(REPO, trajectory("walk north"), source_id="s1")
    errors: list[Exception] = []

    async def one() -> None:
        try:
            await mem.ingest(REPO, trajectory("walk south"), source_id="s1")
        except mnemo.MnemoError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(2):
            tg.start_soon(one)
    assert [type(e) for e in errors] == [mnemo.ConflictError] * 2


async def test_an_ingest_joined_to_a_cancelled_one_does_the_work(
    mem: mnemo.Memory, llm: FakeLLM
) -> None:
    """A call that joined an identical one whose own caller cancelled it does the work
    itself (it got `PipelineError` with the other caller's cancellation as its cause)."""
    hold = llm.hold("semantic")
    leader = anyio.CancelScope()
    outcome: list[mnemo.IngestReceipt] = []

    async def first() -> None:
        with leader:
            await mem.ingest(REPO, trajectory("walk north"), source_id="s1")

    async def second() -> None:
        outcome.append(await mem.ingest(REPO, trajectory("walk north"), source_id="s1"))

    ingests = mem._ingests
    join = ingests._join
    joined = anyio.Event()

    async def spied(*args: Any) -> Any:
        joined.set()
        return await join(*args)

    ingests._join = spied  # type: ignore[method-assign, assignment]
    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        with anyio.fail_after(10):
            await hold.started.wait()  # the first call extracts
        tg.start_soon(second)
        # The second one waits for it (`wait_all_tasks_blocked` returned while the second
        # was still on a thread, and it then ran alone, passing without a join).
        with anyio.fail_after(10):
            await joined.wait()
        await anyio.wait_all_tasks_blocked()
        leader.cancel()
        hold.release()
    assert [r.created for r in outcome] == [True]
    assert len(await mem.get_nodes_by_type(REPO, [N.EPISODIC])) == 1


async def test_failed_extraction_stores_nothing(mem: mnemo.Memory, llm: FakeLLM) -> None:
    """An ingest whose extraction fails raises PipelineError("extraction_failed"), stores
    nothing, and leaves the id free."""
    llm.fail_tasks.add("semantic")
    with pytest.raises(mnemo.PipelineError) as caught:
        await mem.ingest(REPO, trajectory("walk north"), source_id="s1")
    assert caught.value.reason == "extraction_failed"
    assert await mem.get_nodes_by_type(REPO, list(N)) == []
    llm.fail_tasks.clear()
    assert (await mem.ingest(REPO, trajectory("walk north"), source_id="s1")).created


async def test_an_annotation_past_its_time_limit_fails_as_an_appends(
    mem: mnemo.Memory, llm: FakeLLM
) -> None:
    """A step whose annotation outlasts `append_timeout + extraction_timeout` fails the ingest
    as it fails a session's close: PipelineError("extraction_failed") caused by an
    LLMTimeout; nothing is stored."""
    await mem.open_repo("slow", config=mnemo.Config(append_timeout=0.1, extraction_timeout=0.1))
    held = llm.hold("state")
    try:
        with pytest.raises(mnemo.PipelineError) as caught:
            await mem.ingest("slow", trajectory("walk north"), source_id="s1")
    finally:
        held.release()
    assert caught.value.reason == "extraction_failed"
    assert isinstance(caught.value.__cause__, mnemo.LLMTimeout)
    assert await mem.get_nodes_by_type("slow", list(N)) == []


async def test_idempotence_survives_reopening(store: str) -> None:
    """The source id is remembered in the store: after reopening, the same payload is not
    ingested again."""
    for attempt in range(2):
        llm = FakeLLM()
        async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
            await mem.open_repo(REPO)
            receipt = await mem.ingest(REPO, trajectory("walk north"), source_id="s1")
            assert receipt.created is (attempt == 0)


async def test_forget_removes_what_the_source_produced(mem: mnemo.Memory) -> None:
    """forget deletes the source's nodes and the tags left unlinked, keeps tags another source
    still uses, frees the id, and nothing of it can be recalled."""
    kept = await mem.ingest(REPO, trajectory("walk east"), source_id="keep")
    gone = await mem.ingest(REPO, trajectory("walk north", "open door"), source_id="gone")
    count = await mem.forget(REPO, "gone")
    remaining = await mem.get_nodes_by_type(REPO, list(N))
    assert {n.id for n in remaining} == set(kept.node_ids)
    assert count == len(gone.node_ids)
    assert sorted(t.text for t in await mem.get_nodes_by_type(REPO, [N.TAG])) == ["walk"]
    hits = await mem.recall(REPO, "open door")
    assert all(m.node.id in set(kept.node_ids) for m in hits.memories)
    assert await mem.forget(REPO, "gone") == 0
    assert (await mem.ingest(REPO, trajectory("open window"), source_id="gone")).created


async def test_a_source_whose_nodes_were_deleted_by_hand_ingests_anew(mem: mnemo.Memory) -> None:
    """After `delete_nodes` of everything a source made, the same payload ingests anew
    (created, its nodes back); after deleting a part, the receipt names only live nodes. The
    receipt named deleted ids and the source stayed empty."""
    first = await mem.ingest(REPO, trajectory("walk north"), source_id="a")
    await mem.delete_nodes(REPO, first.node_ids)
    again = await mem.ingest(REPO, trajectory("walk north"), source_id="a")
    assert again.created
    assert all([await mem.get_node(REPO, i) for i in again.node_ids])
    assert [m.node.text for m in (await mem.recall(REPO, "walk north")).memories]
    other = await mem.ingest(REPO, trajectory("open door"), source_id="b")
    (fact,) = [i for i in other.node_ids if i.startswith("episodic_")]
    await mem.delete_nodes(REPO, [fact])
    kept = await mem.ingest(REPO, trajectory("open door"), source_id="b")
    assert not kept.created
    assert kept.node_ids == [i for i in other.node_ids if i != fact]
    assert all([await mem.get_node(REPO, i) for i in kept.node_ids])


@pytest.mark.parametrize(
    ("source_id", "payload"),
    [
        ("", trajectory("walk")),
        ("s", mnemo.Trajectory("  ", [])),
        ("s", mnemo.Trajectory("g", [mnemo.Step(3, "x")])),  # type: ignore[arg-type]
        ("s", mnemo.Trajectory("g", [mnemo.Step("o", "a", metadata={"x": object()})])),
    ],
)
async def test_bad_input_is_refused_before_anything_is_stored(
    mem: mnemo.Memory, source_id: str, payload: mnemo.Trajectory
) -> None:
    """Malformed ingests raise InvalidInputError and store nothing."""
    with pytest.raises(mnemo.InvalidInputError):
        await mem.ingest(REPO, payload, source_id=source_id)
    assert await mem.get_nodes_by_type(REPO, list(N)) == []


@pytest.mark.parametrize("same_payload", [True, False])
async def test_one_source_ingested_through_two_memories_at_once(
    store: str, same_payload: bool
) -> None:
    """Two Memory objects ingest one source at once: the first claims it and asks its model;
    the second asks none, waits for that commit and gets its receipt (created=False), or is
    ConflictError at once for another payload."""
    llms = [FakeLLM(), FakeLLM()]
    held = llms[0].hold("semantic")
    async with (
        mnemo.Memory(store, llm=llms[0], embedder=FakeEmbedder()) as a,
        mnemo.Memory(store, llm=llms[1], embedder=FakeEmbedder()) as b,
    ):
        await a.open_repo(REPO)
        await b.open_repo(REPO)
        results: dict[str, mnemo.IngestReceipt | Exception] = {}

        async def ingest(name: str, mem: mnemo.Memory, text: str) -> None:
            try:
                results[name] = await mem.ingest(REPO, trajectory(text), source_id="s1")
            except mnemo.MnemoError as exc:
                results[name] = exc

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ingest, "a", a, "walk north")
                await held.started.wait()  # A holds the claim: its extraction asks
                tg.start_soon(ingest, "b", b, "walk north" if same_payload else "walk south")
                if not same_payload:
                    while "b" not in results:
                        await anyio.wait_all_tasks_blocked()
                held.release()
        first, second = results["a"], results["b"]
        assert isinstance(first, mnemo.IngestReceipt)
        assert first.created
        if same_payload:
            assert isinstance(second, mnemo.IngestReceipt)
            assert (second.created, second.node_ids) == (False, first.node_ids)
        else:
            assert isinstance(second, mnemo.ConflictError)
            assert "being ingested" in str(second)
        assert llms[1].calls == []
        stored = await b.get_nodes_by_type(REPO, list(N))
        assert sorted(n.id for n in stored) == sorted(first.node_ids)


async def test_a_claim_of_a_gone_or_failed_ingest_is_taken(store: str) -> None:
    """A source claimed by a holder no longer seen is ingested at once; one whose ingest
    failed in another Memory (its claim released) is ingested by the next caller."""
    async with (
        mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as a,
        mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as b,
    ):
        await a.open_repo(REPO)
        await sql(a, "INSERT INTO source_claims(repo, source_id, payload_hash, holder)"
                     " VALUES (?, 's1', 'x', 'gone-holder')", REPO)
        with anyio.fail_after(10):
            assert (await a.ingest(REPO, trajectory("walk north"), source_id="s1")).created
        failing = FakeLLM()
        failing.fail_tasks.add("semantic")
        async with mnemo.Memory(store, llm=failing, embedder=FakeEmbedder()) as c:
            with pytest.raises(mnemo.PipelineError):
                await c.ingest(REPO, trajectory("walk east"), source_id="s2")
            assert await sql(a, "SELECT count(*) FROM source_claims") == [(0,)]
            with anyio.fail_after(10):  # c, alive, holds no claim
                assert (await b.ingest(REPO, trajectory("walk east"), source_id="s2")).created
        assert await sql(a, "SELECT count(*) FROM source_claims") == [(0,)]


async def test_a_claim_its_live_holder_kept_holds_an_identical_ingest_back_for_a_while(
    store: str,
) -> None:
    """A claim a live Memory kept (its release failed) makes an identical ingest elsewhere
    wait at most `extraction_timeout` and `lease_timeout`, then ingest itself; another
    payload is ConflictError at once."""
    config = mnemo.Config(extraction_timeout=0.5, lease_timeout=1.0)
    async with (
        mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder(), config=config) as a,
        mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder(), config=config) as b,
    ):
        await a.open_repo(REPO)
        await a.ingest(REPO, trajectory("walk north"), source_id="s0")  # a is a live holder
        walk = trajectory("walk west")
        await sql(a, "INSERT INTO source_claims(repo, source_id, payload_hash, holder)"
                     " VALUES (?, 's1', ?, ?)", REPO, _digest(walk, None), a._live.holder_id)
        with pytest.raises(mnemo.ConflictError, match="being ingested"):
            await b.ingest(REPO, trajectory("walk south"), source_id="s1")
        with anyio.fail_after(10):
            assert (await b.ingest(REPO, walk, source_id="s1")).created


async def test_a_fact_two_sources_state_is_one_node_that_outlives_either(
    mem: mnemo.Memory,
) -> None:
    """Two sources state the same fact, each in its own case: one node, both sources' steps
    its evidence (consolidate has nothing to merge). Forgetting the first leaves it in the
    second's wording, source and evidence only; forgetting the second removes it."""
    first = await mem.ingest(REPO, trajectory("the kettle is in the kitchen"), source_id="a")
    second = await mem.ingest(REPO, trajectory("The kettle is in the kitchen"), source_id="b")
    [fact] = await mem.get_nodes_by_type(REPO, [N.SEMANTIC])
    assert fact.id in first.node_ids
    assert fact.id not in second.node_ids
    steps = {n.id for n in await mem.get_linked_nodes(REPO, [fact.id], L.PROVENANCE)}
    assert steps == {i for i in (*first.node_ids, *second.node_ids) if i.startswith("episodic")}
    assert (await mem.consolidate(REPO)).merged == 0
    await mem.forget(REPO, "a")
    [kept] = await mem.get_nodes_by_type(REPO, [N.SEMANTIC])
    assert (kept.id, kept.text) == (fact.id, "fact: The kettle is in the kitchen")
    assert {n.id for n in await mem.get_linked_nodes(REPO, [fact.id], L.PROVENANCE)} == {
        i for i in second.node_ids if i.startswith("episodic")}
    assert await sql(mem, "SELECT source_id FROM nodes WHERE id = ?", fact.id) == [("b",)]
    hits = await mem.recall(REPO, "the kettle is in the kitchen", types=[N.SEMANTIC])
    assert {m.node.id for m in hits.memories} == {fact.id}
    await mem.forget(REPO, "b")
    assert await mem.get_nodes_by_type(REPO, [N.SEMANTIC, N.PROCEDURAL]) == []
