"""How recall ranks: reciprocal rank fusion, maximal marginal relevance, knowledge first
(docs/DECISIONS.md), and time: a retired fact scores `RETIRED_WEIGHT` of its relevance and ranks
right below its successor; `as_of` leaves out later nodes (transaction time), `valid_at` keeps
the facts that held then (valid time). Pure but for `in_time`'s read of successors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from mnemo.config import Config
from mnemo.errors import InvalidInputError, check_count, check_text
from mnemo.graph.model import TEMPORAL, LinkType, Node, NodeId, NodeType
from mnemo.graph.ports import NodeReads
from mnemo.graph.reads import node_types
from mnemo.recall.model import Recalled


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[str]], k: int, weights: Sequence[float] | None = None
) -> dict[str, float]:
    """Fuses rankings (best first) into scores, first place in every ranking scoring 1.0:
    score(d) = sum over rankings of w / (k + rank(d)), divided by its maximum."""
    weights = [1.0] * len(rankings) if weights is None else list(weights)
    best = sum(weights) / (k + 1)
    if best <= 0:
        return {}
    scores: dict[str, float] = {}
    for weight, ranking in zip(weights, rankings, strict=True):
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
    return {item: score / best for item, score in scores.items()}


def maximal_marginal_relevance(
    order: Sequence[str],
    relevance: Mapping[str, float],
    vectors: Mapping[str, npt.NDArray[np.float32]],
    lam: float,
) -> list[str]:
    """`order` re-ranked greedily: each next item maximises lam x relevance / best relevance -
    (1 - lam) x its highest cosine to the items chosen (Carbonell and Goldstein, 1998). An
    item without a vector is never penalised; lam = 1 keeps `order`. Quadratic in
    len(order): callers pass a bounded head."""
    if lam >= 1.0 or len(order) < 3:
        return list(order)
    top = max((relevance[i] for i in order), default=0.0)
    scale = top if top > 0 else 1.0
    dim = next((len(v) for v in vectors.values()), 0)
    rows = np.zeros((len(order), dim), dtype=np.float32)
    for row, item in enumerate(order):
        vector = vectors.get(item)
        if vector is not None:
            rows[row] = vector
    # Every pairwise cosine; an item without a (finite) vector is a zero row.
    cosines = np.nan_to_num(_cosines(rows), nan=0.0, posinf=0.0, neginf=0.0)
    # Each item's score to pick it; a chosen item's gain becomes -inf.
    gain = lam * np.array([relevance[i] for i in order], dtype=np.float64) / scale
    penalties = (1.0 - lam) * cosines.astype(np.float64)
    nearest = np.zeros(len(order), dtype=np.float64)
    score = gain.copy()
    chosen: list[str] = []
    for _ in range(len(order)):
        # argmax takes the first of equals: ties keep `order`, as a stable sort would.
        best = int(score.argmax())
        chosen.append(order[best])
        gain[best] = -np.inf
        np.maximum(nearest, penalties[best], out=nearest)
        np.subtract(gain, nearest, out=score)
    return chosen


# Rows of cosines one product computes (a whole head at once held the GIL for long).
_BLOCK = 256


def _cosines(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """`rows @ rows.T`: small by einsum (BLAS threads lose there), large by `_BLOCK` rows a call."""
    out: npt.NDArray[np.float32]
    if len(rows) <= _BLOCK:
        out = np.einsum("id,jd->ij", rows, rows)
        return out
    out = np.empty((len(rows), len(rows)), dtype=np.float32)
    for start in range(0, len(rows), _BLOCK):
        np.matmul(rows[start:start + _BLOCK], rows.T, out=out[start:start + _BLOCK])
    return out


N = NodeType
KNOWLEDGE = (N.SEMANTIC, N.PROCEDURAL)
# How well a fact must match (its hop-0 relevance against its step's) to stand for its step.
EVIDENCE_SHARE = 0.5
# How well a fact must match (against the best memory's) to go above steps that matched less.
MATCHING_SHARE = 0.5
# How well a further fact of a step must match (against the best memory's) to join the first.
SIBLING_SHARE = 0.95

C = TypeVar("C")
Scored = tuple[float, Node, C]


@dataclass(frozen=True, slots=True)
class Matched:
    """How the query's own channels matched each node at hop 0: their fused score, and the
    dense channel's cosine (`meaning`; absent where it found nothing)."""

    fused: Mapping[str, float]
    meaning: Mapping[str, float]

    def answers(self, fact: str, step: str) -> bool:
        """Whether a fact answers in place of the step it came from: the query's channels
        matched it at least `EVIDENCE_SHARE` as well as the step, together or by meaning alone
        (a step's words hold its action's and its neighbours', which a fact made from it lacks)."""
        return (answers(self.fused.get(fact, 0.0), self.fused.get(step, 0.0))
                or answers(self.meaning.get(fact, 0.0), self.meaning.get(step, 0.0)))


