"""How a changeset becomes part of a repo's graph, whatever the backend.

`apply` is the one commit procedure: the backend (`CommitTarget`) gives it reads and one
write, and it decides what the changeset adds. Tags are deduplicated by key against the batch
and the graph, intents by raw cosine (`graph.dedup`); nodes already there are skipped; links
are re-pointed to survivors. The write is one transaction, recorded with the receipt, so
applying the same changeset twice returns the first receipt and adds nothing.

Intent merges ask the LLM, all of a commit's at once: they are decided before the repo's lock
is taken, and under it only looked up. A merge the graph made necessary
meanwhile (another commit added a close intent) is decided after letting the lock go, and the
commit tries again (one slow provider stalled every commit to the repo).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from mnemo.errors import EmbeddingError
from mnemo.graph import contradiction
from mnemo.graph.dedup import (
    IntentMerger,
    Resolution,
    TextLookup,
    remap_links,
    resolve_intents,
    resolve_tags,
)
from mnemo.graph.model import (
    Changeset,
    CommitReceipt,
    Link,
    LinkType,
    NodeDraft,
    NodeId,
    NodeType,
    Vector,
    now_utc,
)
from mnemo.graph.ports import (
    IntentPolicy,
    SideWrite,
    SourceRecorded,
    SourceTaken,
    StepsCommitted,
)
from mnemo.graph.scope import Metadata, canonical
from mnemo.graph.vectors import Snapshot, VectorIndex

# How often a commit lets the lock go to ask the LLM for merges the graph newly needs.
MERGE_ROUNDS = 2


@dataclass(frozen=True, slots=True)
class CommitPlan:
    """What one commit writes, in one transaction: new nodes (draft, final text, final vector),
    existing intents reworded by a merge, links, and the receipt."""

    repo: str
    changeset_id: str
    nodes: list[tuple[NodeDraft, str, Vector]]
    rewordings: dict[str, tuple[str, Vector]]
    links: list[Link]
    receipt: CommitReceipt
    created_at: str
    # Where the changeset came from, for its commit record.
    session_id: str | None = None
    source_id: str | None = None
    # Facts the changeset's facts contradict: (id, valid_to as ISO text, None for
    # the commit's time); each gets valid_to and retired_at.
    retired: tuple[tuple[str, str | None], ...] = ()
    # The scope every new node carries (`Changeset.metadata`).
    metadata: Metadata = field(default_factory=dict)


class CommitTarget(contradiction.FactSearch, Protocol):
    """What a backend gives the commit procedure."""

    def lock(self, repo: str) -> AbstractAsyncContextManager[None]: ...

    def dim(self, repo: str) -> int: ...

    async def receipt(self, changeset_id: str) -> CommitReceipt | None: ...

    async def vector_index(self, repo: str) -> VectorIndex:
        """Where the graph's intents are compared (`of_type(INTENT)`)."""
        ...

    async def texts(self, node_ids: list[str]) -> dict[str, str]: ...

    async def tag_owners(self, repo: str, keys: list[str]) -> dict[str, str]: ...

    async def present(self, repo: str, node_ids: list[str]) -> set[str]: ...

    async def ingested(self, repo: str, source_id: str) -> tuple[str, list[NodeId]] | None: ...

    async def write_commit(self, plan: CommitPlan, also: Sequence[SideWrite]) -> None:
        """Writes the plan and the side writes in one transaction (and updates whatever the
        backend keeps beside its rows, e.g. an in-memory vector index, once it is durable)."""
        ...

    async def write_side(self, also: Sequence[SideWrite]) -> None:
        """Writes side writes alone, in one transaction (the changeset was applied before)."""
        ...


class _Undecided(Exception):
    """A merge that was not decided before the lock was taken."""


class _Restamped(Exception):
    """The repo's vectors are of another generation than the changeset's (it was re-embedded
    since the changeset was made), as seen under the lock."""

    def __init__(self, generation: int) -> None:
        super().__init__(f"the repo's vectors are of generation {generation}")
        self.generation = generation


# How often one commit embeds its changeset again for a repo re-embedded meanwhile.
RESTAMPS = 3


