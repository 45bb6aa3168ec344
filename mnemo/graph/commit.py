"""How a changeset becomes part of a repo's graph, whatever the backend: `apply` decides what
it adds from the backend's reads (`CommitTarget`) and writes it with its receipt in one
transaction (applying it twice returns the first receipt). Tags dedup by key and scope; intents,
facts and instructions by raw cosine within their scope (`graph.dedup`). LLM merges are decided
before the repo's lock and only looked up under it; one needed newly is decided with the lock
let go, then it tries again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from mnemo.errors import EmbeddingError
from mnemo.graph import contradiction
from mnemo.graph.dedup import (
    IntentMerger,
    Resolution,
    remap_links,
    resolve,
    resolve_intents,
    resolve_tags,
)
from mnemo.graph.erasure import Contribution
from mnemo.graph.model import (
    Changeset,
    CommitReceipt,
    Link,
    LinkType,
    Node,
    NodeDraft,
    NodeId,
    NodeType,
    Vector,
    now_utc,
)
from mnemo.graph.ports import (
    GraphStore,
    IntentPolicy,
    SideWrite,
    SourceForgotten,
    SourceRecorded,
    SourceTaken,
    StepsCommitted,
    VectorsMoved,
)
from mnemo.graph.scope import Metadata, canonical, same
from mnemo.graph.vectors import Snapshot, VectorIndex, unit

# How often a commit lets the lock go to ask the LLM for merges the graph newly needs.
MERGE_ROUNDS = 2
KNOWLEDGE = (NodeType.SEMANTIC, NodeType.PROCEDURAL)
# The graph's nodes of its type a new fact or instruction is compared with (the nearest before
# the lock, plus those committed since).
NEAREST = 4


@dataclass(frozen=True, slots=True)
class CommitPlan:
    """What one commit writes in one transaction: new nodes, reworded intents, links, receipt."""

    repo: str
    changeset_id: str
    nodes: list[tuple[NodeDraft, str, Vector]]
    rewordings: dict[str, tuple[str, Vector]]
    links: list[Link]
    receipt: CommitReceipt
    created_at: str
    session_id: str | None = None
    source_id: str | None = None
    # Facts the changeset's facts contradict: (id, valid_to as ISO text or None: now).
    retired: tuple[tuple[str, str | None], ...] = ()
    # The graph's facts and instructions the changeset's joined, with what each brought.
    joined: dict[str, Contribution] = field(default_factory=dict)
    # The scope every new node carries (`Changeset.metadata`).
    metadata: Metadata = field(default_factory=dict)


class CommitTarget(GraphStore, Protocol):
    """What a backend gives the commit procedure beside its graph's roles."""

    async def vector_index(self, repo: str) -> VectorIndex:
        """Where the graph's intents are compared (`of_type(INTENT)`)."""

    async def texts(self, node_ids: list[str]) -> dict[str, str]: ...

    async def tag_owners(self, repo: str, keys: list[str]) -> dict[str, str]: ...

    async def present(self, repo: str, node_ids: list[str]) -> set[str]: ...

    async def write_commit(self, plan: CommitPlan, also: Sequence[SideWrite]) -> None:
        """Writes the plan and the side writes in one transaction (then updates what the
        backend keeps beside its rows)."""

    async def write_side(self, also: Sequence[SideWrite]) -> None:
        """Writes side writes alone, in one transaction (the changeset was applied before)."""


@dataclass(frozen=True, slots=True)
class _Commit:
    """One commit's target, changeset, policy and side writes, and what it reads before the
    repo's lock: the facts its facts retire, the graph's nearest facts and instructions to each
    of its own, and the repo's newest commit then."""

    target: CommitTarget
    changeset: Changeset
    intents: IntentPolicy
    also: Sequence[SideWrite]
    retiring: list[contradiction.Retirement]
    nearest: dict[str, list[str]]
    seq: int


