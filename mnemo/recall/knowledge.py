"""Knowledge first: what recall does with a fact or procedure beside the steps it came from.

Extraction turns a step into the facts and procedures it told; recall finds both, and a raw
step, longer and holding every word, often matches a query better than the fact made from it.
The rules (docs/DECISIONS.md, "Knowledge first"):

- **The step is the fact's evidence.** Of a step and the facts or procedures extracted from it
  alone, one result stands for them, at the place of the first of them: the one of those
  facts that the query's own channels matched best, when it matched at least
  `EVIDENCE_SHARE` as well as its step; the step is reachable from it (`Recalled.evidence`).
  Otherwise the step. Its other facts come after one result of every other step, unless
  one matched about as well as the best memory (`SIBLING_SHARE`). The place
  is the ranking's: only which node fills it changes
  (measured: folding the step into the fact before ranking moved LoCoMo evidence recall
  0.772 -> 0.767-0.771, docs/DECISIONS.md).
- **Levers never lift an unrelated step above a matching fact.** A fact or procedure that the
  query's own channels (hop 0) matched at least `MATCHING_SHARE` as well as the best memory
  matches; a step they matched less (or not at all: a neighbour, a hop) is unrelated. Among
  the results, every unrelated step comes after every matching fact, whatever the neighbour,
  speaker and diversity levers made of its score; among matching memories the score decides.
- Routes (TAG, INTENT, SUBGOAL) and SOURCE nodes are not answers: with `types=None` they come
  after every memory (`engine`).

Pure: the engine passes what it scored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from mnemo.graph.model import Node, NodeType

N = NodeType
KNOWLEDGE = (N.SEMANTIC, N.PROCEDURAL)
# How well a fact must match (its hop-0 relevance against its step's) to stand for its step.
EVIDENCE_SHARE = 0.5
# How well a fact must match (against the best hop-0 relevance of a memory) to be placed
# above the steps that matched less well.
MATCHING_SHARE = 0.5
# How well a further fact of a step must match (against the best hop-0 relevance of a
# memory) to be returned beside the first rather than after every other step's result.
SIBLING_SHARE = 0.95

C = TypeVar("C")
Scored = tuple[float, Node, C]


def stand_ins(
    scored: list[Scored[C]], direct: Mapping[str, float], steps: Mapping[str, str],
    restated: Mapping[str, int], *, procedural: bool = False,
) -> dict[str, Scored[C]]:
    """For each step that facts or procedures of `scored` were made from alone, the one that
    stands in for the step and its facts wherever the first of them ranks: of those that
    matched the query at least `EVIDENCE_SHARE` as well as the step, the one the query's own
    channels matched best; by the step's id. `steps` maps a fact made from
    one step to that step (`ReadContext.steps_of`); `direct` holds hop-0 relevance. A step
    that restates the query stands for itself, unless a fact of it restates it as closely. A
    query that asks what to do (`procedural`, the plan's mode) is answered by the step's
    procedure, however little of the query its instruction's words hold (the query names the
    situation, the instruction what to do)."""
    best: dict[str, Scored[C]] = {}
    for item in scored:
        score, node, _ = item
        step = steps.get(node.id)
        if node.type not in KNOWLEDGE or step is None or step == node.id:
            continue
        if step in restated and restated.get(node.id, 2) > restated[step]:
            continue  # the step restates the query more closely than the fact
        own = direct.get(node.id, 0.0)
        asked = procedural and node.type is N.PROCEDURAL
        if not asked and (own <= 0.0 or own < EVIDENCE_SHARE * direct.get(step, 0.0)):
            continue
        current = best.get(step)
        rank = (asked, own, score)
        if current is None or rank > (procedural and current[1].type is N.PROCEDURAL,
                                      direct.get(current[1].id, 0.0), current[0]):
            best[step] = item
    return best


def strong(direct: Mapping[str, float], nodes: Mapping[str, Node]) -> set[str]:
    """The facts and procedures among `nodes` that the query's own channels matched at least
    `SIBLING_SHARE` as well as the best memory."""
    best = max((direct.get(i, 0.0) for i, n in nodes.items()
                if n.type in (*KNOWLEDGE, N.EPISODIC)), default=0.0)
    return {i for i, n in nodes.items() if n.type in KNOWLEDGE and best > 0.0
            and direct.get(i, 0.0) >= SIBLING_SHARE * best}


def matching_first(
    ranked: list[Scored[C]], direct: Mapping[str, float], restated: Mapping[str, int], k: int
) -> list[Scored[C]]:
    """`ranked` with the unrelated steps among its first `k` moved below the last matching
    fact or procedure among them, each at most at the score of the one before it; the rest
    in its order. Restatements keep their places. What the first `k` hold is unchanged: a
    fact below them is not lifted in (measured: that cost LoCoMo evidence recall 0.4 points,
    docs/DECISIONS.md)."""
    best = max((direct.get(node.id, 0.0) for _, node, _ in ranked
                if node.type in (*KNOWLEDGE, N.EPISODIC)), default=0.0)
    floor = MATCHING_SHARE * best
    head = ranked[:k]
    matching = [i for i, (_, node, _) in enumerate(head)
                if node.type in KNOWLEDGE and node.id not in restated
                and direct.get(node.id, 0.0) >= floor]
    if best <= 0.0 or not matching:
        return ranked
    last = matching[-1]

    def unrelated(node: Node) -> bool:
        return (node.type is N.EPISODIC and node.id not in restated
                and direct.get(node.id, 0.0) < floor)

    kept = [item for item in head[: last + 1] if not unrelated(item[1])]
    moved = [item for item in head[: last + 1] if unrelated(item[1])]
    out = list(kept)
    for score, node, c in moved:
        out.append((min(score, out[-1][0]), node, c))
    return [*out, *head[last + 1 :], *ranked[k:]]
