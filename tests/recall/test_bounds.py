"""What a recall reads is bounded by k, not by the candidates it touched: the nodes,
stats and provenance of its best candidates in one read, what they bring in in another."""

from __future__ import annotations

import inspect
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import timedelta
from typing import Any, cast

import numpy as np
import pytest

import mnemo
from mnemo.graph import ann
from mnemo.graph.model import Link, LinkType, NodeType, node_value, now_utc
from mnemo.graph.ports import GraphStore, More, Neighbor, NodeContext
from mnemo.graph.vectors import VectorIndex
from mnemo.recall import engine, hops
from mnemo.recall.engine import Recaller
from mnemo.recall.ranking import maximal_marginal_relevance
from mnemo.storage.sqlite.graph import SqliteGraph
from tests.backends import open_stores
from tests.recall.test_engine import EMBEDDER, REPO, build, run

# Nodes whose ids are read by these calls.
READS = ("get_nodes", "access_stats", "node_context", "neighbors", "vectors")


class Counting:
    """A GraphStore that counts its calls and the node ids each read asks for."""

    def __init__(self, inner: GraphStore) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.read: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if name in READS:
                self.read.update(cast(Sequence[str], args[1]))
            if name == "node_context" and len(args) > 4 and args[4] is not None:
                args = (*args[:4], self.counted_then(args[4]))
            return await attr(*args, **kwargs)

        return counted

    def counted_then(self, then: More) -> More:
        """`node_context`'s `then`, the ids it names counted as read."""

        def more(first: NodeContext) -> tuple[Sequence[str], Iterable[NodeType]]:
            ids, linked = then(first)
            self.read.update(ids)
            return ids, linked

        return more


# 120 facts that all match the query's words, each from its own step.
FACTS = [(f"s{i}", NodeType.SEMANTIC, f"the red kettle number {i} is kept in the kitchen")
         for i in range(120)]
STEPS = [(f"e{i}", NodeType.EPISODIC, f"saw kettle {i} on the kitchen shelf") for i in range(120)]


@pytest.fixture
async def crowded(store: str) -> AsyncIterator[GraphStore]:
    async with open_stores(store, EMBEDDER.dim) as backend:
        links = [Link(f"s{i}", f"e{i}", LinkType.PROVENANCE) for i in range(120)]
        await build(backend.graph, [*FACTS, *STEPS], links)
        yield backend.graph


async def test_recall_reads_only_its_best_candidates(crowded: GraphStore) -> None:
    """Of the nodes a recall touches, it reads the nodes, stats and links of at most
    max(4k, recall_candidates) of them, plus the one source or fact and the two neighbours
    each of the best 2k may bring in."""
    config = mnemo.Config(recall_candidates=20)
    graph = Counting(crowded)
    result = await run(cast(GraphStore, graph), "red kettle in the kitchen", k=2, config=config)
    assert len(result.memories) == 2
    touched = {t.node_id for t in result.touched}
    assert graph.read <= touched
    assert len(graph.read) <= 20 + 3 * 2 * 2
    assert len(graph.read) < len(touched)


async def test_after_the_hops_one_read_and_one_write(crowded: GraphStore) -> None:
    """Nodes, access stats, provenance, vectors and the steps of the best candidates, and
    what provenance and neighbours bring in, are one call (two were two hops to SQLite's
    thread); then reinforcement writes once. MMR (on by default) takes its vectors from that
    read: before, it asked for them again (a round trip on PostgreSQL)."""
    graph = Counting(crowded)
    # The best 2k steps bring facts from beyond the 20 best candidates: there is more to read.
    config = mnemo.Config(recall_candidates=20)
    result = await run(cast(GraphStore, graph), "kettle on the kitchen shelf", k=2,
                       config=config)
    assert {t.phase for t in result.touched} >= {"provenance"}
    assert mnemo.Config().recall_mmr_lambda < 1.0
    assert graph.calls["node_context"] == 1
    assert graph.calls["get_nodes"] == graph.calls["access_stats"] == 0
    assert graph.calls["vectors"] == 0
    assert graph.calls["reinforce"] == 1



async def test_node_context_brings_the_vectors_that_vectors_reads(crowded: GraphStore) -> None:
    """`node_context`'s vectors are `vectors` of the same ids: unit rows, unknown ids left
    out (the port's contract, on both backends)."""
    ids = ["s1", "e1", "s7", "nobody"]
    context = await crowded.node_context(REPO, ids, [NodeType.SEMANTIC], LinkType.PROVENANCE)
    alone = await crowded.vectors(REPO, ids)
    assert set(context.vectors) == set(alone) == {"s1", "e1", "s7"}
    for node_id, vector in alone.items():
        np.testing.assert_allclose(context.vectors[node_id], vector, atol=1e-6)
        assert float(np.linalg.norm(context.vectors[node_id])) == pytest.approx(1.0, abs=1e-5)