async def _before(
    target: CommitTarget, changeset: Changeset, intents: IntentPolicy, also: Sequence[SideWrite]
) -> _Commit:
    log = await target.commit_log(changeset.repo, limit=1)
    nearest: dict[str, list[tuple[str, float]]] = {}
    for kind in KNOWLEDGE:
        drafts = [n for n in changeset.nodes if n.type is kind]
        if drafts:
            found = await target.nearest_of_type(
                changeset.repo, np.stack([d.vector for d in drafts]), kind,
                max(NEAREST, intents.contradiction_candidates))
            nearest.update(zip([d.id for d in drafts], found, strict=True))
    # Facts a correction supersedes are retired unasked; the others are asked before the lock.
    retiring = [
        contradiction.Retirement(link.dst, link.src, None)
        for link in changeset.links if link.type is LinkType.SUPERSEDES
    ] + await contradiction.retirements(target, changeset, intents, nearest)
    return _Commit(target, changeset, intents, also, retiring,
                   {i: [j for j, _ in row] for i, row in nearest.items()}, log[0].seq if log else 0)


class _Undecided(Exception):
    """A merge that was not decided before the lock was taken."""


# How often one commit embeds its changeset again for a repo re-embedded meanwhile.
RESTAMPS = 3


async def apply(
    target: CommitTarget,
    changeset: Changeset,
    *,
    intents: IntentPolicy,
    also: Sequence[SideWrite] = (),
) -> CommitReceipt:
    """Adds the changeset's nodes and links (deduplicated), durably, once; a changeset of an
    older generation of the repo's vectors is embedded again first (`IntentPolicy.restamp`).
    On any error nothing was written: StorageError, ValueError (a vector of another
    dimension), SourceTaken (the source was recorded by another writer), EmbeddingError (no
    new embedding for the new generation)."""
    for _ in range(RESTAMPS):
        if changeset.nodes:
            seen = (await target.vector_index(changeset.repo)).generation
            if seen != changeset.generation:
                try:
                    changeset = await _restamp(changeset, intents, seen)
                except EmbeddingError:
                    # Applied before (a commit tried again): the receipt needs no vectors.
                    if await target.receipt(changeset.id) is None:
                        raise
        try:
            return await _apply(target, changeset, intents=intents, also=also)
        except VectorsMoved as moved:  # seen under the lock
            changeset = await _restamp(changeset, intents, moved.generation)
    raise EmbeddingError(
        f"repo {changeset.repo!r} was re-embedded {RESTAMPS} times while one commit waited")


async def _restamp(changeset: Changeset, intents: IntentPolicy, generation: int) -> Changeset:
    if intents.restamp is None:
        raise EmbeddingError(
            f"changeset {changeset.id} was embedded for generation {changeset.generation} of "
            f"repo {changeset.repo!r}'s vectors, which are of generation {generation} now")
    return await intents.restamp(changeset, generation)


async def _apply(
    target: CommitTarget,
    changeset: Changeset,
    *,
    intents: IntentPolicy,
    also: Sequence[SideWrite],
) -> CommitReceipt:
    decided: dict[tuple[str, str], tuple[str, Vector] | None] = {}
    _check_dim(target.dim(changeset.repo), [(n.id, n.vector) for n in changeset.nodes])
    commit = await _before(target, changeset, intents, also)
    for attempt in range(MERGE_ROUNDS + 1):
        last = attempt == MERGE_ROUNDS
        prepared = None
        if not last and (attempt or any(n.type is NodeType.INTENT for n in changeset.nodes)):
            prepared = await _decide_merges(commit, decided, knowledge=attempt > 0)
        try:
            async with target.lock(changeset.repo):
                return await _apply_locked(commit, _decided_merge(decided, final=last), prepared)
        except _Undecided:
            continue
    raise AssertionError("the last round never raises _Undecided")