async def apply(
    target: CommitTarget,
    changeset: Changeset,
    *,
    intents: IntentPolicy,
    also: Sequence[SideWrite] = (),
) -> CommitReceipt:
    """Adds the changeset's nodes and links (deduplicated), durably, once. A changeset made
    for another generation of the repo's vectors than the store's (`Changeset.generation`:
    the repo was re-embedded since) is embedded again first (`IntentPolicy.restamp`): its
    vectors never meet the repo's of another embedder.

    Raises:
        StorageError: the transaction failed; nothing of it was written.
        ValueError: a vector is not of the repo's dimension; nothing was written.
        SourceTaken: a `SourceRecorded` in `also` names a source another writer recorded
            since the caller looked; nothing was written.
        EmbeddingError: the changeset is of another generation and could not be embedded
            again (no `restamp`, or it failed); nothing was written.
    """
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
        except _Restamped as moved:
            changeset = await _restamp(changeset, intents, moved.generation)
    raise EmbeddingError(
        f"repo {changeset.repo!r} was re-embedded {RESTAMPS} times while one commit waited"
    )


async def _restamp(changeset: Changeset, intents: IntentPolicy, generation: int) -> Changeset:
    if intents.restamp is None:
        raise EmbeddingError(
            f"changeset {changeset.id} was embedded for generation {changeset.generation} of "
            f"repo {changeset.repo!r}'s vectors, which are of generation {generation} now"
        )
    return await intents.restamp(changeset, generation)


async def _apply(
    target: CommitTarget,
    changeset: Changeset,
    *,
    intents: IntentPolicy,
    also: Sequence[SideWrite],
) -> CommitReceipt:
    decided: dict[tuple[str, str], tuple[str, Vector] | None] = {}
    # The facts the changeset says its own facts supersede (a correction) are retired as
    # contradicted ones are, unasked; the others are asked before the lock, as merges are:
    # one slow provider must not stall the repo's commits.
    retiring = [
        contradiction.Retirement(link.dst, link.src, None)
        for link in changeset.links if link.type is LinkType.SUPERSEDES
    ] + (
        await contradiction.retirements(
            target, changeset, intents.contradicts, intents.contradiction_candidates,
            intents.contradiction_similarity,
        )
        if intents.contradicts is not None and intents.contradiction_candidates > 0 else []
    )
    for attempt in range(MERGE_ROUNDS + 1):
        last = attempt == MERGE_ROUNDS
        prepared = None
        if not last and any(n.type is NodeType.INTENT for n in changeset.nodes):
            prepared = await _decide_merges(target, changeset, intents, decided)
        try:
            async with target.lock(changeset.repo):
                return await _apply_locked(
                    target, changeset, _decided_merge(decided, final=last), intents, also,
                    prepared=prepared, retiring=retiring,
                )
        except _Undecided:
            continue
    raise AssertionError("the last round never raises _Undecided")


async def _decide_merges(
    target: CommitTarget,
    changeset: Changeset,
    intents: IntentPolicy,
    decided: dict[tuple[str, str], tuple[str, Vector] | None],
) -> tuple[Snapshot, Resolution]:
    """Runs the intent resolution against the graph as it is now, without the lock, and
    records what the merges it needs answered: all of one pass asked of the LLM at once (a
    merge's new wording may call for another, asked in a second pass). Returns the resolution
    with the vectors it was made against: if they are the same ones under the lock (no commit
    came between), the resolution stands and is not computed again."""
    index = await target.vector_index(changeset.repo)
    seen = index.snapshot()
    asked: list[tuple[str, str]] = []

    async def note(existing: str, new: str) -> tuple[str, Vector] | None:
        if (existing, new) not in decided:
            asked.append((existing, new))
        return decided.get((existing, new))

    for _ in range(MERGE_ROUNDS):
        asked.clear()
        resolution = await _resolve_intents(target, changeset, index, note, intents)
        if not asked:
            return seen, resolution
        pairs = list(dict.fromkeys(asked))
        decided.update(zip(pairs, await intents.merge(pairs), strict=True))
    lookup = _decided_merge(decided, final=True)
    return seen, await _resolve_intents(target, changeset, index, lookup, intents)