def reference_mmr(order: list[str], relevance: dict[str, float],
                  vectors: dict[str, np.ndarray], lam: float) -> list[str]:
    """The greedy loop of Carbonell and Goldstein, item by item, to check the matrix form."""
    if lam >= 1.0 or len(order) < 3:
        return list(order)
    scale = max(relevance.values()) or 1.0
    left, chosen = list(order), []
    nearest = dict.fromkeys(left, 0.0)
    while left:
        best = max(left, key=lambda i: lam * relevance[i] / scale - (1 - lam) * nearest[i])
        left.remove(best)
        chosen.append(best)
        if best in vectors:
            for item in left:
                if item in vectors:
                    nearest[item] = max(nearest[item], float(vectors[item] @ vectors[best]))
    return chosen


@pytest.mark.parametrize("seed", range(20))
def test_mmr_as_a_matrix_product_picks_as_the_greedy_loop(seed: int) -> None:
    """The matrix form of MMR chooses the same order as the item-by-item loop (distinct
    relevances, some items without a vector)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 40))
    order = [f"n{i}" for i in range(n)]
    relevance = {i: float(r) for i, r in zip(order, np.sort(rng.random(n))[::-1], strict=True)}
    raw = rng.normal(size=(n, 16)).astype(np.float32)
    raw[1::3] = raw[0]  # near duplicates of the first
    raw /= np.linalg.norm(raw, axis=1, keepdims=True)
    vectors = {i: raw[row] for row, i in enumerate(order) if row % 7 != 5}
    lam = float(rng.uniform(0.3, 0.95))
    assert maximal_marginal_relevance(order, relevance, vectors, lam) == reference_mmr(
        order, relevance, vectors, lam
    )


async def test_a_hop_is_one_read(crowded: GraphStore) -> None:
    """Each hop reads its links and the cosines of their far ends together: no separate
    similarities read (a round trip each on PostgreSQL)."""
    graph = Counting(crowded)
    await run(cast(GraphStore, graph), "red kettle in the kitchen", k=5)
    assert graph.calls["typed_links_near"] >= 1
    assert graph.calls["typed_links"] == graph.calls["similarities"] == 0


async def test_typed_links_near_is_typed_links_with_their_similarities(
    crowded: GraphStore,
) -> None:
    """The batched read answers what the two reads it replaces answer, on both backends."""
    ids = ["s3", "e3", "s4", "e7"]
    query = (await EMBEDDER.embed(["kettle on the kitchen shelf"]))[0]
    links, similarity = await crowded.typed_links_near("r", ids, query)
    expected = await crowded.typed_links("r", ids)
    assert sorted(links) == sorted(expected)
    targets = [target for _, _, target, _, _ in expected]
    wanted = await crowded.similarities("r", targets, query)
    assert similarity.keys() == wanted.keys()
    for node_id, cosine in wanted.items():
        assert similarity[node_id] == pytest.approx(cosine, abs=1e-5)


async def test_a_link_of_a_node_deleted_during_the_read_is_ignored(crowded: GraphStore) -> None:
    """On PostgreSQL the nodes and links of `node_context` are two statements: a link whose
    node was deleted between them is skipped, not a KeyError."""

    ghost = Neighbor("gone", "e1", LinkType.PROVENANCE)

    def haunted(then: More) -> More:
        return lambda first: then(NodeContext(first.nodes, first.stats, [ghost, *first.links],
                                              first.vectors))

    class Racing(Counting):
        async def node_context(self, *args: Any, **kwargs: Any) -> NodeContext:
            if len(args) > 4 and args[4] is not None:
                args = (*args[:4], haunted(args[4]))
            context = await self.inner.node_context(*args, **kwargs)
            return NodeContext(context.nodes, context.stats, [ghost, *context.links])

    result = await run(cast(GraphStore, Racing(crowded)), "red kettle in the kitchen", k=3)
    assert len(result.memories) == 3


async def test_node_context_then_reads_what_a_second_call_would(crowded: GraphStore) -> None:
    """`then` sees the first read and the nodes it names are read in the same call: the
    context is the two calls' contexts one after the other, on both backends."""
    seen: list[list[str]] = []

    def then(first: NodeContext) -> tuple[Sequence[str], Iterable[NodeType]]:
        seen.append([n.id for n in first.nodes])
        return ["s2", "e2", "nobody"], [NodeType.SEMANTIC]

    both = await crowded.node_context(REPO, ["e1", "s1"], [NodeType.EPISODIC],
                                      LinkType.PROVENANCE, then)
    first = await crowded.node_context(REPO, ["e1", "s1"], [NodeType.EPISODIC],
                                       LinkType.PROVENANCE)
    second = await crowded.node_context(REPO, ["s2", "e2", "nobody"], [NodeType.SEMANTIC],
                                        LinkType.PROVENANCE)
    assert seen == [["e1", "s1"]]
    assert both.nodes == [*first.nodes, *second.nodes]
    assert both.links == [*first.links, *second.links]
    assert both.links
    assert both.stats == {**first.stats, **second.stats}
    assert set(both.vectors) == {"e1", "s1", "s2", "e2"}
    nothing = await crowded.node_context(REPO, ["e1"], [NodeType.EPISODIC], LinkType.PROVENANCE,
                                         lambda _: ([], []))
    assert nothing.nodes == first.nodes[:1]


