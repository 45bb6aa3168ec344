"""Recall v1 over a small hand-made graph: hybrid hop 0, one hop along links, type filters."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterable

import pytest

import mnemo
from mnemo.graph.model import Changeset, Link, LinkType, NodeDraft, NodeType
from mnemo.graph.store import SqliteGraph
from mnemo.recall.engine import RecallResult, recall
from mnemo.storage.db import Database
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
    graph: SqliteGraph, nodes: list[tuple[str, NodeType, str]], links: list[Link], repo: str = REPO
) -> None:
    vectors = await EMBEDDER.embed([text for _, _, text in nodes])
    drafts = [
        NodeDraft(node_id, kind, text, {}, vectors[i], key=text if kind is NodeType.TAG else None)
        for i, (node_id, kind, text) in enumerate(nodes)
    ]
    await graph.apply(Changeset(f"cs-{repo}", repo, drafts, links), intents=policy())


@pytest.fixture
async def graph() -> AsyncIterator[SqliteGraph]:
    db = Database(":memory:")
    await db.open()
    graph = SqliteGraph(db, lambda repo: EMBEDDER.dim)
    await build(graph, NODES, LINKS)
    yield graph
    await db.close()


async def run(
    graph: SqliteGraph,
    query: str,
    *,
    k: int = 10,
    types: Iterable[NodeType] | None = None,
    config: mnemo.Config | None = None,
    repo: str = REPO,
) -> RecallResult:
    result = await recall(
        graph, EMBEDDER, config or mnemo.Config(), repo=repo, query=query, k=k, types=types
    )
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
        assert (m.phase == "hop") == (m.hop == 1)
        assert m.phase in {"hybrid", "lexical", "dense", "hop"}
        assert 0.0 < m.score <= 1.0 + 1e-9


def by_id(result: RecallResult) -> dict[str, mnemo.Recalled]:
    return {m.node.id: m for m in result.memories}


async def test_the_matching_node_comes_first(graph: SqliteGraph) -> None:
    """The node whose text is the query is first in both channels: hybrid, hop 0, score 1."""
    result = await run(graph, "postgres keeps its data under var lib postgresql")
    first = result.memories[0]
    assert first.node.id == "s-pg"
    assert first.node.type is NodeType.SEMANTIC
    assert (first.phase, first.hop) == ("hybrid", 0)
    assert first.score == pytest.approx(1.0)
    assert result.query == "postgres keeps its data under var lib postgresql"
    assert result.reasoned is None


async def test_linked_nodes_come_in_at_hop_one(graph: SqliteGraph) -> None:
    """Neighbours of a strong match appear as hop 1 at its score times hop_decay."""
    config = mnemo.Config(hop_decay=0.6)
    result = await run(graph, "port 8080 behind the load balancer", config=config)
    found = by_id(result)
    top = result.memories[0]
    assert top.node.id == "s-nginx"
    assert top.score == pytest.approx(1.0)
    for neighbour in ("t-web", "e-step"):
        assert (found[neighbour].phase, found[neighbour].hop) == ("hop", 1)
    assert found["e-step"].score == pytest.approx(top.score * 0.6)
    # A tag is a route, not a memory: it ranks one more hop_decay below (docs/DECISIONS.md).
    assert found["t-web"].score == pytest.approx(top.score * 0.6 * 0.6)


async def test_routing_nodes_rank_below_the_memories_they_lead_to(graph: SqliteGraph) -> None:
    """Without a type filter, a tag matching the query exactly ranks below its facts; asked for
    by type, it keeps its own score."""
    everything = by_id(await run(graph, "webserver"))
    tags_only = by_id(await run(graph, "webserver", types=[NodeType.TAG]))
    assert tags_only["t-web"].score == pytest.approx(everything["t-web"].score / 0.5)


async def test_type_filter_still_reaches_through_tags(graph: SqliteGraph) -> None:
    """With types=SEMANTIC, a query matching only a tag still finds the fact under it."""
    result = await run(graph, "webserver", types=[NodeType.SEMANTIC])
    assert result.memories, "the tag should lead to its fact"
    assert {m.node.type for m in result.memories} == {NodeType.SEMANTIC}
    nginx = by_id(result)["s-nginx"]
    assert (nginx.phase, nginx.hop) == ("hop", 1)
    assert nginx.score == pytest.approx(0.5)


async def test_type_filter_reaches_procedures_through_intents(graph: SqliteGraph) -> None:
    """With types=PROCEDURAL, a query matching an intent finds the procedure under it."""
    result = await run(graph, "restart webserver", types=[NodeType.PROCEDURAL])
    assert [m.node.id for m in result.memories] == ["p-reload"]
    assert (result.memories[0].phase, result.memories[0].hop) == ("hop", 1)
    assert result.memories[0].score == pytest.approx(0.5)


async def test_types_filter_several_types(graph: SqliteGraph) -> None:
    """A filter of several types returns only those types."""
    wanted = {NodeType.TAG, NodeType.EPISODIC}
    result = await run(graph, "nginx webserver error log", types=wanted)
    assert result.memories
    assert {m.node.type for m in result.memories} <= wanted


async def test_k_limits_the_results(graph: SqliteGraph) -> None:
    """At most k memories come back, the best ones."""
    everything = await run(graph, "nginx webserver database postgres", k=50)
    assert len(everything.memories) > 2
    two = await run(graph, "nginx webserver database postgres", k=2)
    assert [m.node.id for m in two.memories] == [m.node.id for m in everything.memories[:2]]


async def test_an_unmatched_query_on_an_empty_repo_finds_nothing(graph: SqliteGraph) -> None:
    """A repo with no nodes recalls nothing."""
    result = await recall(
        graph, EMBEDDER, mnemo.Config(), repo="empty", query="nginx", k=5, types=None
    )
    assert result.memories == []


async def test_a_node_found_at_hop_zero_is_not_listed_again_at_hop_one(
    graph: SqliteGraph,
) -> None:
    """A hop-0 candidate outside the seeds that is also a seed's neighbour appears once."""
    # Four short tags outrank the long fact for "nginx", so with k=2 (four seeds) the fact is
    # a hop-0 candidate that is not a seed, and also one hop from the "nginx" tag.
    tags = ["nginx", "nginx proxy", "nginx config", "nginx server"]
    fact = "the nginx reverse proxy listens on port eight thousand and eighty by default"
    nodes = [(f"tag{i}", NodeType.TAG, label) for i, label in enumerate(tags)]
    nodes.append(("fact", NodeType.SEMANTIC, fact))
    await build(graph, nodes, [Link("tag0", "fact", LinkType.MEMBERSHIP)], repo="dup")
    for k in (1, 2, 3, 5):
        result = await run(graph, "nginx", k=k, types=[NodeType.SEMANTIC], repo="dup")
        assert [(m.node.id, m.phase, m.hop) for m in result.memories] == [("fact", "hybrid", 0)]