def stand_ins(
    scored: list[Scored[C]], matched: Matched, sources: Mapping[str, Sequence[str]],
    restated: Mapping[str, int], *, procedural: bool = False,
) -> dict[str, list[Scored[C]]]:
    """For each step that facts or procedures of `scored` were made from (`sources`), those
    that may take its place (`Matched.answers`), best first. A step that restates the query
    stands for itself, unless a fact of it restates it as closely; a `procedural` query takes
    the step's procedure first, whatever its words."""
    found: dict[str, list[tuple[tuple[bool, float, float], Scored[C]]]] = {}
    for item in scored:
        score, node, _ = item
        if node.type not in KNOWLEDGE:
            continue
        own = matched.fused.get(node.id, 0.0)
        asked = procedural and node.type is N.PROCEDURAL
        for step in sources.get(node.id, ()):
            if step == node.id or (step in restated
                                   and restated.get(node.id, 2) > restated[step]):
                continue  # the step restates the query more closely than the fact
            if not asked and not matched.answers(node.id, step):
                continue
            found.setdefault(step, []).append(((asked, own, score), item))
    return {step: [item for _, item in sorted(ranked, key=lambda r: r[0], reverse=True)]
            for step, ranked in found.items()}


def answers(fact: float, step: float) -> bool:
    """Whether a fact matched `fact` well answers in place of a step matched `step` well."""
    return fact > 0.0 and fact >= EVIDENCE_SHARE * step


