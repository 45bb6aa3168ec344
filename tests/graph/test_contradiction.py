"""Contradicted facts are retired, not deleted: the offline heuristic, the commit
that retires, and its revert; on each backend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

import pytest

import mnemo
from mnemo.graph import history
from mnemo.graph.contradiction import Question, contradicts
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
        # Each is about something specific the other never says: two things.
        ("pear2 listens on port 9002.", "pear3 listens on port 9003.", False),
        ("The service number 2 named pear2 listens on port 9002.",
         "The service number 3 named pear3 listens on port 9003.", False),
        ("web1 runs nginx 1.24.", "web2 runs nginx 1.25.", False),
        # A date, version or label leading the fact is not what it is about: an update.
        ("[8 May 2023] Caroline lives in Boston.", "[20 June 2023] Caroline moved to Seattle.",
         True),
        ("Since v2.1 the service listens on port 8080.",
         "Since v2.4 the service listens on port 9090.", True),
        ("Sprint 12: the service runs on port 8080.", "Sprint 13: the service runs on port 8443.",
         True),
        ("Dana lives in Lisbon.", "Dana lives in Lisbon.", False),
        ("Dana lives in Lisbon.", "Dana lives in Lisbon with her cat.", False),
        ("Caroline (8 May, 2023): I went to a support group and it was great",
         "Caroline (8 May, 2023): I went to the beach with friends", False),
        # Same subject, other value, in other words.
        ("Dana lives in Lisbon.", "Dana moved to Porto.", True),
        ("Dana lives in Lisbon.", "Dana moved from Lisbon to Porto in June.", True),
        ("Dana lives in Lisbon.", "Dana no longer lives in Lisbon.", True),
        ("gunicorn listens on 127.0.0.1:8001, not 8000.", "Bind gunicorn to 127.0.0.1:8000.",
         True),
        ("The cache TTL is five minutes.", "The cache TTL is now ten minutes.", True),
        ("The API rate limit is 120 requests per minute.",
         "The API rate limit was raised to 500 requests per minute.", True),
        ("Deploys happen every Tuesday at 10am.", "Deploys now happen on Wednesdays at 9am.",
         True),
        ("We use MySQL.", "We switched from MySQL to Postgres.", True),
        ("Melanie works as a nurse.", "Melanie quit her job and now works as a teacher.", True),
        ("Compute the trip budget: 189 EUR flights plus 4 nights at 110 EUR is 629 EUR, "
         "leaving 271 EUR for food and transport.",
         "The new trip budget leaves 362 EUR for food and transport.", True),
        # Other relations, other subjects, or not a value.
        ("Dana likes Lisbon.", "Dana likes Porto.", False),
        ("Dana lives in Lisbon.", "Dana works in Berlin.", False),
        ("Dana lives in Lisbon.", "Dana now works in Porto.", False),
        ("Dana is vegetarian and eats no fish.", "Dana is allergic to nuts.", False),
        ("The staging database runs on port 5433.", "The production database runs on port 5432.",
         False),
        ("Lena (@lena-ops) is the on-call engineer.", "Tom (@tom-sre) is the on-call engineer.",
         False),
        ("Caroline (8 May, 2023): I am so excited about the pride parade",
         "Caroline (20 May, 2023): I am so excited about my new job", False),
        ("The deploy script still passes --bind 127.0.0.1:8001.",
         "Bind gunicorn to 127.0.0.1:8000.", False),
        ("The blog runs on gunicorn behind nginx.", "The blog runs 12 gunicorn workers.", False),
        # Remarks and tool output (LoCoMo dev, the demo).
        ("Caroline: That bowl is gorgeous!", "Caroline: Those bowls are amazing!", False),
        ("Melanie: I'm a big fan of pottery.",
         "Caroline: I haven't done pottery yet, but I'm game for trying new art.", False),
        ("Tool output: test_upload with the moto S3 mock now fails: "
         "botocore.exceptions.NoRegionError: You must specify a region.",
         "The S3 mock needs AWS_DEFAULT_REGION set.", False),
        ("Django now answers 400 Bad Request through the nginx reverse proxy.",
         'Add `"OPTIONS": {"prepare_threshold": None}` to the Django DATABASES entry.', False),
    ],
)
def test_the_offline_heuristic(existing: str, new: str, expected: bool) -> None:
    """Same subject and relation with another value contradicts, however the new fact words
    the change; relations that admit many values, other relations, other subjects and
    additions do not."""
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


async def test_a_fact_retires_only_facts_of_its_own_scope(store: str) -> None:
    """Bob's "Dana lives in Porto" leaves Alice's "Dana lives in Lisbon" live; Alice's own
    later fact retires it."""
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        for prefix, text, user in (("a", "Dana lives in Lisbon", "alice"),
                                   ("b", "Dana lives in Porto", "bob")):
            await graph.apply(replace(fact(prefix, text), metadata={"user_id": user}),
                              intents=judging())
        assert (await fact_times(graph, "a-fact"))[1:] == (None, None)
        await graph.apply(replace(fact("c", "Dana lives in Porto"),
                                  metadata={"user_id": "alice"}), intents=judging())
        assert (await fact_times(graph, "a-fact"))[2] is not None
        assert (await fact_times(graph, "b-fact"))[1:] == (None, None)


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


@pytest.mark.parametrize("reply", ["prose", "error"])
async def test_a_model_that_cannot_judge_retires_by_the_offline_heuristic(
    store: str, embedder: FakeEmbedder, reply: str
) -> None:
    """A model that answers only the contract's tasks (prose to "contradiction") still
    retires "Dana lives in Lisbon" once "Dana lives in Porto" is learnt: the offline heuristic
    judges the pairs (both stayed live). A model that fails (an error, a timeout) retires
    nothing: not knowing is not contradicting."""
    llm = FakeLLM()
    (llm.garbage_tasks if reply == "prose" else llm.fail_tasks).add("contradiction")
    async with mnemo.Memory(store, llm=llm, embedder=embedder) as mem:
        await mem.open_repo(REPO)
        for source, text in (("m", "Dana lives in Lisbon."), ("j", "Dana lives in Porto.")):
            await mem.ingest(REPO, mnemo.Trajectory("chat", [mnemo.Step(text, "Note it.")]),
                             source_id=source)
        facts = {f.text: f for f in await mem.get_nodes_by_type(REPO, [NodeType.SEMANTIC])}
    assert "contradiction" in llm.tasks()
    assert [t for t, f in facts.items() if f.retired] == (
        ["fact: Dana lives in Lisbon."] if reply == "prose" else [])


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


def told(prefix: str, *steps: tuple[str, ...]) -> Changeset:
    """One changeset of a session: a step per item (its index), each with facts (all on one
    axis: close to each other) linked to it by PROVENANCE, listed newest step first."""
    nodes: list[NodeDraft] = []
    links: list[Link] = []
    for index, texts in reversed(list(enumerate(steps))):
        step = draft(f"{prefix}-step{index}", NodeType.EPISODIC, f"step {index}", axis(1),
                     {"index": index})
        nodes.append(step)
        for i, text in enumerate(texts):
            nodes.append(draft(f"{prefix}-{index}-{i}", NodeType.SEMANTIC, text, axis(0)))
            links.append(Link(f"{prefix}-{index}-{i}", step.id, LinkType.PROVENANCE))
    return Changeset(f"{prefix}-cs", REPO, nodes, links)


async def test_a_later_step_retires_what_an_earlier_one_of_its_changeset_said(
    store: str,
) -> None:
    """Within one changeset, a fact of a later step (or later in the same step) retires the
    fact it contradicts from an earlier one, whatever their order in the changeset; a chain of
    corrections retires each in turn; revert takes the whole commit away."""
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        await graph.apply(told("a", ("gunicorn listens on 127.0.0.1:8001, not 8000.",
                                     "Bind gunicorn to 127.0.0.1:8000."),
                               ("The cache TTL is five minutes.",),
                               ("The cache TTL is now ten minutes.",),
                               ("The cache TTL is now twenty minutes.",)),
                          intents=judging())
        retired = {n.text: n for n in await graph.get_nodes_by_type(REPO, [NodeType.SEMANTIC])
                   if n.retired}
        assert sorted(retired) == ["The cache TTL is five minutes.",
                                   "The cache TTL is now ten minutes.",
                                   "gunicorn listens on 127.0.0.1:8001, not 8000."]
        links = set(await graph.links(REPO))
        assert {Link("a-0-1", "a-0-0", SUPERSEDES), Link("a-2-0", "a-1-0", SUPERSEDES),
                Link("a-3-0", "a-2-0", SUPERSEDES)} <= links
        assert sorted((await history.history(graph, REPO, 1))[0].retired) == [
            "a-0-0", "a-1-0", "a-2-0"]
        await history.revert(graph, REPO, "a-cs", embed=embed)
        assert await graph.get_nodes_by_type(REPO, [NodeType.SEMANTIC]) == []


async def test_a_fact_saying_nothing_new_is_not_asked_about(store: str) -> None:
    """A new fact close to a live one or to an earlier one of its changeset, whose words are
    all that one's (a small model's repeat, a part of it), ends nothing: the model is not
    asked about the pair (deduplication joins them); a fact that says something else is."""
    asked: list[Question] = []

    async def recording(questions: Sequence[Question]) -> list[set[int]]:
        asked.extend(questions)
        return [set() for _ in questions]

    base = policy()
    intents = IntentPolicy(base.identity_threshold, base.merge_threshold, base.merge, recording)
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        await graph.apply(fact("a", "The blog runs on gunicorn behind nginx."), intents=intents)
        assert asked == []
        await graph.apply(told("b", ("The blog runs on gunicorn behind nginx",
                                     "the blog runs on gunicorn.")), intents=intents)
        assert asked == []
        await graph.apply(fact("c", "The blog runs on uvicorn behind nginx."), intents=intents)
        assert [(q.new, q.existing) for q in asked] == [
            ("The blog runs on uvicorn behind nginx.",
             ("The blog runs on gunicorn behind nginx.",))]
        # Words all the old one's, but the old one adds a negation: asked.
        asked.clear()
        await graph.apply(fact("d", "The cache is not enabled."), intents=intents)
        await graph.apply(fact("e", "The cache is enabled."), intents=intents)
        assert any(q.new == "The cache is enabled." and "The cache is not enabled." in q.existing
                   for q in asked), asked
