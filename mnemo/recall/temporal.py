"""Recall that respects time.

By default a recall prefers what holds now: a retired fact (one a later fact contradicted)
scores `RETIRED_WEIGHT` of its relevance and always ranks right below its successor, which is
brought in when the ranking did not reach it, and says so (`Recalled.retired`,
`superseded_by`, its validity window). With `as_of`, the recall answers
as the memory stood then: nodes recorded later are left out, and a fact counts as retired only
if it was retired by then (transaction time: what mnemo knew at `as_of`). With `valid_at`, it
answers with the facts that held at that moment (valid time: `valid_from` up to `valid_to`,
as known at `as_of`), none of them weighed down for being retired since; the steps that only
facts of other times were made from are left out with them. Both read the nodes a recall has
read anyway: no query walks the repo's facts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from mnemo.errors import InvalidInputError
from mnemo.graph.facts import TEMPORAL
from mnemo.graph.model import LinkType, Node, NodeId
from mnemo.graph.ports import NodeReads
from mnemo.recall.model import Recalled

# A retired fact's share of its score: below what holds now, still found when asked for.
RETIRED_WEIGHT = 0.5
# How many retirements in a row a recall follows to the fact that holds now.
CHAIN = 4


@dataclass(frozen=True, slots=True)
class When:
    """The times a recall answers for: `as_of`, what the memory knew then (None: now), and
    `valid_at`, the moment its facts must hold at (None: any)."""

    as_of: datetime | None = None
    valid_at: datetime | None = None


def check_moment(moment: object, name: str) -> datetime | None:
    """`moment` as an aware datetime (a naive one is UTC).

    Raises:
        InvalidInputError: not a datetime.
    """
    if moment is None:
        return None
    if not isinstance(moment, datetime):
        raise InvalidInputError(f"{name} must be a datetime, got {type(moment).__name__}")
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _recorded(node: Node) -> datetime:
    return node.recorded_at or node.created_at


def retired_by(node: Node, as_of: datetime | None) -> bool:
    """Whether `node` is a fact retired at `as_of` (None: now)."""
    if node.retired_at is None or node.type not in TEMPORAL:
        return False
    return as_of is None or node.retired_at <= as_of


def weight(node: Node, when: When) -> float:
    """A node's share of its score for being retired at `when.as_of`: `RETIRED_WEIGHT` or 1
    (1 when asked for a moment: every fact left then held at it). Applied before diversity,
    so that a retired fact never takes its successor's place among near duplicates."""
    return RETIRED_WEIGHT if when.valid_at is None and retired_by(node, when.as_of) else 1.0


def holds(node: Node, when: When) -> bool:
    """Whether a recall at `when` keeps `node`: recorded by `as_of`, and for a fact, valid at
    `valid_at` (from `valid_from` up to the `valid_to` its retirement by `as_of` gave it)."""
    recorded = _recorded(node)
    if when.as_of is not None and recorded > when.as_of:
        return False
    if when.valid_at is None or node.type not in TEMPORAL:
        return True
    end = node.valid_to if retired_by(node, when.as_of) else None
    return (node.valid_from or recorded) <= when.valid_at and (end is None or when.valid_at < end)


def left_out(nodes: Iterable[Node], sources: Mapping[str, Sequence[str]], when: When) -> set[str]:
    """The ids a recall at `when` leaves out, of `nodes` and the steps the facts among them
    were made from (`sources`): those it does not keep (`holds`), and, for a moment
    (`valid_at`), the steps a fact of another time was made from (what a step says is of its
    time whole, though an instruction it repeats held earlier)."""
    nodes = list(nodes)
    out: set[str] = {n.id for n in nodes if not holds(n, when)}
    if when.valid_at is not None:
        out |= {step for n in out for step in sources.get(n, ())}
    return out


async def in_time(
    graph: NodeReads, repo: str, ranked: list[Recalled], when: When
) -> list[Recalled]:
    """`ranked` as of `when.as_of` (None: now): later nodes left out, retired facts marked
    (their scores already hold `weight`) and each placed right after the fact that succeeded
    it (`successors_first`): read, when the ranking did not reach it, following a chain of
    retirements up to `CHAIN` links. Asked for a moment (`valid_at`), the facts that held then
    are only marked: a successor of a later time neither joins nor goes first."""
    as_of = when.as_of
    if as_of is not None:
        ranked = [r for r in ranked if _recorded(r.node) <= as_of]
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
    """`ranked` with every retired fact right after the fact that succeeded it (from `pool`
    when `ranked` lacks it), which takes its place, at the better of their scores, when it
    ranked lower: a rule, whatever the scores; the rest in order."""
    by_id: dict[str, Recalled] = {r.node.id: r for r in pool}
    out: dict[str, Recalled] = {}
    for r in ranked:
        chain = [r]
        while (after := by_id.get(chain[-1].superseded_by or "")) is not None and (
                after.node.id not in out and after not in chain):
            chain.append(after)
        for c in reversed(chain):
            if c.node.id not in out:
                out[c.node.id] = replace(c, score=max(c.score, r.score))
    return list(out.values())


async def _successors(
    graph: NodeReads, repo: str, retired: list[NodeId], as_of: datetime | None
) -> dict[str, NodeId]:
    """The fact that succeeded each retired one: of the facts SUPERSEDES links it to (and
    recorded by `as_of`), the live one that began to hold last."""
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
