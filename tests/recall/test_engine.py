"""The recall pipeline over a small hand-made graph: hybrid hop 0, hops through routes,
provenance, value, reinforcement, planning and synthesis."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterable

import pytest

import mnemo
from mnemo.adapters.offline import OfflineLLM
from mnemo.graph.model import Changeset, Link, LinkType, NodeDraft, NodeType
from mnemo.graph.ports import GraphStore
from mnemo.ports import LLMRequest, LLMResponse
from mnemo.recall.engine import Recaller, RecallResult
from mnemo.recall.tasks import LLMReranker
from tests.backends import open_stores
from tests.graph._support import policy

REPO = "r"
EMBEDDER = mnemo.HashEmbedder()

# id, type, text
NODES = [
    ("s-nginx", NodeType.SEMANTIC, "nginx listens on port 8080 behind the load balancer"),
    ("s-pg", NodeType.SEMANTIC, "postgres keeps its data under var lib postgresql"),
    ("t-web", NodeType.TAG, "webserver"),
    ("t-db", NodeType.TAG, "database"),
    ("i-restart", NodeType.INTENT, "restart the webserver"),
    ("p-reload", NodeType.PROCEDURAL, "run systemctl reload nginx after editing the config"),
    ("e-step", NodeType.EPISODIC, "observed an error log full of 502 responses"),
]
LINKS = [
    Link("t-web", "s-nginx", LinkType.MEMBERSHIP),
    Link("t-db", "s-pg", LinkType.MEMBERSHIP),
    Link("i-restart", "p-reload", LinkType.HIERARCHICAL),
    Link("s-nginx", "e-step", LinkType.PROVENANCE),
]


async def build(
    graph: GraphStore, nodes: list[tuple[str, NodeType, str]], links: list[Link], repo: str = REPO
) -> None:
    vectors = await EMBEDDER.embed([text for _, _, text in nodes])
    drafts = [
        NodeDraft(node_id, kind, text, {}, vectors[i], key=text if kind is NodeType.TAG else None)
        for i, (node_id, kind, text) in enumerate(nodes)
    ]
    await graph.apply(Changeset(f"cs-{repo}", repo, drafts, links), intents=policy())


@pytest.fixture
async def graph(store: str) -> AsyncIterator[GraphStore]:
    async with open_stores(store, EMBEDDER.dim) as backend:
        await build(backend.graph, NODES, LINKS)
        yield backend.graph


async def run(
    graph: GraphStore,
    query: str,
    *,
    k: int = 10,
    types: Iterable[NodeType] | None = None,
    config: mnemo.Config | None = None,
    repo: str = REPO,
) -> RecallResult:
    offline = OfflineLLM()
    recaller = Recaller(graph, EMBEDDER, config or mnemo.Config(), planner=offline, llm=offline)
    result = await recaller.recall(repo, query, k=k, types=types)
    check_invariants(result, k, config or mnemo.Config())
    return result


def check_invariants(result: RecallResult, k: int, config: mnemo.Config) -> None:
    """What holds for every recall: at most k, best first, each node once, hop scores decayed."""
    memories = result.memories
    assert len(memories) <= k
    ids = [m.node.id for m in memories]
    assert len(ids) == len(set(ids))
    assert all(a.score >= b.score for a, b in itertools.pairwise(memories))
    for m in memories:
        assert (m.phase in {"hop", "provenance"}) == (m.hop >= 1)
        assert m.phase in {"hybrid", "lexical", "dense", "hop", "route", "bridge", "provenance"}
        assert 0.0 < m.score <= 1.0 + 1e-9
    assert {t.node_id for t in result.touched} >= set(ids)
    assert set(result.trace) >= {"plan", "embed", "hop0", "hops", "rank", "reinforce"}


def by_id(result: RecallResult) -> dict[str, mnemo.Recalled]:
    return {m.node.id: m for m in result.memories}


async def test_the_matching_node_comes_first(graph: GraphStore) -> None:
    """The node whose text is the query is first, found by both channels at hop 0."""
    result = await run(graph, "postgres keeps its data under var lib postgresql")
    first = result.memories[0]
    assert first.node.id == "s-pg"
    assert (first.phase, first.hop) == ("hybrid", 0)
    assert result.query == "postgres keeps its data under var lib postgresql"
    assert result.reasoned is None


async def test_type_filter_still_reaches_facts_through_tags(graph: GraphStore) -> None:
    """With types=SEMANTIC, a query matching only a tag still finds the fact under it, one
    hop away."""
    result = await run(graph, "webserver", types=[NodeType.SEMANTIC])
    found = by_id(result)
    assert set(found) <= {"s-nginx", "s-pg"}
    assert "s-nginx" in found
    assert found["s-nginx"].hop >= 1 or found["s-nginx"].phase != "hop"
    assert all(m.node.type is NodeType.SEMANTIC for m in result.memories)


async def test_type_filter_reaches_procedures_through_intents(graph: GraphStore) -> None:
    """A query for an intent's wording finds the procedure under it."""
    result = await run(graph, "restart the webserver", types=[NodeType.PROCEDURAL])
    assert [m.node.id for m in result.memories] == ["p-reload"]


