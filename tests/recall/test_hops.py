"""Recall's hops follow a node only while what it leads to could be read by ranking (the best
`depth` candidates): the bound skips links that could change no result."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

import mnemo
from mnemo.graph.model import Link, LinkType, NodeType
from mnemo.graph.ports import GraphStore
from mnemo.recall import hops
from mnemo.recall.model import Candidate
from tests.backends import open_stores
from tests.recall.test_engine import EMBEDDER, REPO, build

N = NodeType
WORDS = ["kettle", "kitchen", "shelf", "red", "blue", "garden", "window", "lamp", "door", "tea"]


def _graph(seed: int) -> tuple[list[tuple[str, NodeType, str]], list[Link]]:
    """Tags, facts, steps, intents, procedures and subgoals, linked as the pipeline links
    them, at random."""
    rng = random.Random(seed)
    kinds = {"t": N.TAG, "s": N.SEMANTIC, "e": N.EPISODIC, "i": N.INTENT, "p": N.PROCEDURAL,
             "g": N.SUBGOAL}
    nodes = [
        (f"{prefix}{i}", kind, " ".join([kind.value, prefix, str(i), *rng.sample(WORDS, 3)]))
        for prefix, kind in kinds.items() for i in range(8)
    ]
    pairs = [("t", "s", LinkType.MEMBERSHIP), ("s", "e", LinkType.PROVENANCE),
             ("i", "p", LinkType.HIERARCHICAL), ("g", "e", LinkType.HIERARCHICAL),
             ("p", "e", LinkType.PROVENANCE)]
    links = {
        (f"{a}{rng.randrange(8)}", f"{b}{rng.randrange(8)}", link)
        for _ in range(60) for a, b, link in [rng.choice(pairs)]
    }
    return nodes, [Link(src, dst, link) for src, dst, link in sorted(links)]


@pytest.fixture
async def random_graph(store: str) -> AsyncIterator[GraphStore]:
    async with open_stores(store, EMBEDDER.dim) as backend:
        nodes, links = _graph(seed=7)
        await build(backend.graph, nodes, links)
        yield backend.graph


class Asked:
    """A GraphStore that records the nodes each hop asked the links of."""

    def __init__(self, inner: GraphStore) -> None:
        self.inner = inner
        self.asked: list[set[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def typed_links_near(self, repo: str, node_ids: Sequence[str], vector: Any) -> Any:
        self.asked.append(set(node_ids))
        return await self.inner.typed_links_near(repo, node_ids, vector)


async def _follow(graph: GraphStore, found: dict[str, Candidate], k: int, depth: int,
                  config: mnemo.Config) -> dict[str, Candidate]:
    vector = (await EMBEDDER.embed(["red kettle in the kitchen"]))[0]
    await hops.follow(graph, config, REPO, found, [], vector, k, depth)
    return found


def _readable(found: dict[str, Candidate], depth: int) -> set[tuple[str, float, str, int]]:
    """What ranking reads: the candidates scoring at least the `depth`-th best."""
    scores = sorted((c.score for c in found.values()), reverse=True)
    floor = scores[min(depth, len(scores)) - 1]
    return {(i, c.score, c.phase, c.hop) for i, c in found.items() if c.score >= floor}


async def test_a_parent_whose_children_cannot_be_read_is_not_followed(
    random_graph: GraphStore,
) -> None:
    """With five candidates read, the fifth scoring 0.45, a child (at most half its parent's
    score) can be read only if its parent scores 0.9 or more: s0 is followed, s1 is not."""
    graph = Asked(random_graph)
    found = {"s0": Candidate(1.0, "hybrid", 0), "s1": Candidate(0.8, "hybrid", 0),
             **{f"e{i}": Candidate(0.45, "dense", 0) for i in range(4)}}
    config = mnemo.Config(recall_max_hops=1, hop_decay=0.5)
    await _follow(graph, found, k=2, depth=5, config=config)
    assert graph.asked == [{"s0"}]


async def test_with_fewer_candidates_than_are_read_every_parent_is_followed(
    random_graph: GraphStore,
) -> None:
    graph = Asked(random_graph)
    found = {"s0": Candidate(1.0, "hybrid", 0), "s1": Candidate(0.1, "hybrid", 0)}
    config = mnemo.Config(recall_max_hops=1)
    await _follow(graph, found, k=2, depth=5, config=config)
    assert graph.asked == [{"s0", "s1"}]


@pytest.mark.parametrize("seed", range(25))
async def test_the_bound_changes_nothing_ranking_reads(random_graph: GraphStore, seed: int) -> None:
    """Against the same hops with no bound (more candidates read than there are): the best
    `depth` candidates, their scores and how they were reached are the same."""
    rng = random.Random(seed)
    nodes, _ = _graph(seed=7)
    start = {node_id: Candidate(round(rng.random(), 3), rng.choice(["lexical", "dense"]), 0)
             for node_id, _, _ in rng.sample(nodes, rng.randint(3, 30))}
    k, depth = rng.randint(1, 6), rng.randint(1, 24)
    config = mnemo.Config(recall_max_hops=rng.randint(1, 3), recall_refine_budget=1,
                          hop_decay=rng.choice([0.3, 0.5, 0.8]), recall_candidates=10)

    def copy() -> dict[str, Candidate]:
        return {i: Candidate(c.score, c.phase, c.hop) for i, c in start.items()}

    bounded = await _follow(random_graph, copy(), k, depth, config)
    unbounded = await _follow(random_graph, copy(), k, 10**9, config)
    assert _readable(bounded, depth) == _readable(unbounded, depth)


@pytest.mark.parametrize("seed", range(20))
async def test_bridges_from_the_hops_links_are_those_neighbors_reads(
    random_graph: GraphStore, seed: int
) -> None:
    """A refinement finds its bridge tags among the MEMBERSHIP links a hop already read:
    the same tags, with the same scores, as reading the links of the best with `neighbors`
    (the port's contract: `typed_links` is every link seen from each asked end)."""
    rng = random.Random(seed)
    nodes, _ = _graph(seed=7)
    ids = [node_id for node_id, _, _ in nodes]
    asked = rng.sample(ids, rng.randint(1, 20))
    top = rng.sample(ids, rng.randint(1, 8))  # some were asked by the hop, some were not
    found = {i: Candidate(round(rng.random(), 3), "dense", 0) for i in {*asked, *top}}
    vector = (await EMBEDDER.embed(["red kettle in the kitchen"]))[0]
    typed, _ = await random_graph.typed_links_near(REPO, sorted(asked), vector)
    members: dict[str, list[str]] = {}
    hops._record_members(members, asked, ((o, t, link) for o, _, t, _, link in typed))

    def copy() -> dict[str, Candidate]:
        return {i: Candidate(c.score, c.phase, c.hop) for i, c in found.items()}

    config = mnemo.Config()
    from_hop, read_again = copy(), copy()
    bridges = await hops._bridge_tags(random_graph, config, REPO, top, from_hop, members)
    expected = await hops._bridge_tags(random_graph, config, REPO, top, read_again, {})
    assert bridges == expected
    assert from_hop == read_again


class Neighbors(Asked):
    """Also records the nodes `neighbors` was asked about."""

    def __init__(self, inner: GraphStore) -> None:
        super().__init__(inner)
        self.neighbors_asked: list[set[str]] = []

    async def neighbors(self, repo: str, node_ids: Sequence[str], link_type: Any = None) -> Any:
        self.neighbors_asked.append(set(node_ids))
        return await self.inner.neighbors(repo, node_ids, link_type)


async def test_a_refinement_reads_no_links_a_hop_has_read(random_graph: GraphStore) -> None:
    """Every candidate is followed at hop 1 and nothing new reaches the best k (a plateau):
    the refinement's bridges come from hop 1's links, with no `neighbors` read."""
    graph = Neighbors(random_graph)
    found = {"s0": Candidate(1.0, "hybrid", 0), "s1": Candidate(0.9, "hybrid", 0)}
    config = mnemo.Config(recall_max_hops=2, recall_refine_budget=1)
    await _follow(graph, found, k=2, depth=50, config=config)
    assert graph.asked[0] == {"s0", "s1"}
    assert graph.neighbors_asked == []


def test_the_best_of_tied_candidates_do_not_depend_on_their_order() -> None:
    """An exact tie at the cut is decided by the ids, whatever order the candidates arrived in
    (a store's row order: SQLite and PostgreSQL kept different ones of two tied nodes)."""
    scores = {"n3": 0.9, "n1": 0.5, "n2": 0.5, "n0": 0.5}
    for order in (["n3", "n1", "n2", "n0"], ["n0", "n2", "n3", "n1"], ["n2", "n3", "n0", "n1"]):
        found = {i: Candidate(scores[i], "hop", 1) for i in order}
        assert hops.best(found, 2) == {"n3", "n0"}


async def test_a_bridges_score_does_not_depend_on_the_order_of_the_best() -> None:
    """A tag shared by three of the best is scored by the mean of their scores, summed in one
    order whatever order the best arrive in (a set's, which moves with PYTHONHASHSEED: the
    last bits of a bridge's score, and so a tie, changed from one process to the next)."""
    config = mnemo.Config()
    scores = {"a": 0.1, "b": 0.2, "c": 0.3}
    bridged = set()
    for top in (["a", "b", "c"], ["c", "b", "a"], ["b", "c", "a"]):
        found = {i: Candidate(s, "hop", 1) for i, s in scores.items()}
        members = {i: ["tag"] for i in scores}
        assert await hops._bridge_tags(None, config, "r", top, found, members) == {"tag"}  # type: ignore[arg-type]
        bridged.add(found["tag"].score)
    assert len(bridged) == 1