async def _decide_merges(
    commit: _Commit, decided: dict[tuple[str, str], tuple[str, Vector] | None], *, knowledge: bool
) -> tuple[Snapshot, Resolution]:
    """Runs the intent resolution (and the facts', when `knowledge`) without the lock,
    asking the LLM each pass's merges at once. Returns it with the vectors it was made
    against: if they are unchanged under the lock, it stands."""
    index = await commit.target.vector_index(commit.changeset.repo)
    seen = index.snapshot()
    asked: list[tuple[str, str]] = []

    async def note(existing: str, new: str) -> tuple[str, Vector] | None:
        if (existing, new) not in decided:
            asked.append((existing, new))
        return decided.get((existing, new))

    for _ in range(MERGE_ROUNDS):
        asked.clear()
        resolution = await _resolve_intents(commit, index, note)
        if knowledge:
            await _resolve_knowledge(commit, note, Resolution())
        if not asked:
            return seen, resolution
        pairs = list(dict.fromkeys(asked))
        decided.update(zip(pairs, await commit.intents.merge(pairs), strict=True))
    return seen, await _resolve_intents(commit, index, _decided_merge(decided, final=True))


def _decided_merge(
    decided: dict[tuple[str, str], tuple[str, Vector] | None], *, final: bool
) -> IntentMerger:
    """Looks up merges decided before the lock; `_Undecided` for another, unless `final` (None)."""

    async def merge(existing: str, new: str) -> tuple[str, Vector] | None:
        if (existing, new) not in decided and not final:
            raise _Undecided
        return decided.get((existing, new))

    return merge


async def _resolve_intents(commit: _Commit, index: VectorIndex, merge: IntentMerger) -> Resolution:
    intents, target, changeset = commit.intents, commit.target, commit.changeset

    async def in_scope(node_ids: list[str]) -> dict[str, str]:
        return {n.id: n.text for n in await target.get_nodes(changeset.repo, node_ids)
                if same(n.metadata, changeset.metadata)}

    return await resolve_intents(changeset.nodes, index, in_scope, target.texts, merge,
                                 identity_threshold=intents.identity_threshold,
                                 merge_threshold=intents.merge_threshold)


def _check_dim(dim: int, vectors: list[tuple[str, Vector]]) -> None:
    """A committed row of the wrong size would break every later load of the repo's vectors."""
    for node_id, vector in vectors:
        if np.shape(vector) != (dim,):
            raise ValueError(
                f"node {node_id}: vector of shape {np.shape(vector)}, expected ({dim},)")


async def _resolve_knowledge(commit: _Commit, merge: IntentMerger, out: Resolution
                             ) -> dict[str, Node]:
    """Resolves the changeset's facts and instructions against the graph's live nearest
    ones of their type (not paired by a retirement, not of another scope) and each other.
    Returns the graph nodes compared with."""
    if not commit.nearest:
        return {}
    target, changeset, intents = commit.target, commit.changeset, commit.intents
    later = await target.commit_log(changeset.repo, after_seq=commit.seq)
    ids = {i for row in commit.nearest.values() for i in row}
    ids.update(i for record in later for i in record.node_ids)
    seen: dict[str, Node] = {n.id: n for n in await target.get_nodes(changeset.repo, sorted(ids))
                             if n.type in KNOWLEDGE and not n.retired}
    vectors = await target.vectors(changeset.repo, sorted(seen))
    apart = {(r.retired, r.successor) for r in commit.retiring}
    apart |= {(b, a) for a, b in apart}
    for kind in KNOWLEDGE:
        drafts = [n for n in changeset.nodes if n.type is kind]
        graph = [i for i, n in seen.items() if n.type is kind and i in vectors]
        if not drafts:
            continue
        sims = (unit(np.stack([d.vector for d in drafts])) @ np.stack([vectors[i] for i in graph]).T
                if graph else np.zeros((len(drafts), 0)))
        nearest = [
            sorted(((i, float(sim)) for i, sim in zip(graph, row, strict=True)
                    if i != d.id and (d.id, i) not in apart
                    and same(seen[i].metadata, changeset.metadata)),
                   key=lambda o: -o[1])[:NEAREST]
            for d, row in zip(drafts, sims, strict=True)]
        await resolve(drafts, nearest, {i: n.text for i, n in seen.items()}, target.texts,
                      merge, identity_threshold=intents.identity_threshold,
                      merge_threshold=intents.merge_threshold, out=out, knowledge=True)
    return seen


