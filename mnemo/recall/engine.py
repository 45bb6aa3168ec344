"""Recall v1: hybrid search over one repo's graph.

Hop 0 takes candidates from FTS5 BM25 over node text and from cosine over node vectors, fused
by reciprocal rank; then one hop along links pulls in what the best candidates are linked to,
at `hop_decay` of their score. Results are best first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mnemo.config import Config
from mnemo.episode.annotation import embed
from mnemo.graph.model import Node, NodeType
from mnemo.graph.store import GraphStore
from mnemo.ports import Embedder
from mnemo.recall.fusion import hop_scores, reciprocal_rank_fusion

# Nodes that route a search to others: always searched at hop 0, so a type filter still
# reaches the facts and procedures they lead to.
_ROUTING = (NodeType.TAG, NodeType.INTENT, NodeType.SUBGOAL)


@dataclass(frozen=True, slots=True)
class Recalled:
    """One recalled node: its fused score, the phase that found it, and at which hop."""

    node: Node
    score: float
    phase: str
    hop: int


@dataclass(frozen=True, slots=True)
class RecallResult:
    """What `recall` found, best first. `reasoned` is an optional LLM synthesis."""

    memories: list[Recalled]
    reasoned: str | None = None
    query: str = ""
    timings: dict[str, float] = field(default_factory=dict)


async def recall(
    graph: GraphStore,
    embedder: Embedder,
    config: Config,
    *,
    repo: str,
    query: str,
    k: int,
    types: Iterable[NodeType] | None,
) -> RecallResult:
    wanted = None if types is None else {NodeType(t) for t in types}
    searched = None if wanted is None else list(wanted | set(_ROUTING))
    width = max(config.recall_candidates, k)
    lexical = await graph.search_text(repo, query, width, searched)
    vector = (await embed(embedder, [query]))[0]
    dense = await graph.search_vectors(repo, vector, width, searched)
    lexical_ids = [node_id for node_id, _ in lexical]
    dense_ids = [node_id for node_id, score in dense if score > 0.0]
    fused = reciprocal_rank_fusion([lexical_ids, dense_ids], config.rrf_k)
    in_lexical, in_dense = set(lexical_ids), set(dense_ids)
    phase = {
        node_id: "hybrid" if node_id in in_lexical and node_id in in_dense
        else "lexical" if node_id in in_lexical else "dense"
        for node_id in fused
    }
    seeds = dict(sorted(fused.items(), key=lambda item: -item[1])[: 2 * k])
    neighbors = await graph.neighbors(repo, list(seeds))
    hopped = hop_scores(seeds, [(n.origin, n.node_id) for n in neighbors], config.hop_decay)
    # A hop-0 candidate outside the seeds may also be a seed's neighbour: like a seed, it is
    # listed once, at hop 0.
    hopped = {node_id: s for node_id, s in hopped.items() if node_id not in fused}
    scored = [(node_id, score, phase[node_id], 0) for node_id, score in fused.items()]
    scored += [(node_id, score, "hop", 1) for node_id, score in hopped.items()]
    nodes = {node.id: node for node in await graph.get_nodes(repo, [s[0] for s in scored])}
    if wanted is None:
        # A tag, intent or subgoal is a route to memories rather than one: unless asked for by
        # type, it ranks as if one hop away, below the memories it leads to.
        scored = [
            (node_id, score * config.hop_decay if _routes(nodes, node_id) else score, by, hop)
            for node_id, score, by, hop in scored
        ]
    scored.sort(key=lambda item: (-item[1], item[0]))
    memories = [
        Recalled(nodes[node_id], score, found_by, hop)
        for node_id, score, found_by, hop in scored
        if node_id in nodes and (wanted is None or nodes[node_id].type in wanted)
    ]
    return RecallResult(memories[:k], None, query)


def _routes(nodes: dict[str, Node], node_id: str) -> bool:
    node = nodes.get(node_id)
    return node is not None and node.type in _ROUTING
