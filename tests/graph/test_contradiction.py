"""Contradicted facts are retired, not deleted: the offline heuristic, the commit
that retires, and its revert; on each backend."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

import mnemo
from mnemo.adapters._contradiction import contradicts
from mnemo.graph import history
from mnemo.graph.contradiction import Question
from mnemo.graph.model import Changeset, Link, LinkType, NodeDraft, NodeType
from mnemo.graph.ports import GraphStore, IntentPolicy
from tests.backends import open_stores
from tests.conftest import REPO
from tests.fakes import FakeEmbedder, FakeLLM
from tests.graph._support import DIM, axis, draft, embed, judged, policy

SUPERSEDES = LinkType.SUPERSEDES


@pytest.mark.parametrize(
    ("existing", "new", "expected"),
    [
        ("Dana lives in Lisbon.", "Dana lives in Porto.", True),
        ("nginx listens on port 8080", "nginx listens on port 8443", True),
        ("The cache is enabled.", "The cache is not enabled.", True),
        ("Dana moved to Lisbon in March", "Dana moved to Porto in June", True),
        ("Dana likes tea.", "Dana likes coffee.", False),
        ("Dana lives in Lisbon.", "Sam lives in Porto.", False),
        ("Dana lives in Lisbon.", "Dana lives in Lisbon.", False),
        ("Dana lives in Lisbon.", "Dana lives in Lisbon with her cat.", False),
        ("Caroline (8 May, 2023): I went to a support group and it was great",
         "Caroline (8 May, 2023): I went to the beach with friends", False),
    ],
)
def test_the_offline_heuristic(existing: str, new: str, expected: bool) -> None:
    """Same subject and functional relation with another value contradicts; relations that
    admit many values, other subjects and additions do not."""
    assert contradicts(existing, new) is expected


def fact(prefix: str, text: str, valid_from: datetime | None = None) -> Changeset:
    node = draft(f"{prefix}-fact", NodeType.SEMANTIC, text, axis(0))
    node = NodeDraft(node.id, node.type, node.text, node.data, node.vector,
                     valid_from=valid_from)
    return Changeset(f"{prefix}-cs", REPO, [node])


def judging() -> IntentPolicy:
    """The test policy, with the offline heuristic deciding contradictions."""
    base = policy()
    return IntentPolicy(base.identity_threshold, base.merge_threshold, base.merge,
                        judged(contradicts))


async def fact_times(graph: GraphStore, node_id: str) -> tuple[object, ...]:
    (node,) = await graph.get_nodes(REPO, [node_id])
    return node.valid_from, node.valid_to, node.retired_at


async def test_a_contradicted_fact_is_retired_and_revert_brings_it_back(store: str) -> None:
    """The newer fact retires the older (valid_to = when the newer began, retired_at = the
    commit's time, a SUPERSEDES link, listed as retired); reverting the newer commit brings
    the older back live."""
    march, june = datetime(2023, 3, 1, tzinfo=UTC), datetime(2023, 6, 1, tzinfo=UTC)
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        await graph.apply(fact("a", "Dana lives in Lisbon", march), intents=judging())
        await graph.apply(fact("b", "Dana lives in Porto", june), intents=judging())
        valid_from, valid_to, retired_at = await fact_times(graph, "a-fact")
        assert (valid_from, valid_to) == (march, june)
        assert retired_at is not None
        assert (await fact_times(graph, "b-fact"))[1:] == (None, None)
        assert Link("b-fact", "a-fact", SUPERSEDES) in await graph.links(REPO)
        newest = (await history.history(graph, REPO, 1))[0]
        assert newest.retired == ("a-fact",)
        diff = await history.diff(graph, REPO, "b-cs")
        assert [n.id for n in diff.retired] == ["a-fact"]
        assert diff.retired[0].retired

        with pytest.raises(mnemo.ConflictError):
            await history.revert(graph, REPO, "a-cs", embed=embed)
        await history.revert(graph, REPO, "b-cs", embed=embed)
        assert await fact_times(graph, "a-fact") == (march, None, None)
        assert await graph.links(REPO) == []


async def test_a_fact_of_an_earlier_time_is_the_one_retired(store: str) -> None:
    """Learning late that Dana lived in Lisbon in March, after "Porto since June", stores the
    Lisbon fact retired (valid until June), the Porto fact untouched."""
    march, june = datetime(2023, 3, 1, tzinfo=UTC), datetime(2023, 6, 1, tzinfo=UTC)
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        await graph.apply(fact("b", "Dana lives in Porto", june), intents=judging())
        await graph.apply(fact("a", "Dana lives in Lisbon", march), intents=judging())
        assert (await fact_times(graph, "a-fact"))[:2] == (march, june)
        assert (await fact_times(graph, "a-fact"))[2] is not None
        assert (await fact_times(graph, "b-fact"))[1:] == (None, None)
        assert Link("b-fact", "a-fact", SUPERSEDES) in await graph.links(REPO)


async def test_without_a_judge_nothing_is_retired(store: str) -> None:
    """A policy without `contradicts` keeps both facts live (and asks nothing)."""
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        await graph.apply(fact("a", "Dana lives in Lisbon"), intents=policy())
        await graph.apply(fact("b", "Dana lives in Porto"), intents=policy())
        assert (await fact_times(graph, "a-fact"))[1:] == (None, None)


async def test_ingests_retire_what_they_contradict(mem: mnemo.Memory) -> None:
    """Through the Memory: a later ingest that contradicts an earlier fact retires it, and
    the fact's node says so."""
    for source, text, date in (("m", "Dana lives in Lisbon.", "1 March 2023"),
                               ("j", "Dana lives in Porto.", "1 June 2023")):
        await mem.ingest(REPO, mnemo.Trajectory(f"chat on {date}", [
            mnemo.Step(text, "Note it.")]), source_id=source)
    facts = {n.text: n for n in await mem.get_nodes_by_type(REPO, [NodeType.SEMANTIC])}
    lisbon = next(n for t, n in facts.items() if "Lisbon" in t)
    porto = next(n for t, n in facts.items() if "Porto" in t)
    assert lisbon.retired
    assert lisbon.valid_to == datetime(2023, 6, 1, tzinfo=UTC)
    assert not porto.retired
    assert (await mem.history(REPO, limit=1))[0].retired == (lisbon.id,)


async def test_no_candidates_means_nothing_is_retired(
    store: str, llm: FakeLLM, embedder: FakeEmbedder
) -> None:
    """With Config.contradiction_candidates=0 no fact is retired and the LLM is never asked
    the "contradiction" task."""
    async with mnemo.Memory(store, llm=llm, embedder=embedder) as mem:
        await mem.open_repo(REPO, config=mnemo.Config(contradiction_candidates=0))
        for source, text in (("m", "Dana lives in Lisbon."), ("j", "Dana lives in Porto.")):
            await mem.ingest(REPO, mnemo.Trajectory("chat", [mnemo.Step(text, "Note it.")]),
                             source_id=source)
        facts = await mem.get_nodes_by_type(REPO, [NodeType.SEMANTIC])
    assert len(facts) == 2
    assert not any(f.retired for f in facts)
    assert "contradiction" not in {call.task for call in llm.calls}


def test_a_negative_candidate_count_is_invalid() -> None:
    """Config.contradiction_candidates must be an integer >= 0."""
    for bad in (-1, 1.5, True):
        with pytest.raises(mnemo.InvalidInputError):
            mnemo.Config(contradiction_candidates=bad)  # type: ignore[arg-type]


def facts(prefix: str, *texts: tuple[str, int]) -> Changeset:
    """One changeset of facts, each (text, the axis of its vector)."""
    nodes = [draft(f"{prefix}-{i}", NodeType.SEMANTIC, text, axis(k))
             for i, (text, k) in enumerate(texts)]
    return Changeset(f"{prefix}-cs", REPO, nodes)


async def test_a_commit_asks_one_question_for_all_its_facts(store: str) -> None:
    """Three new facts, each close to a live one: one call holds all three questions, with
    each one's close facts only; the one it ends is retired (nine calls before, one a pair)."""
    asked: list[list[tuple[str, tuple[str, ...]]]] = []

    async def judge(questions: Sequence[Question]) -> list[set[int]]:
        asked.append([(q.new, q.existing) for q in questions])
        return await judged(contradicts)(questions)

    base = policy()
    counting = IntentPolicy(base.identity_threshold, base.merge_threshold, base.merge, judge)
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        await graph.apply(facts("old", ("Dana lives in Lisbon", 0), ("Sam likes tea", 1),
                                ("the port is 8001", 2)), intents=counting)
        assert asked == []  # nothing close yet
        await graph.apply(facts("new", ("Dana lives in Porto", 0), ("Sam likes coffee", 1),
                                ("the port is 8002", 2)), intents=counting)
        assert len(asked) == 1
        assert sorted(asked[0]) == [
            ("Dana lives in Porto", ("Dana lives in Lisbon",)),
            ("Sam likes coffee", ("Sam likes tea",)),
            ("the port is 8002", ("the port is 8001",)),
        ]
        assert (await fact_times(graph, "old-0"))[2] is not None
        assert (await fact_times(graph, "old-1"))[2] is None


async def test_facts_far_from_every_live_one_ask_nothing(store: str) -> None:
    """New facts that share words with live ones but are not close to them (a cosine below
    `contradiction_similarity`) ask no question at all."""
    asked: list[object] = []

    async def judge(questions: Sequence[Question]) -> list[set[int]]:
        asked.append(questions)
        return [set() for _ in questions]

    base = policy()
    counting = IntentPolicy(base.identity_threshold, base.merge_threshold, base.merge, judge)
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        await graph.apply(facts("old", ("Dana lives in Lisbon", 0)), intents=counting)
        await graph.apply(facts("new", ("Dana lives in Porto", 3)), intents=counting)
        assert asked == []
        assert (await fact_times(graph, "old-0"))[2] is None