def above_their_steps(ranked: list[Recalled], matched: Matched) -> list[Recalled]:
    """`ranked` with each live fact or procedure placed above the steps it came from that
    rank before it and that it `answers` for, at the first one's place and the better score."""
    out = list(ranked)
    for r in ranked:
        if r.node.type not in KNOWLEDGE or r.retired or not r.evidence:
            continue
        at = next(i for i, o in enumerate(out) if o.node.id == r.node.id)
        first = next((i for i, o in enumerate(out[:at]) if o.node.id in r.evidence
                      and matched.answers(r.node.id, o.node.id)), None)
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
    fact or procedure among them, each at most at the score of the one before it;
    restatements keep their places, and nothing below `k` is lifted in."""
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

    out = [item for item in head[: last + 1] if not unrelated(item[1])]
    moved = [item for item in head[: last + 1] if unrelated(item[1])]
    for score, node, c in moved:
        out.append((min(score, out[-1][0]), node, c))
    return [*out, *head[last + 1 :], *ranked[k:]]


# A retired fact's share of its score: below what holds now, still found when asked for.
RETIRED_WEIGHT = 0.5
# How many retirements in a row a recall follows to the fact that holds now.
CHAIN = 4


@dataclass(frozen=True, slots=True)
class When:
    """The times a recall answers for: `as_of` (None: now), and `valid_at` (None: any)."""

    as_of: datetime | None = None
    valid_at: datetime | None = None


def check_moment(moment: object, name: str) -> datetime | None:
    """`moment` as an aware datetime (a naive one is UTC); InvalidInputError if not one."""
    if moment is None:
        return None
    if not isinstance(moment, datetime):
        raise InvalidInputError(f"{name} must be a datetime, got {type(moment).__name__}")
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _recorded(node: Node) -> datetime:
    return node.recorded_at or node.created_at


def retired_by(node: Node, as_of: datetime | None) -> bool:
    """Whether `node` is a fact retired at `as_of` (None: now)."""
    return (node.retired_at is not None and node.type in TEMPORAL
            and (as_of is None or node.retired_at <= as_of))


def weight(node: Node, when: When) -> float:
    """A node's share of its score for being retired at `when.as_of`: `RETIRED_WEIGHT` or 1
    (1 when asked for a moment). Applied before diversity."""
    return RETIRED_WEIGHT if when.valid_at is None and retired_by(node, when.as_of) else 1.0


def holds(node: Node, when: When) -> bool:
    """Whether a recall at `when` keeps `node` (recorded by `as_of`, valid at `valid_at`)."""
    recorded = _recorded(node)
    if when.as_of is not None and recorded > when.as_of:
        return False
    if when.valid_at is None or node.type not in TEMPORAL:
        return True
    end = node.valid_to if retired_by(node, when.as_of) else None
    return (node.valid_from or recorded) <= when.valid_at and (end is None or when.valid_at < end)


def left_out(nodes: Iterable[Node], sources: Mapping[str, Sequence[str]], when: When) -> set[str]:
    """The ids a recall at `when` leaves out, of `nodes` and the steps their facts were made
    from: those it does not keep (`holds`), and for `valid_at` the steps of a fact of another
    time."""
    out: set[str] = {n.id for n in nodes if not holds(n, when)}
    if when.valid_at is not None:
        out |= {step for n in out for step in sources.get(n, ())}
    return out


async def in_time(
    graph: NodeReads, repo: str, ranked: list[Recalled], when: When
) -> list[Recalled]:
    """`ranked` (recorded by `when.as_of`, as `left_out` keeps) with its facts retired at `as_of`
    (None: now) marked and each right after its successor (read when the ranking did not reach
    it, up to `CHAIN` links). For `valid_at`, facts that held then are only marked."""
    as_of = when.as_of
    pool: dict[str, Recalled] = {r.node.id: r for r in ranked}
    asked = ranked
    for _ in range(CHAIN):
        retired = [r.node.id for r in asked if retired_by(r.node, as_of)]
        if not retired:
            break
        successor = await _successors(graph, repo, retired, as_of)
        for node_id in retired:
            pool[node_id] = replace(pool[node_id], retired=True,
                                    superseded_by=successor.get(node_id))
        missing = [i for i in dict.fromkeys(successor.values()) if i not in pool]
        if when.valid_at is not None:
            return [pool[r.node.id] for r in ranked]
        if not missing:
            break
        by = {after: pool[before] for before, after in successor.items()}
        asked = [Recalled(node, by[node.id].score, "hop", by[node.id].hop + 1)
                 for node in await graph.get_nodes(repo, missing)]
        pool.update((r.node.id, r) for r in asked)
    return successors_first([pool[r.node.id] for r in ranked], pool.values())


def successors_first(ranked: list[Recalled], pool: Iterable[Recalled]) -> list[Recalled]:
    """`ranked` with every retired fact right after its successor (from `pool` when `ranked`
    lacks it), which takes its place at the better score if it ranked lower."""
    by_id: dict[str, Recalled] = {r.node.id: r for r in pool}
    out: dict[str, Recalled] = {}
    for r in ranked:
        chain = [r]
        while (after := by_id.get(chain[-1].superseded_by or "")) is not None and (
                after.node.id not in out and after not in chain):
            chain.append(after)
        for c in reversed(chain):
            if c.node.id not in out:
                out[c.node.id] = c if c.score >= r.score else replace(c, score=r.score)
    return list(out.values())


async def _successors(
    graph: NodeReads, repo: str, retired: list[NodeId], as_of: datetime | None
) -> dict[str, NodeId]:
    """The successor of each retired fact: of the facts SUPERSEDES links it to (recorded by
    `as_of`), the live one that began to hold last."""
    links = await graph.neighbors(repo, retired, LinkType.SUPERSEDES)
    found_nodes = await graph.get_nodes(repo, [n.node_id for n in links])
    nodes: dict[str, Node] = {n.id: n for n in found_nodes}
    found: dict[str, NodeId] = {}
    for link in links:
        other = nodes.get(link.node_id)
        if other is None or (as_of is not None and _recorded(other) > as_of):
            continue
        current = nodes.get(found.get(link.origin, ""))
        if current is None or _rank(other, as_of) > _rank(current, as_of):
            found[link.origin] = other.id
    return found


def _rank(node: Node, as_of: datetime | None) -> tuple[bool, datetime]:
    """A successor is live rather than retired itself, then the latest to hold."""
    return not retired_by(node, as_of), node.valid_from or _recorded(node)


# How much each kind of memory counts for a query of each mode.
MODE_WEIGHTS: dict[str, dict[NodeType, float]] = {
    "mixed": {},
    "semantic": {NodeType.SEMANTIC: 1.0, NodeType.EPISODIC: 0.9, NodeType.PROCEDURAL: 0.7},
    "episodic": {NodeType.EPISODIC: 1.0, NodeType.SEMANTIC: 0.9, NodeType.PROCEDURAL: 0.7},
    "procedural": {NodeType.PROCEDURAL: 1.0, NodeType.SEMANTIC: 0.8, NodeType.EPISODIC: 0.8},
}


def descending(ranked: list[Recalled]) -> list[Recalled]:
    """Scores capped by the one before, so they read best first after a reorder."""
    out: list[Recalled] = []
    for r in ranked:
        if out and r.score > out[-1].score:
            r = replace(r, score=out[-1].score)  # the rest as it was: retired, successor
        out.append(r)
    return out


def check_recall(
    config: Config, query: object, k: object, types: Iterable[NodeType] | None,
    as_of: object, valid_at: object = None,
) -> tuple[list[NodeType] | None, datetime | None, datetime | None]:
    """A recall's input checked against the repo's `config` (InvalidInputError): the query,
    `k`, the types, and the moments (made aware)."""
    check_text(query, "query", limit=config.max_text_chars, stored=False)
    check_count("k", k, minimum=1, maximum=config.max_results, setting="Config.max_results")
    return (None if types is None else node_types(types), check_moment(as_of, "as_of"),
            check_moment(valid_at, "valid_at"))
