"""Recall's walk through the graph after hop 0: the routes into it (tags and intents near the
query) and the hops along links from the best candidates (see `mnemo.recall.engine`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import numpy as np

from mnemo import cpu
from mnemo.config import Config
from mnemo.graph.model import LinkType, Node, NodeType, Vector
from mnemo.graph.ports import RecallReads
from mnemo.graph.scope import WIDEN, Scope
from mnemo.ports import reaches
from mnemo.recall.model import Candidate, adjacent_steps

N = NodeType
T = TypeVar("T")
# The routes of each kind one probe offers.
ROUTES_PER_PROBE = 3
# Pure Python over more candidates or links than this runs off the loop, in `mnemo.cpu`'s slot.
ON_LOOP_ITEMS = 1_000
# The characters of candidates' text that weigh as one more item.
CHARS_PER_ITEM = 1_000


async def routes(
    graph: RecallReads, config: Config, repo: str, query_vector: Vector, tag_vectors: Vector,
    scope: Scope | None = None,
) -> list[tuple[str, Candidate]]:
    """Routes into the graph: tags near a search tag or the query, intents near the query
    (only the query's vectors needed: asked for beside hop 0); with `scope`, its own only."""
    probes = np.vstack([query_vector[None, :], tag_vectors])
    asked = ((N.TAG, probes, config.recall_tag_threshold),
             (N.INTENT, probes[:1], config.recall_intent_threshold))
    # A scope that lists its members is searched among them: each user's tags share their
    # labels' vectors, so the repo's nearest may all be other users'. A larger one keeps what
    # is inside of the repo's nearest `WIDEN` times as many, as hop 0 does.
    wide = scope is not None and scope.members is None
    nearest = [await graph.nearest_of_type(
        repo, vectors, kind, WIDEN * ROUTES_PER_PROBE if wide else ROUTES_PER_PROBE,
        among=None if scope is None or scope.members is None else scope.ids([kind.value]))
        for kind, vectors, _ in asked]
    if scope is not None and wide:
        keep = await graph.inside(repo, scope, [i for hits in nearest for row in hits
                                                for i, _ in row])
        nearest = [[[(i, sim) for i, sim in row if i in keep][:ROUTES_PER_PROBE] for row in hits]
                   for hits in nearest]
    return [(node_id, Candidate(sim, "route", 0))
            for (_, _, threshold), hits in zip(asked, nearest, strict=True)
            for row in hits for node_id, sim in row if reaches(sim, threshold)]


async def follow(
    graph: RecallReads,
    config: Config,
    repo: str,
    found: dict[str, Candidate],
    offered: list[tuple[str, Candidate]],
    query_vector: Vector | None,
    k: int,
    depth: int,
) -> list[tuple[str, Candidate]]:
    """Offers the routes, then follows links from the candidates, hop by hop, into `found`;
    returns `found`'s candidates best first. A node is followed (and bridges looked for) only
    while what it brings could still score among the best `depth`, the only ones ranking
    reads: the result is the same as unbounded hops, the cost bounded by k."""
    for node_id, candidate in offered:
        offer(found, node_id, candidate)
    width = 2 * k
    ranking = await _sorted(found)
    frontier = _ids(ranking, width)
    refinements = config.recall_refine_budget
    # The MEMBERSHIP neighbours of every node a hop read the links of (a refinement's bridges).
    members: dict[str, list[str]] = {}
    hop = 0
    while hop < config.recall_max_hops and frontier:
        hop += 1
        # The lowest score a parent needs for a child (at most `hop_decay` times it) to reach
        # the best `depth` candidates: 0 while there are fewer.
        floor = (ranking[depth - 1][1].score / config.hop_decay
                 if len(ranking) >= depth and config.hop_decay > 0 else 0.0)
        parents = {i for i in frontier if found[i].score >= floor}
        top_before = _ids(ranking, k)
        reached = (await _expand(graph, config, repo, parents, found, query_vector, hop,
                                 members) if parents else set())
        if reached:  # else `found` is as it was
            ranking = await _sorted(found)
        top_after = _ids(ranking, k)
        # Only the best of what a hop reached leads on (a subgoal may link hundreds of nodes).
        frontier = {i for i in _ids(ranking, 4 * width) if i in reached}
        if top_after == top_before and refinements > 0:
            # A plateau: tags shared by several of the best results bridge to memories the
            # query's own words did not reach, at most `hop_decay` times the best of them.
            refinements -= 1
            if max((found[i].score for i in top_after), default=0.0) >= floor:
                bridges = await _bridge_tags(graph, config, repo, list(top_after), found,
                                             members)
                frontier = frontier | bridges
                if bridges:
                    ranking = await _sorted(found)
    return ranking


async def _sorted(found: dict[str, Candidate]) -> list[tuple[str, Candidate]]:
    return await pure(lambda: sorted(found.items(), key=by_score), len(found))


def _ids(ranking: list[tuple[str, Candidate]], n: int) -> set[str]:
    return {i for i, _ in ranking[:n]}


async def _expand(
    graph: RecallReads,
    config: Config,
    repo: str,
    frontier: set[str],
    found: dict[str, Candidate],
    query_vector: Vector | None,
    hop: int,
    members: dict[str, list[str]],
) -> set[str]:
    """One hop from `frontier` along the links a route allows; returns what it reached, and
    records each frontier node's MEMBERSHIP neighbours in `members`. A routing node leads on
    to at most `recall_candidates // 5` of its members (at least 2), those nearest the query
    (none nearer without its vector)."""
    typed, similarity = (
        await graph.typed_links_near(repo, sorted(frontier), query_vector)
        if query_vector is not None else (await graph.typed_links(repo, sorted(frontier)), {}))

    def reach() -> set[str]:
        _record_members(members, frontier, ((o, t, link) for o, _, t, _, link in typed))
        fanout = max(2, config.recall_candidates // 5)
        by_origin: dict[str, list[tuple[float, str, NodeType]]] = {}
        for origin, origin_kind, target, target_kind, link in typed:
            if origin in frontier and follows(origin_kind, target_kind, link):
                by_origin.setdefault(origin, []).append(
                    (similarity.get(target, 0.0), target, target_kind))
        reached: set[str] = set()
        for origin, targets in by_origin.items():
            targets.sort(key=lambda item: -item[0])
            parent = found[origin].score
            for sim, target, target_kind in targets[:fanout]:
                if target_kind is N.TAG and not reaches(sim, config.recall_tag_threshold):
                    continue
                if target_kind is N.INTENT and not reaches(sim, config.recall_intent_threshold):
                    continue
                score = parent * config.hop_decay * (0.5 + 0.5 * max(sim, 0.0))
                if offer(found, target, Candidate(score, "hop", hop)):
                    reached.add(target)
        return reached

    return await pure(reach, len(typed))


async def pure(func: Callable[[], T], items: int) -> T:
    """`func()`, pure Python over `items` candidates or links: on the loop up to
    `ON_LOOP_ITEMS`, else in `mnemo.cpu`'s slot."""
    return await cpu.run(func, items, on_loop_below=ON_LOOP_ITEMS + 1)


async def _bridge_tags(
    graph: RecallReads,
    config: Config,
    repo: str,
    top: list[str],
    found: dict[str, Candidate],
    members: dict[str, list[str]],
) -> set[str]:
    """Tags linked to at least two of `top`, scored by the mean of their scores (links from
    `members`, else the store)."""
    unread = [i for i in top if i not in members]
    if unread:
        links = await graph.neighbors(repo, unread, LinkType.MEMBERSHIP)
        _record_members(members, unread, ((n.origin, n.node_id, n.link_type) for n in links))
    shared: dict[str, list[float]] = {}
    for origin in sorted(top):  # one order of summing, whatever order `top` came in
        for tag_id in members[origin]:
            shared.setdefault(tag_id, []).append(found[origin].score)
    bridges: set[str] = set()
    for tag_id, scores in shared.items():
        if len(scores) >= 2 and tag_id not in found:
            # Found one hop out from the results, a bridge is discounted like a hop.
            found[tag_id] = Candidate(config.hop_decay * sum(scores) / len(scores), "bridge", 0)
            bridges.add(tag_id)
    return bridges


def _record_members(
    members: dict[str, list[str]], asked: Iterable[str],
    links: Iterable[tuple[str, str, LinkType]],
) -> None:
    """Records each `asked` node's MEMBERSHIP neighbours among `links`, each once."""
    seen: dict[str, dict[str, None]] = {i: {} for i in asked}
    for origin, other, link in links:
        if link is LinkType.MEMBERSHIP and origin in seen:
            seen[origin][other] = None
    members.update((i, list(others)) for i, others in seen.items())


def best(found: dict[str, Candidate], n: int) -> set[str]:
    """The ids of the `n` best-scored candidates (ties by id)."""
    return {i for i, _ in sorted(found.items(), key=by_score)[:n]}


def by_score(item: tuple[str, Candidate]) -> tuple[float, str]:
    """Best score first, then the smaller id (a tie is decided by the nodes, not a store)."""
    return -item[1].score, item[0]


def offer(found: dict[str, Candidate], node_id: str, candidate: Candidate) -> bool:
    """Keeps the better of two ways to reach a node; True when `candidate` won."""
    current = found.get(node_id)
    if current is not None and current.score >= candidate.score:
        return False
    found[node_id] = candidate
    return True


def follows(origin: NodeType, target: NodeType, link: LinkType) -> bool:
    """Which links a hop follows: tag <-> fact, intent <-> procedure, fact or procedure ->
    its steps, step -> its subgoal's other steps."""
    if link is LinkType.MEMBERSHIP:
        return True
    if link is LinkType.HIERARCHICAL:
        return {origin, target} <= {N.INTENT, N.PROCEDURAL, N.SUBGOAL, N.EPISODIC}
    return link is LinkType.PROVENANCE and target is N.EPISODIC


def neighbour_offers(
config: Config, found: dict[str, Candidate], nodes: dict[str, Node], k: int
) -> dict[str, Candidate]:
    """The steps up to `recall_neighbour_width` before and after the best `2k` episodic
    hits, at `recall_neighbour_weight` of their score, as one hop."""
    weight = config.recall_neighbour_weight
    offers: dict[str, Candidate] = {}
    if weight <= 0:
        return offers
    for node_id in best(found, 2 * k):
        node = nodes.get(node_id)
        if node is None:
            continue
        parent = found[node_id]
        for neighbour in adjacent_steps(node, config.recall_neighbour_width):
            offer(offers, neighbour, Candidate(parent.score * weight, "hop", parent.hop + 1))
    return offers


async def keep_inside(
    graph: RecallReads, repo: str, scope: Scope, found: dict[str, Candidate]
) -> None:
    keep = await graph.inside(repo, scope, list(found))
    for node_id in [i for i in found if i not in keep]:
        del found[node_id]