def _decided_merge(
    decided: dict[tuple[str, str], tuple[str, Vector] | None], *, final: bool
) -> IntentMerger:
    """A merger that only looks up merges decided before the lock. An undecided one makes the
    commit try again, or in the `final` round keeps the existing wording, as when a merge
    fails."""

    async def merge(existing: str, new: str) -> tuple[str, Vector] | None:
        if (existing, new) not in decided and not final:
            raise _Undecided
        return decided.get((existing, new))

    return merge


def _texts(target: CommitTarget) -> TextLookup:
    return target.texts


async def _resolve_intents(
    target: CommitTarget,
    changeset: Changeset,
    index: VectorIndex,
    merge: IntentMerger,
    intents: IntentPolicy,
) -> Resolution:
    resolution = Resolution()
    await resolve_intents(
        changeset.nodes,
        index,
        _texts(target),
        merge,
        identity_threshold=intents.identity_threshold,
        merge_threshold=intents.merge_threshold,
        out=resolution,
    )
    return resolution


async def _apply_locked(
    target: CommitTarget,
    changeset: Changeset,
    merge: IntentMerger,
    intents: IntentPolicy,
    also: Sequence[SideWrite],
    *,
    prepared: tuple[Snapshot, Resolution] | None = None,
    retiring: list[contradiction.Retirement] | None = None,
) -> CommitReceipt:
    repo = changeset.repo
    done = await target.receipt(changeset.id)
    if done is not None:
        if also:
            await target.write_side(also)
        return done
    for write in also:
        # Read under the lock that every commit of the repo takes, in every process: two
        # ingests of one source cannot both pass it.
        if isinstance(write, SourceRecorded) and await target.ingested(repo, write.source_id):
            raise SourceTaken(write.source_id)
    index = await target.vector_index(repo)
    if changeset.nodes and index.generation != changeset.generation:
        raise _Restamped(index.generation)
    if prepared is not None and index.snapshot() is prepared[0]:
        # The intents were resolved against exactly these vectors, before the lock.
        resolution = Resolution(dict(prepared[1].remap), dict(prepared[1].rewordings))
    else:
        resolution = await _resolve_intents(target, changeset, index, merge, intents)
    drafts = _scoped_tags(changeset)
    tag_keys = [n.key for n in drafts if n.type is NodeType.TAG and n.key]
    resolve_tags(drafts, await target.tag_owners(repo, tag_keys), resolution)
    present = await target.present(repo, [n.id for n in changeset.nodes])
    drafts = [n for n in drafts if n.id not in resolution.remap and n.id not in present]
    nodes = [(n, *resolution.rewordings.get(n.id, (n.text, n.vector))) for n in drafts]
    new_ids = {n.id for n in drafts}
    rewordings = {
        node_id: value
        for node_id, value in resolution.rewordings.items()
        if node_id not in new_ids
    }
    # Checked before writing: a committed row of the wrong size would make every later load
    # of this repo's vectors fail.
    dim = target.dim(repo)
    for node_id, vector in [(n.id, v) for n, _, v in nodes] + [
        (node_id, v) for node_id, (_, v) in rewordings.items()
    ]:
        if np.shape(vector) != (dim,):
            raise ValueError(
                f"node {node_id}: vector of shape {np.shape(vector)}, expected ({dim},)"
            )
    retired = await contradiction.still_live(target, repo, retiring or [], new_ids)
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
        metadata=dict(changeset.metadata),
    )
    await target.write_commit(plan, also)
    return plan.receipt


def _scoped_tags(changeset: Changeset) -> list[NodeDraft]:
    """The changeset's drafts, a tag's key made its scope's: a tag is shared only by the
    nodes of one scope, so that a scope's routes and erasure never reach another's."""
    fingerprint = canonical(changeset.metadata)
    if fingerprint is None:
        return changeset.nodes
    # A digest: a key must fit an index entry, and a metadata may be several KB.
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:32]
    return [replace(n, key=f"{n.key}\x1f{digest}") if n.type is NodeType.TAG and n.key
            else n for n in changeset.nodes]