async def test_routing_nodes_rank_below_the_memories_they_lead_to(graph: GraphStore) -> None:
    """Without a type filter a tag matching the query exactly ranks after every memory found
    (a route, not an answer); asked for by type, it is first."""
    everything = (await run(graph, "webserver")).memories
    memories = (NodeType.SEMANTIC, NodeType.EPISODIC, NodeType.PROCEDURAL)
    kinds = [m.node.type in memories for m in everything]
    assert "t-web" in [m.node.id for m in everything]
    assert kinds == sorted(kinds, reverse=True)
    assert any(kinds)
    tags_only = await run(graph, "webserver", types=[NodeType.TAG])
    assert tags_only.memories[0].node.id == "t-web"


async def test_an_episodic_hit_brings_its_source_at_half_its_score(graph: GraphStore) -> None:
    """Provenance: the SOURCE of an episodic hit comes in at half the hit's relevance."""
    await build(
        graph,
        [("e-src", NodeType.EPISODIC, "gunicorn crashed at boot"),
         ("src", NodeType.SOURCE, "deploy the blog")],
        [Link("e-src", "src", LinkType.PROVENANCE)],
        repo="p",
    )
    result = await run(graph, "gunicorn crashed at boot", repo="p")
    touched = {str(t.node_id): t for t in result.touched}
    assert touched["src"].phase == "provenance"
    assert touched["src"].hop == 1


async def test_k_limits_the_results(graph: GraphStore) -> None:
    """k bounds how many memories come back."""
    result = await run(graph, "nginx postgres webserver database error", k=2)
    assert len(result.memories) == 2


async def test_an_unmatched_query_on_an_empty_repo_finds_nothing(graph: GraphStore) -> None:
    """A repo with no nodes returns no memories."""
    result = await run(graph, "anything at all", repo="empty")
    assert result.memories == []


async def test_recall_reinforces_what_it_returns(graph: GraphStore) -> None:
    """Every returned node's access count goes up by one per recall, with its last access."""
    result = await run(graph, "postgres data", k=1)
    returned = result.memories[0].node.id
    await run(graph, "postgres data", k=1)
    stats = await graph.access_stats(REPO, [returned, "t-db"])
    assert stats[returned][0] == 2
    assert stats[returned][1] is not None
    assert stats["t-db"][0] == 0


async def test_value_prefers_the_rewarded_of_two_equal_memories(graph: GraphStore) -> None:
    """Of two steps equally relevant, the one with the higher reward ranks first; with
    value_weight 0 only relevance counts."""
    vectors = await EMBEDDER.embed(["deploy failed on friday"] * 2)
    drafts = [
        NodeDraft("low", NodeType.EPISODIC, "deploy failed on friday", {"reward": 0.1},
                  vectors[0]),
        NodeDraft("high", NodeType.EPISODIC, "deploy failed on friday", {"reward": 0.9},
                  vectors[1]),
    ]
    await graph.apply(Changeset("cs-v", "v", drafts, []), intents=policy())
    valued = await run(graph, "deploy failed", repo="v")
    assert [m.node.id for m in valued.memories] == ["high", "low"]
    assert valued.memories[0].score < 1.0
    flat = await run(graph, "deploy failed", repo="v", config=mnemo.Config(value_weight=0.0))
    assert flat.memories[0].score == pytest.approx(1.0)  # relevance alone: first in both


