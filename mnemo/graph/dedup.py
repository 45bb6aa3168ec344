"""How a changeset's TAG, INTENT, SEMANTIC and PROCEDURAL nodes meet the ones already there.
Tags are one when their normalised labels are; the others by raw cosine with nodes of their
type: at the identity threshold the new one is dropped, at the merge threshold the LLM merges
the wordings (the existing one stays on failure), below it is kept. Nodes are one only when of
one scope; facts and instructions only when `alike` too (cosine joins "port 8000" and "8001").
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from mnemo import text as _text
from mnemo.graph import ann
from mnemo.graph.model import Link, NodeDraft, NodeType, Vector
from mnemo.graph.vectors import VectorIndex, unit
from mnemo.ports import COSINE_TOLERANCE, cosine, reaches

# Merges two intent wordings into one, with its vector; None keeps the existing wording.
IntentMerger = Callable[[str, str], Awaitable[tuple[str, Vector] | None]]
# Merges (existing, new) pairs at once, an answer per pair.
IntentMerges = Callable[[Sequence[tuple[str, str]]], Awaitable[list[tuple[str, Vector] | None]]]
# Looks up (id, text) of existing intents by id.
TextLookup = Callable[[list[str]], Awaitable[dict[str, str]]]
# For each draft, graph nodes of its type near it: (id, raw cosine), best first.
Nearest = list[list[tuple[str, float]]]

# Words that join or order a statement's parts without changing what it says.
_FILLERS = frozenset("an the and then also so just".split())
_NEGATIONS = frozenset(
    _text.stem(w) for w in "not no never none nothing nobody neither nor without cannot".split())


# Past this length a text is one word of its own, compared whole (no stemming on the loop).
_SAID_CHARS = 2_000


def _said(text: str) -> set[str]:
    if len(text) > _SAID_CHARS:
        return {" ".join(text.casefold().split())}
    return {"not" if w.lower().endswith("n't") else _text.stem(w.lower())
            for w in _text.words(text)} - _FILLERS


def alike(a: str, b: str, said: Callable[[str], set[str]] = _said) -> bool:
    """Whether two facts (or instructions) may be one node: either `says_no_more` than the other."""
    return says_no_more(a, b, said) or says_no_more(b, a, said)


def says_no_more(new: str, old: str, said: Callable[[str], set[str]] = _said) -> bool:
    """Whether `new` says nothing `old` does not: its words (stemmed, bar articles and
    joiners) are all `old`'s, and what `old` adds is no negation."""
    small, big = said(new), said(old)
    return small <= big and not (big - small) & _NEGATIONS


def differ_in_specifics(a: str, b: str) -> bool:
    """Whether two wordings differ in what a cosine barely weighs: a word with a digit (a
    number, a version, a code) one says and the other not, or a negation."""
    return _specifics(a) != _specifics(b)


def _specifics(text: str) -> set[str]:
    said = _said(text)
    negated = {"not"} if said & _NEGATIONS else set()
    return {w for w in said if any(c.isdigit() for c in w)} | negated


@dataclass(slots=True)
class Resolution:
    """What survives of a changeset: drafts to insert, id remaps, and rewordings."""

    remap: dict[str, str] = field(default_factory=dict)
    rewordings: dict[str, tuple[str, Vector]] = field(default_factory=dict)

    def survivor(self, node_id: str) -> str:
        return self.remap.get(node_id, node_id)


def resolve_tags(drafts: list[NodeDraft], existing: dict[str, str], out: Resolution) -> None:
    """Maps each TAG draft whose key is taken (by the graph or an earlier draft) to the owner."""
    owners = dict(existing)
    for draft in drafts:
        if draft.type is not NodeType.TAG or draft.key is None:
            continue
        owner = owners.setdefault(draft.key, draft.id)
        if owner != draft.id:
            out.remap[draft.id] = owner


async def resolve_intents(
    drafts: list[NodeDraft],
    index: VectorIndex,
    in_scope: TextLookup,
    texts_of: TextLookup,
    merge: IntentMerger,
    *,
    identity_threshold: float,
    merge_threshold: float,
) -> Resolution:
    """Drops, merges or keeps each INTENT draft against the graph's intents of its scope and
    earlier drafts. `in_scope` gives the texts of those of some intents in the drafts' scope
    (`scope.same`); of the `SCOPED_CANDIDATES` nearest reaching the merge threshold, the
    nearest in the scope is compared."""
    out = Resolution()
    intents = [d for d in drafts if d.type is NodeType.INTENT]
    if not intents:
        return out
    graph_ids, graph_matrix = await ann.of_type(index, NodeType.INTENT)
    nearest: Nearest = [[] for _ in intents]
    known: dict[str, str] = {}
    if graph_ids:
        vectors = unit(np.stack([d.vector for d in intents]))
        to_graph = await ann.by_size(len(graph_ids), lambda: vectors @ graph_matrix.T)
        near = [_nearest_reaching(row, merge_threshold) for row in to_graph]
        asked = sorted({graph_ids[j] for row in near for j in row})
        known = await in_scope(asked) if asked else {}
        nearest = [[(graph_ids[j], float(to_graph[i, j])) for j in row
                    if graph_ids[j] in known][:1] for i, row in enumerate(near)]
    await resolve(intents, nearest, known, texts_of, merge,
                  identity_threshold=identity_threshold, merge_threshold=merge_threshold, out=out)
    return out


