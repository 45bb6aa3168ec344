"""How a changeset's TAG and INTENT nodes meet the ones already there.

Tags are the same when their normalised labels are equal. Intents are compared by raw cosine:
at or above the identity threshold the new one is dropped, at or above the merge threshold the
two are merged into one wording by the LLM (the existing wording stays when that fails), below
it the new intent is kept. Either way whatever linked to a dropped or merged node is linked to
the survivor. Both checks run against the batch itself and against the graph.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from mnemo.graph import ann_calls
from mnemo.graph.model import Link, LinkType, NodeDraft, NodeType, Vector
from mnemo.graph.vectors import VectorIndex, cosine, reaches, unit

# Merges two intent wordings into one, with its vector; None keeps the existing wording.
IntentMerger = Callable[[str, str], Awaitable[tuple[str, Vector] | None]]
# Merges many (existing, new) pairs at once, an answer per pair (one model call for a commit).
IntentMerges = Callable[[Sequence[tuple[str, str]]], Awaitable[list[tuple[str, Vector] | None]]]
# Looks up (id, text) of existing intents by id.
TextLookup = Callable[[list[str]], Awaitable[dict[str, str]]]


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
    texts_of: TextLookup,
    merge: IntentMerger,
    *,
    identity_threshold: float,
    merge_threshold: float,
    out: Resolution,
) -> None:
    """Drops, merges or keeps each INTENT draft against the graph's intents and earlier drafts.

    Similarities come from two matrix products (drafts by graph intents, drafts by drafts), not
    a cosine per pair: a big changeset's dedup was quadratic in Python (BENCHMARKS.md).
    """
    intents = [d for d in drafts if d.type is NodeType.INTENT]
    if not intents:
        return
    vectors = unit(np.stack([d.vector for d in intents]))
    graph_ids, graph_matrix = await ann_calls.of_type(index, NodeType.INTENT)
    to_graph = (
        await ann_calls.by_size(len(graph_ids), lambda: vectors @ graph_matrix.T)
        if graph_ids else np.zeros((len(intents), 0))
    )
    to_batch = vectors @ vectors.T
    kept: dict[int, tuple[str, Vector]] = {}  # draft position -> (text, vector) of survivors
    position = {d.id: i for i, d in enumerate(intents)}
    order: list[int] = []  # positions of kept drafts, in the order they were kept
    reworded: set[int] = set()  # indices into `order` whose wording was merged
    for i, draft in enumerate(intents):
        best_id, best_sim = None, -2.0
        if graph_ids:
            j = int(np.argmax(to_graph[i]))
            best_id, best_sim = graph_ids[j], float(to_graph[i, j])
            if best_id in out.rewordings:
                best_sim = cosine(draft.vector, out.rewordings[best_id][1])
        if order:
            sims = to_batch[i, order]
            for n in reworded:  # a merged wording has its own vector
                sims[n] = cosine(draft.vector, out.rewordings[intents[order[n]].id][1])
            n = int(np.argmax(sims))
            if float(sims[n]) > best_sim:
                best_id, best_sim = intents[order[n]].id, float(sims[n])
        if best_id is None or not reaches(best_sim, merge_threshold):
            kept[i] = (draft.text, draft.vector)
            order.append(i)
            continue
        out.remap[draft.id] = best_id
        if reaches(best_sim, identity_threshold):
            continue
        if best_id in out.rewordings:
            existing_text = out.rewordings[best_id][0]
        elif best_id in position:
            existing_text = kept[position[best_id]][0]
        else:
            existing_text = (await texts_of([best_id])).get(best_id, "")
        merged = await merge(existing_text, draft.text)
        if merged is not None:
            out.rewordings[best_id] = merged
            if best_id in position:
                reworded.add(order.index(position[best_id]))


def remap_links(links: list[Link], resolution: Resolution) -> list[Link]:
    """Links redirected to survivors, without self-links or duplicates, in order."""
    survivor = resolution.remap.get
    seen: set[tuple[str, str, LinkType]] = set()
    result: list[Link] = []
    for link in links:
        src, dst = survivor(link.src, link.src), survivor(link.dst, link.dst)
        key = (src, dst, link.type)
        if src == dst or key in seen:
            continue
        seen.add(key)
        result.append(link if (src, dst) == (link.src, link.dst) else Link(src, dst, link.type))
    return result