async def test_one_memory_per_step(graph: GraphStore) -> None:
    """A fact and the step it came from are one memory: only the better of them is returned,
    unless recall_distinct_steps is off."""
    await build(
        graph,
        [("fact", NodeType.SEMANTIC, "the cache lives in redis on port 6379"),
         ("step", NodeType.EPISODIC, "the cache lives in redis on port 6379 said the admin")],
        [Link("fact", "step", LinkType.PROVENANCE)],
        repo="d",
    )
    distinct = await run(graph, "redis cache port", repo="d")
    assert len({m.node.id for m in distinct.memories} & {"fact", "step"}) == 1
    both = await run(graph, "redis cache port", repo="d",
                     config=mnemo.Config(recall_distinct_steps=False))
    assert {m.node.id for m in both.memories} >= {"fact", "step"}


async def test_the_plan_sets_the_mode(graph: GraphStore) -> None:
    """A how-to query is planned as procedural, a when-did query as episodic."""
    assert (await run(graph, "how do I restart the webserver")).mode == "procedural"
    assert (await run(graph, "when did the error happen")).mode == "episodic"


class PlanningLLM:
    """Answers recall_plan with a fixed plan, or fails; records tasks."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.tasks: list[str] = []

    async def generate(self, request: LLMRequest) -> LLMResponse:
        self.tasks.append(request.task)
        if self.fail:
            raise RuntimeError("planner down")
        if request.task == "recall_plan":
            return LLMResponse(data={"mode": "semantic", "tags": ["database"]},
                               usage=mnemo.Usage(3, 2))
        return LLMResponse(data={"answer": "postgres keeps its data under /var/lib"})


async def test_an_llm_planner_and_synthesis(graph: GraphStore) -> None:
    """With an LLM planner its plan is used; with synthesis on, its answer is `reasoned`."""
    llm = PlanningLLM()
    config = mnemo.Config(recall_planner="llm", recall_synthesis=True)
    result = await Recaller(graph, EMBEDDER, config, planner=llm, llm=llm).recall(
        REPO, "where is the data", k=5, types=None
    )
    assert result.mode == "semantic"
    assert result.reasoned == "postgres keeps its data under /var/lib"
    assert llm.tasks == ["recall_plan", "recall_synthesis"]
    assert result.degraded == []


async def test_the_repos_model_plans_when_asked_and_is_metered(store: str) -> None:
    """With `recall_planner="llm"` the repo's model plans, its usage booked to the repo (the
    model's plan went around the repo's meter before); with the default config a recall asks
    the model nothing."""
    llm = PlanningLLM()
    async with mnemo.Memory(store, llm=llm, embedder=EMBEDDER) as mem:
        await mem.open_repo(REPO)
        await mem.open_repo("planned", config=mnemo.Config(recall_planner="llm"))
        assert (await mem.recall(REPO, "postgres data")).mode == "mixed"
        assert llm.tasks == []
        assert (await mem.recall("planned", "postgres data")).mode == "semantic"
        assert llm.tasks == ["recall_plan"]
        assert mem.usage(repo="planned") == mnemo.Usage(3, 2)


async def test_a_failing_planner_or_synthesis_does_not_fail_the_recall(
    graph: GraphStore,
) -> None:
    """Planning, re-ranking and synthesis only steer and decorate: when the LLM fails, recall
    still answers, in mixed mode, in the retrieval's order and without `reasoned`, and says
    which it did without (`degraded`; it said nothing but a log line before)."""
    llm = PlanningLLM(fail=True)
    config = mnemo.Config(recall_synthesis=True, recall_rerank=True)
    result = await Recaller(graph, EMBEDDER, config, planner=llm, llm=llm,
                            reranker=LLMReranker(llm)).recall(
        REPO, "postgres data", k=5, types=None
    )
    assert result.mode == "mixed"
    assert result.reasoned is None
    assert result.memories
    assert [note.split(":")[0] for note in result.degraded] == ["plan", "rerank", "synthesis"]


async def test_feedback_with_no_words_to_add_leaves_the_recall_as_it_was(
    graph: GraphStore,
) -> None:
    """With pseudo-relevance feedback on and no word shared by the best hits (nothing to add,
    no second search), a recall is the one it is with feedback off, scores and all. Before,
    the empty second ranking still took its weight in the fusion and lowered every score
    from hop 0."""
    query = "postgres keeps its data"  # one node has these words: none shared by two
    off = await run(graph, query)
    on = await run(graph, query, config=mnemo.Config(recall_prf_terms=3))
    # Equal but for the recency decay of the milliseconds between the two.
    assert [m.node.id for m in on.memories] == [m.node.id for m in off.memories]
    assert [m.score for m in on.memories] == pytest.approx([m.score for m in off.memories])