async def _apply_locked(
    commit: _Commit, merge: IntentMerger, prepared: tuple[Snapshot, Resolution] | None
) -> CommitReceipt:
    target, changeset, also = commit.target, commit.changeset, commit.also
    repo = changeset.repo
    done = await target.receipt(changeset.id)
    if done is not None:
        if also:
            await target.write_side(also)
        return done
    # A source this commit forgets first (its record giving way) is free for it.
    freed = {write.source_id for write in also if isinstance(write, SourceForgotten)}
    for write in also:
        # Under the lock every commit of the repo takes: two ingests of one source cannot pass.
        if (isinstance(write, SourceRecorded) and write.source_id not in freed
                and await target.ingested(repo, write.source_id)):
            raise SourceTaken(write.source_id)
    index = await target.vector_index(repo)
    if changeset.nodes and index.generation != changeset.generation:
        raise VectorsMoved(index.generation)
    if prepared is not None and index.snapshot() is prepared[0]:
        resolution = Resolution(dict(prepared[1].remap), dict(prepared[1].rewordings))
    else:
        resolution = await _resolve_intents(commit, index, merge)
    graph_nodes = await _resolve_knowledge(commit, merge, resolution)
    drafts = _scoped_tags(changeset)
    tag_keys = [n.key for n in drafts if n.type is NodeType.TAG and n.key]
    resolve_tags(drafts, await target.tag_owners(repo, tag_keys), resolution)
    present = await target.present(repo, [n.id for n in changeset.nodes])
    drafts = [n for n in drafts if n.id not in resolution.remap and n.id not in present]
    nodes = [(n, *resolution.rewordings.get(n.id, (n.text, n.vector))) for n in drafts]
    new_ids = {n.id for n in drafts}
    rewordings = {node_id: value for node_id, value in resolution.rewordings.items()
                  if node_id not in new_ids}
    _check_dim(target.dim(repo), [(i, v) for i, (_, v) in resolution.rewordings.items()])
    joined: dict[str, Contribution] = {}
    for draft in changeset.nodes:
        if draft.type in KNOWLEDGE and resolution.survivor(draft.id) in graph_nodes:
            joined.setdefault(resolution.survivor(draft.id),
                              Contribution(draft.text, draft.data, draft.source_id))
    # A new fact that joined one of the graph's retires through it what it contradicts.
    retired = await contradiction.still_live(target, repo, [
        replace(r, successor=resolution.survivor(r.successor)) for r in commit.retiring
    ], new_ids | set(joined))
    plan = CommitPlan(
        repo=repo,
        changeset_id=changeset.id,
        nodes=nodes,
        rewordings=rewordings,
        links=remap_links(
            [link for link in changeset.links if link.type is not LinkType.SUPERSEDES],
            resolution,
        ) + [
            Link(r.successor, r.retired, LinkType.SUPERSEDES) for r in retired
        ],
        receipt=CommitReceipt(changeset.id, repo, [NodeId(n.id) for n, _, _ in nodes],
                              list(changeset.missing)),
        created_at=now_utc().isoformat(),
        session_id=next((w.session_id for w in also if isinstance(w, StepsCommitted)), None),
        source_id=next((w.source_id for w in also if isinstance(w, SourceRecorded)), None),
        retired=tuple(
            (r.retired, None if r.valid_to is None else r.valid_to.isoformat()) for r in retired
        ),
        joined=joined,
        metadata=dict(changeset.metadata),
    )
    await target.write_commit(plan, also)
    return plan.receipt


def _scoped_tags(changeset: Changeset) -> list[NodeDraft]:
    """The changeset's drafts, a tag's key made its scope's (tags are shared within a scope)."""
    fingerprint = canonical(changeset.metadata)
    if fingerprint is None:
        return changeset.nodes
    # A digest: a key must fit an index entry, and a metadata may be several KB.
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:32]
    return [replace(n, key=f"{n.key}\x1f{digest}") if n.type is NodeType.TAG and n.key
            else n for n in changeset.nodes]
