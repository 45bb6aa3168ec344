"""What recall keeps about its candidates: their scores on the way, what it read about the
best of them, and the rule that puts a restatement of the query first."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from mnemo.graph.model import Node, NodeType, Vector
from mnemo.graph.ports import Neighbor

N = NodeType


@dataclass(slots=True)
class Candidate:
    """How a recall reached a node: its score so far, by which phase, at which hop."""

    score: float
    phase: str
    hop: int


@dataclass(slots=True)
class ReadContext:
    """What recall read about its best candidates: nodes, access stats, the sources of
    each fact or procedure (its PROVENANCE links), and their vectors."""

    nodes: dict[str, Node]
    stats: dict[str, tuple[int, datetime | None]]
    sources: dict[str, list[str]]
    vectors: dict[str, Vector] = field(default_factory=dict)

    def add_steps(self, links: Iterable[Neighbor]) -> None:
        for link in links:
            node = self.nodes.get(link.origin)
            if node is not None and node.type in (N.SEMANTIC, N.PROCEDURAL):
                self.sources.setdefault(link.origin, []).append(link.node_id)

    def steps_of(self, nodes: Sequence[Node]) -> dict[str, str]:
        """The one step each memory stands for: an EPISODIC node itself, a fact or procedure
        made from exactly one step that step."""
        steps: dict[str, str] = {n.id: n.id for n in nodes if n.type is N.EPISODIC}
        for node in nodes:
            sources = self.sources.get(node.id, [])
            if node.type in (N.SEMANTIC, N.PROCEDURAL) and len(sources) == 1:
                steps[node.id] = sources[0]
        return steps


def restatements_first(
    scored: list[tuple[float, Node, Candidate]], restated: dict[str, int]
) -> list[tuple[float, Node, Candidate]]:
    """`scored` best first, with the memories that restate the query ahead of all others at
    the best score, exact restatements before near-exact ones (tier 0, then 1): asked for in
    so many words, a memory is the answer whatever its value or the other channels say
    (an exact restatement came first 12 times in 20). Within a tier, and among
    the rest, the usual order."""
    best = max(score for score, _, _ in scored)
    others = 2
    scored.sort(key=lambda item: (restated.get(item[1].id, others), *best_first(item)))
    out = []
    for score, node, candidate in scored:
        if node.id in restated:
            candidate.score = score = max(score, best)
        out.append((score, node, candidate))
    return out


_TIES = {N.SEMANTIC: 0, N.PROCEDURAL: 0, N.EPISODIC: 1}


def best_first(item: tuple[float, Node, Candidate]) -> tuple[float, int, float, str, str]:
    """The sort key of a scored memory, best first. An exact tie goes to knowledge before a
    step, then the newer, then by text: the same memories rank alike in any store that holds
    them, whatever their random ids (the id decides only between two of one text)."""
    score, node, _ = item
    return (-score, _TIES.get(node.type, 2), -node.created_at.timestamp(), node.text, node.id)
