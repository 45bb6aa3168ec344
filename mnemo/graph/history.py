"""A repo's commits as a history: list them, see what one changed, undo one. Each commit's
`CommitRecord` holds ids only (never text), so erasing a node erases it from history too.
`revert` withdraws one commit's work as a forget does (`mnemo.graph.erasure`) and records the
revert; it refuses (`ConflictError`, naming the commit to revert first) when a later commit
retired one of its facts or linked to a node only it held.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING

from mnemo.errors import ConflictError, InvalidInputError, check_count, check_id
from mnemo.graph.erasure import Embed
from mnemo.graph.model import Link, LinkType, Node, NodeType
from mnemo.graph.ports import Reverting

if TYPE_CHECKING:
    from mnemo.graph.ports import GraphWrites

# The nodes a revert deletes when only its commit holds them (a later link to one is work
# built on it); the others stay while something links to them.
_HELD = (NodeType.EPISODIC, NodeType.SEMANTIC, NodeType.PROCEDURAL)


@dataclass(frozen=True, slots=True)
class CommitRecord:
    """One applied changeset of a repo, or the revert of one: its id, its place (`seq`), when,
    its session or source, and the ids of what it added, linked, retired, reworded and joined;
    `reverted_by` / `reverts` link a commit and its revert. A maintenance record names its
    operation (`maintenance`: "consolidate", "decay", "validate_episodic") and the nodes it
    deleted (`removed`)."""

    id: str
    repo: str
    seq: int
    committed_at: datetime
    session_id: str | None = None
    source_id: str | None = None
    node_ids: tuple[str, ...] = ()
    links: tuple[Link, ...] = ()
    retired: tuple[str, ...] = ()
    reworded: tuple[str, ...] = ()
    joined: tuple[str, ...] = ()
    reverted_by: str | None = None
    reverts: str | None = None
    maintenance: str | None = None
    removed: tuple[str, ...] = ()

    @property
    def node_count(self) -> int:
        return len(self.node_ids)

    @property
    def link_count(self) -> int:
        return len(self.links)

    @property
    def retired_count(self) -> int:
        return len(self.retired)

    @property
    def corrects(self) -> str | None:
        """The node a correction (`Memory.correct`: a commit of no session or source)
        superseded; None for any other commit."""
        if self.session_id or self.source_id or self.reverts or self.maintenance:
            return None
        return next((link.dst for link in self.links if link.type is LinkType.SUPERSEDES), None)


@dataclass(frozen=True, slots=True)
class CommitDiff:
    """What one commit changed: the nodes it added and the facts it retired still in the
    graph, and the links it made."""

    commit: CommitRecord
    nodes: list[Node] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    retired: list[Node] = field(default_factory=list)


async def history(graph: GraphWrites, repo: str, limit: int) -> list[CommitRecord]:
    """The repo's `limit` newest commits, newest first (InvalidInputError: a limit below 1)."""
    check_count("limit", limit, minimum=1)
    return await graph.commit_log(repo, limit=limit)


async def _record(graph: GraphWrites, repo: str, commit_id: str) -> CommitRecord:
    check_id(commit_id, "commit_id")
    record = await graph.commit_record(repo, commit_id)
    if record is None:
        raise InvalidInputError(f"repo {repo!r} has no commit {commit_id!r}")
    return record


async def diff(graph: GraphWrites, repo: str, commit_id: str) -> CommitDiff:
    """What the commit added and retired (InvalidInputError: a blank id or no such commit)."""
    record = await _record(graph, repo, commit_id)
    return CommitDiff(
        record,
        await graph.get_nodes(repo, record.node_ids),
        list(record.links),
        await graph.get_nodes(repo, record.retired),
    )


async def revert(
    graph: GraphWrites, repo: str, commit_id: str, *, embed: Embed, generation: int | None = None
) -> CommitDiff:
    """`Memory.revert`, with its errors; `embed` makes the vectors of shared nodes' new
    wordings (of `generation`). The diff returned holds the record naming the revert."""
    undone = await diff(graph, repo, commit_id)

    async def refused() -> None:
        record = await _record(graph, repo, commit_id)
        reason = (f"it is maintenance ({record.maintenance}): what it removed is gone"
                  if record.maintenance else
                  f"it is a revert of {record.reverts!r}" if record.reverts else
                  f"it was reverted by {record.reverted_by!r}" if record.reverted_by else
                  await _built_on(graph, record))
        if reason:
            raise ConflictError(
                f"commit {commit_id!r} of repo {repo!r} cannot be reverted: {reason}")

    await graph.withdraw(repo, commit_id, embed=embed, generation=generation,
                         reverting=Reverting(f"revert_{uuid.uuid4().hex}", refused))
    return replace(undone, commit=await _record(graph, repo, commit_id))


async def _built_on(graph: GraphWrites, record: CommitRecord) -> str | None:
    """The later commit that built on this one, with why, or None if it can be reverted: one
    that retired one of its facts, or linked to a node only it holds (unless a commit in
    between joined that node)."""
    later = [c for c in await graph.commit_log(record.repo, after_seq=record.seq)
             if not (c.reverted_by or c.reverts)]
    # The nodes it joined that no earlier commit still holds (their maker was reverted).
    sole = set(record.joined)
    if sole:
        sole -= {i for c in await graph.commit_log(record.repo)
                 if c.seq < record.seq and not (c.reverted_by or c.reverts)
                 for i in (*c.node_ids, *c.joined)}
    held = {n.id for n in await graph.get_nodes(record.repo, [*record.node_ids, *sole])
            if n.type in _HELD}

    def shared(node_id: str, by: CommitRecord) -> bool:
        return any(node_id in c.joined for c in later if c.seq <= by.seq)

    for other in reversed(later):
        retired = sorted(i for i in (held | set(record.joined)) & set(other.retired)
                         if not shared(i, other))
        if retired:
            return f"commit {other.id!r} retired its fact {retired[0]!r}; revert it first"
    # A link to one of its nodes that it did not make is built on it (none made: consolidate).
    made = {(k.src, k.dst, k.type) for k in record.links}
    links_of = {c.id: {(k.src, k.dst, k.type) for k in c.links} for c in later}
    for n in await graph.neighbors(record.repo, sorted(held)):
        # A neighbour stands for both directions; those the commit did not make are another's.
        ends = {(n.origin, n.node_id, n.link_type), (n.node_id, n.origin, n.link_type)}
        makers = [c for c in reversed(later) if (ends - made) & links_of[c.id]]
        by = next((c.id for c in makers if not shared(n.origin, c)), None)
        if by is not None:
            return f"commit {by!r} linked to its node {n.origin!r}; revert it first"
        if not makers and not ends & made and n.origin not in sole:
            return (f"its node {n.origin!r} has a {n.link_type.value} link to {n.node_id!r} "
                    "that a later change made (consolidate)")
    return None


async def goals(
    read: Callable[[str], Awaitable[Node | None]], records: Iterable[CommitRecord]
) -> dict[str, str]:
    """Each commit's goal, by commit id: the text of the SOURCE node it added, read with
    `read`; None for a commit without one (a correction) or whose source is erased."""
    found: dict[str, str] = {}
    for record in records:
        # A node's id starts with its type (`source_episode_...`, `source_ingest_...`).
        for node_id in record.node_ids:
            if node_id.startswith(f"{NodeType.SOURCE.value}_"):
                node = await read(node_id)
                if node is not None and node.type is NodeType.SOURCE:
                    found[record.id] = node.text
                    break
    return found
