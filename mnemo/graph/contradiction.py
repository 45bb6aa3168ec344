"""Contradicted facts are retired, not deleted: before the commit's lock each new fact is
compared with the closest live facts of its type and the changeset's earlier ones, and the LLM
is asked once per commit (not when none is close; a repeat is left to deduplication). A retired
fact keeps `valid_to` and `retired_at`, linked from its successor by SUPERSEDES.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import numpy as np

from mnemo.graph.dedup import says_no_more
from mnemo.graph.model import TEMPORAL, Changeset, LinkType, Node, NodeDraft, NodeType
from mnemo.graph.scope import check_where, same
from mnemo.graph.vectors import TYPE_CODES, unit
from mnemo.ports import COSINE_TOLERANCE, cosine, reaches

if TYPE_CHECKING:
    from mnemo.graph.ports import IntentPolicy, RecallReads


@dataclass(frozen=True, slots=True)
class Question:
    """Does `new` end any of `existing` (facts of its type, close to it)?"""

    new: str
    existing: tuple[str, ...]


# Answers every question of one commit at once: the positions in `existing` each new fact ends.
Contradicts = Callable[[Sequence[Question]], Awaitable[list[set[int]]]]


@dataclass(frozen=True, slots=True)
class Retirement:
    """`retired` stops holding at `valid_to` (None: at the commit), succeeded by `successor`."""

    retired: str
    successor: str
    valid_to: datetime | None


async def retirements(
    graph: RecallReads, changeset: Changeset, intents: IntentPolicy,
    nearest: Mapping[str, list[tuple[str, float]]],
) -> list[Retirement]:
    """The facts the changeset's facts contradict, asked in one call of `intents.contradicts`
    (none without it): each new fact against `contradiction_candidates` live facts of its type
    per channel (vector, words) at cosine >= `contradiction_similarity`, and as many closest
    told before it in the changeset. A repeat at least `merge_threshold` close is not asked."""
    contradicts, candidates = intents.contradicts, intents.contradiction_candidates
    close, joined = intents.contradiction_similarity, intents.merge_threshold
    if contradicts is None or candidates <= 0:
        return []
    own = {n.id for n in changeset.nodes}
    told = _told(changeset)
    # A fact ends only facts of its own scope: searched inside it, then checked exactly.
    where = check_where(changeset.metadata)
    scope = None if where is None else await graph.scope(changeset.repo, where)
    facts = sorted((n for n in changeset.nodes if n.type in TEMPORAL), key=lambda n: told[n.id])
    earlier = _earlier(facts, candidates, close)
    asked: list[tuple[NodeDraft, list[Node | NodeDraft]]] = []
    for node in facts:
        kinds = [node.type]
        # The repo-wide nearest (`nearest`) serve an unscoped changeset only.
        by_vector = (nearest[node.id][:candidates] if scope is None
                     else await graph.search_vectors(changeset.repo, node.vector, candidates,
                                                     kinds, scope))
        similarity = {i: s for i, s in by_vector if reaches(s, close)}
        worded = [i for i, _ in await graph.search_text(
            changeset.repo, node.text, candidates, kinds, scope) if i not in similarity]
        if worded:
            similar = await graph.similarities(changeset.repo, worded, node.vector)
            similarity |= {i: similar[i] for i in worded if reaches(similar.get(i, -1.0), close)}
        fresh = [i for i in similarity if i not in own]
        olds: list[Node | NodeDraft] = [
            old for old in await graph.get_nodes(changeset.repo, fresh)
            if not old.retired and same(old.metadata, changeset.metadata)
            and not _one_fact(node.text, old.text, similarity[old.id], joined)]
        olds += [old for old in earlier[node.id]
                 if not _one_fact(node.text, old.text, cosine(node.vector, old.vector), joined)]
        if olds:
            asked.append((node, olds))
    if not asked:
        return []
    verdicts = await contradicts(
        [Question(node.text, tuple(old.text for old in olds)) for node, olds in asked]
    )
    found: list[Retirement] = []
    seen: set[str] = set()
    for (node, olds), ended in zip(asked, verdicts, strict=True):
        for position, old in enumerate(olds):
            if position not in ended or old.id in seen:
                continue
            seen.add(old.id)
            if node.valid_from and old.valid_from and node.valid_from < old.valid_from:
                seen.add(node.id)
                found.append(Retirement(node.id, old.id, old.valid_from))
                break  # the new fact is retired: it ends nothing more
            found.append(Retirement(old.id, node.id, node.valid_from))
    return found


def _one_fact(new: str, old: str, similarity: float, joined: float) -> bool:
    """Whether `new` is `old` again: at least `joined` close, saying no more."""
    return reaches(similarity, joined) and says_no_more(new, old)


def _told(changeset: Changeset) -> dict[str, tuple[int, int]]:
    """When the changeset told each node: (its last PROVENANCE step or -1, its place)."""
    index = {n.id: n.data.get("index") for n in changeset.nodes if n.type is NodeType.EPISODIC}
    step: dict[str, int] = {}
    for link in changeset.links:
        at = index.get(link.dst)
        if link.type is LinkType.PROVENANCE and isinstance(at, int):
            step[link.src] = max(step.get(link.src, at), at)
    return {n.id: (step.get(n.id, -1), place) for place, n in enumerate(changeset.nodes)}


def _earlier(
    facts: Sequence[NodeDraft], candidates: int, close: float
) -> dict[str, list[NodeDraft]]:
    """For each fact (`facts` in the order they were told), the `candidates` closest facts of
    its type told before it, at a cosine of at least `close`, closest (then latest) first."""
    found: dict[str, list[NodeDraft]] = {n.id: [] for n in facts}
    if len(facts) < 2:
        return found
    similar = unit([n.vector for n in facts])
    similar = similar @ similar.T
    types = np.array([TYPE_CODES[n.type] for n in facts])
    # Pairs (i, j) with j told before i, of i's type, close enough: one array operation.
    pairs = (np.tri(len(facts), k=-1, dtype=bool) & (types[:, None] == types[None, :])
             & (similar.astype(np.float64) >= close - COSINE_TOLERANCE))
    for i, node in enumerate(facts):
        before = np.flatnonzero(pairs[i])
        # Closest first; ties: the latest told.
        before = before[np.lexsort((-before, -similar[i, before]))][:candidates]
        found[node.id] = [facts[int(j)] for j in before]
    return found


async def still_live(
    graph: RecallReads, repo: str, planned: list[Retirement], added: set[str]
) -> list[Retirement]:
    """The retirements that still apply under the lock (the old fact still there and live)."""
    pairs = [r for r in planned if r.retired in added or r.successor in added]
    existing = [i for r in pairs for i in (r.retired, r.successor) if i not in added]
    live = {n.id for n in await graph.get_nodes(repo, existing) if not n.retired}
    return [r for r in pairs if {r.retired, r.successor} <= added | live]