# How many of the graph's intents reaching the merge threshold a draft is compared with at
# most, nearest first (another scope's are passed over).
SCOPED_CANDIDATES = 1_000


def _nearest_reaching(similarities: Vector, threshold: float) -> list[int]:
    """The columns reaching `threshold` (`reaches`), nearest first, at most `SCOPED_CANDIDATES`."""
    columns = np.flatnonzero(similarities >= threshold - COSINE_TOLERANCE)
    order = np.argsort(-similarities[columns], kind="stable")[:SCOPED_CANDIDATES]
    return [int(j) for j in columns[order]]


async def resolve(
    drafts: list[NodeDraft],
    nearest: Nearest,
    known: dict[str, str],
    texts_of: TextLookup,
    merge: IntentMerger,
    *,
    identity_threshold: float,
    merge_threshold: float,
    out: Resolution,
    knowledge: bool = False,
) -> None:
    """Drops, merges or keeps each of `drafts` (of one type) against its `nearest` graph nodes
    and the earlier drafts kept, by the thresholds; facts and instructions (`knowledge`) only
    with one `alike`, merged by `merged_knowledge`."""
    vectors = unit(np.stack([d.vector for d in drafts]))
    to_batch = vectors @ vectors.T
    kept: dict[str, str] = {}  # id -> text of the drafts kept
    order: list[int] = []  # positions of kept drafts, in the order they were kept
    reworded: set[int] = set()  # indices into `order` of kept drafts merged since
    said = functools.cache(_said)  # each text's words, read once for this changeset

    async def text(node_id: str) -> str:
        if node_id in out.rewordings:
            return out.rewordings[node_id][0]
        if node_id in kept:
            return kept[node_id]
        if node_id in known:
            return known[node_id]
        return (await texts_of([node_id])).get(node_id, "")

    for i, draft in enumerate(drafts):
        sims = to_batch[i, order]
        close = {*np.flatnonzero(sims >= merge_threshold - COSINE_TOLERANCE).tolist(), *reworded}
        # The drafts of one changeset are of one scope (`Changeset.metadata`).
        options = [*nearest[i], *((drafts[order[n]].id, float(sims[n])) for n in close)]
        # A merged wording is compared by its own vector.
        options = sorted(
            ((node_id, cosine(draft.vector, out.rewordings[node_id][1])
              if node_id in out.rewordings else similarity) for node_id, similarity in options),
            key=lambda option: -option[1])
        chosen: tuple[str, float] | None = None
        for node_id, similarity in options:
            if not reaches(similarity, merge_threshold):
                break
            if not knowledge or alike(await text(node_id), draft.text, said):
                chosen = node_id, similarity
                break
        if chosen is None:
            kept[draft.id] = draft.text
            order.append(i)
            continue
        best_id, best_sim = chosen
        out.remap[draft.id] = best_id
        existing = await text(best_id)
        # A draft that says nothing more is dropped, as is an intent identical to the other.
        if says_no_more(draft.text, existing, said) or (
                not knowledge and reaches(best_sim, identity_threshold)):
            continue
        merged = await (merged_knowledge(merge, existing, draft) if knowledge
                        else merge(existing, draft.text))
        if merged is not None:
            out.rewordings[best_id] = merged
            if best_id in kept:
                reworded.add(next(n for n, at in enumerate(order) if drafts[at].id == best_id))


async def merged_knowledge(
    merge: IntentMerger, existing: str, draft: NodeDraft
) -> tuple[str, Vector] | None:
    """The merged wording of a fact with one `alike`: the LLM's answer is taken only if it
    keeps every word of the fuller wording, else the fuller one is (None: the existing)."""
    new_fuller = len(_said(draft.text)) > len(_said(existing))
    fuller, other = (draft.text, existing) if new_fuller else (existing, draft.text)
    merged = await merge(fuller, other)
    if merged is not None and _said(fuller) <= _said(merged[0]):
        return merged
    return (draft.text, draft.vector) if new_fuller else None


def remap_links(links: list[Link], resolution: Resolution) -> list[Link]:
    """Links redirected to survivors, without self-links or duplicates, in order."""
    survivor = resolution.survivor
    moved = dict.fromkeys(Link(survivor(k.src), survivor(k.dst), k.type) for k in links)
    return [link for link in moved if link.src != link.dst]