async def test_vectors_on_loop_only_for_a_small_index_in_memory(crowded: GraphStore) -> None:
    """SQLite answers a small repo's vector searches on the event loop once its index is in
    memory (recall then runs hop 0's searches one after the other, without a task group);
    PostgreSQL never does (each search is a round trip)."""
    sqlite = isinstance(crowded, SqliteGraph)
    async with crowded.reading(REPO):
        assert crowded.vectors_on_loop(REPO) is sqlite
    assert crowded.vectors_on_loop("never-written") is False


def test_an_index_of_many_rows_is_not_searched_in_turn() -> None:
    """`ann.on_loop` holds below `IN_TURN_BELOW` rows (below `ann.IN_THREAD_FROM`, where
    the searches go to a worker thread)."""
    assert ann.IN_TURN_BELOW <= ann.IN_THREAD_FROM
    index = VectorIndex(4)
    index.add(["a", "b"], [NodeType.SEMANTIC] * 2, np.eye(4, dtype=np.float32)[:2])
    assert ann.on_loop(index)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ann, "IN_TURN_BELOW", 2)
        assert not ann.on_loop(index)


async def test_a_recall_for_a_moment_reads_what_any_recall_reads(crowded: GraphStore) -> None:
    """With `valid_at` and `as_of`, a recall keeps to the nodes it reads anyway: one
    `node_context`, no other read of nodes, within the same bound (no walk of the repo's
    facts, whatever their count)."""
    graph = Counting(crowded)
    config = mnemo.Config(recall_candidates=20)
    offline = mnemo.OfflineLLM()
    recaller = Recaller(cast(GraphStore, graph), EMBEDDER, config, planner=offline, llm=offline)
    later = now_utc() + timedelta(days=1)
    result = await recaller.recall(REPO, "red kettle in the kitchen", k=2, types=None,
                                   as_of=later, valid_at=later)
    assert len(result.memories) == 2
    assert graph.calls["node_context"] == 1
    assert graph.calls["get_nodes"] == graph.calls["access_stats"] == 0
    assert len(graph.read) <= 20 + 3 * 2 * 2


async def test_ranking_many_candidates_runs_off_the_event_loop(
    crowded: GraphStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recall's pure-Python stages over many candidates (a hop weighing its links, the
    sorts, scoring and picking) run in a worker thread, so a recall at `max_results`' ceiling
    never holds the loop for its whole ranking; over few, they stay on the loop (a thread hop
    costs more than they do). The result is the same either way."""
    loop = threading.get_ident()
    threads: dict[str, set[bool]] = {"score": set(), "hop": set()}
    follows = hops.follows

    def valued(*args: Any, **kwargs: Any) -> float:
        threads["score"].add(threading.get_ident() == loop)
        return node_value(*args, **kwargs)

    def followed(*args: Any) -> bool:
        threads["hop"].add(threading.get_ident() == loop)
        return follows(*args)

    monkeypatch.setattr(engine, "node_value", valued)
    monkeypatch.setattr(hops, "follows", followed)
    config = mnemo.Config(max_results=10_000)
    query = "red kettle in the kitchen"
    on_loop = await run(crowded, query, k=200, config=config)
    assert threads == {"score": {True}, "hop": {True}}

    threads["score"].clear()
    threads["hop"].clear()
    monkeypatch.setattr(hops, "ON_LOOP_ITEMS", 0)
    off_loop = await run(crowded, query, k=200, config=config)
    assert threads == {"score": {False}, "hop": {False}}
    assert [m.node.id for m in off_loop.memories] == [m.node.id for m in on_loop.memories]
