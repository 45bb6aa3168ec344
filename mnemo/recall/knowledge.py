"""Knowledge first: what recall does with a fact or procedure beside the steps it came from.

Extraction turns a step into the facts and procedures it told; recall finds both, and a raw
step, longer and holding every word, often matches a query better than the fact made from it.
The rules (docs/DECISIONS.md, "Knowledge first"):

- **The step is the fact's evidence.** Where a step ranks, the fact or procedure extracted
  from it (alone or with other steps) that answers the query best takes its place: of those
  the query's own channels matched at least `EVIDENCE_SHARE` as well as the step, the one
  they matched best; the step is reachable from it (`Recalled.evidence`). Otherwise the
  step. A fact made from that step alone stands for it (the step is not returned beside
  it); its other facts come after one result of every other step, unless one matched about
  as well as the best memory (`SIBLING_SHARE`). The place is the ranking's: only which node
  fills it changes (measured: folding the step into the fact before ranking moved LoCoMo
  evidence recall 0.772 -> 0.767-0.771, docs/DECISIONS.md).
- **A fact that answers is never below its steps** (`above_their_steps`, the last word on
  the order): a live fact or procedure returned with one of the steps it came from, which it
  answers at least `EVIDENCE_SHARE` as well as, takes the place of the first of those steps,
  whatever the scores, the levers or a re-ranking made of them.
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

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from mnemo.graph.model import Node, NodeType
from mnemo.recall.model import Recalled

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
    scored: list[Scored[C]], direct: Mapping[str, float], sources: Mapping[str, Sequence[str]],
    restated: Mapping[str, int], *, procedural: bool = False,
) -> dict[str, list[Scored[C]]]:
    """For each step that facts or procedures of `scored` were made from (`sources`: their
    PROVENANCE steps, `ReadContext.sources`), those that may take its place, best first: the
    ones the query's own channels (`direct`, hop-0 relevance) matched at least
    `EVIDENCE_SHARE` as well as the step, the best matched first; by the step's id. A step
    that restates the query stands for itself, unless a fact of it restates it as closely. A
    query that asks what to do (`procedural`, the plan's mode) is answered by the step's
    procedure first, however little of the query its instruction's words hold (the query
    names the situation, the instruction what to do)."""
    found: dict[str, list[tuple[tuple[bool, float, float], Scored[C]]]] = {}
    for item in scored:
        score, node, _ = item
        if node.type not in KNOWLEDGE:
            continue
        own = direct.get(node.id, 0.0)
        asked = procedural and node.type is N.PROCEDURAL
        for step in sources.get(node.id, ()):
            if step == node.id or (step in restated
                                   and restated.get(node.id, 2) > restated[step]):
                continue  # the step restates the query more closely than the fact
            if not asked and not answers(own, direct.get(step, 0.0)):
                continue
            found.setdefault(step, []).append(((asked, own, score), item))
    return {step: [item for _, item in sorted(ranked, key=lambda r: r[0], reverse=True)]
            for step, ranked in found.items()}


def answers(fact: float, step: float) -> bool:
    """Whether a fact the query's own channels matched `fact` well answers the query in
    place of a step they matched `step` well: at least `EVIDENCE_SHARE` as well."""
    return fact > 0.0 and fact >= EVIDENCE_SHARE * step


def above_their_steps(ranked: list[Recalled], direct: Mapping[str, float]) -> list[Recalled]:
    """`ranked` with each live fact or procedure placed above the steps it came from
    (`Recalled.evidence`) that rank before it and that it `answers` for: at the place of the
    first of them, at the better of the two scores. The rest keep their order."""
    out = list(ranked)
    for r in ranked:
        if r.node.type not in KNOWLEDGE or r.retired or not r.evidence:
            continue
        at = next(i for i, o in enumerate(out) if o.node.id == r.node.id)
        own = direct.get(r.node.id, 0.0)
        first = next((i for i, o in enumerate(out[:at]) if o.node.id in r.evidence
                      and answers(own, direct.get(o.node.id, 0.0))), None)
        if first is not None:
            out.insert(first, replace(out.pop(at), score=max(r.score, out[first].score)))
    return out


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
