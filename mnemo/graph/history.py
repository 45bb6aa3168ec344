"""A repo's commits as a history: list them, see what one changed, undo one.

Every changeset applied through `mnemo.graph.commit` leaves a `CommitRecord`, written in the
same transaction as its nodes: the ids of the nodes and links it added, of the facts it
retired and of the intents it reworded, never their text. Erasing a node (`forget`,
`delete_nodes`) so erases it from the history as well: a record only names it.

`revert` undoes one commit: the nodes and links it added go, the facts it retired hold again.
It refuses (`ConflictError`) when later work built on the commit: a node it added has a link
it did not add (a later commit linked to it, merged a node into it, or retired it), or a later
commit reworded one of its intents. The intents the commit itself reworded keep their merged
wording: the earlier wording is text, which a record does not keep.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from mnemo.errors import ConflictError, InvalidInputError
from mnemo.graph.model import Link, Node, NodeType
from mnemo.inputs import check_count, check_id

if TYPE_CHECKING:
    from mnemo.graph.ports import GraphStore


@dataclass(frozen=True, slots=True)
class CommitRecord:
    """One applied changeset of a repo: its id (the changeset's), its place in the repo's
    order (`seq`), when it was applied, the session or ingested source it came from, and the
    ids of what it added, retired and reworded."""

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

    @property
    def node_count(self) -> int:
        return len(self.node_ids)

    @property
    def link_count(self) -> int:
        return len(self.links)

    @property
    def retired_count(self) -> int:
        return len(self.retired)


@dataclass(frozen=True, slots=True)
class CommitDiff:
    """What one commit changed: the nodes it added and the facts it retired that are still in
    the graph (erased ones are left out), and the links it added."""

    commit: CommitRecord
    nodes: list[Node] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    retired: list[Node] = field(default_factory=list)


async def history(graph: GraphStore, repo: str, limit: int) -> list[CommitRecord]:
    """The repo's `limit` newest commits, newest first.

    Raises:
        InvalidInputError: a limit below 1.
    """
    check_count("limit", limit, minimum=1)
    return await graph.commit_log(repo, limit=limit)


async def _record(graph: GraphStore, repo: str, commit_id: str) -> CommitRecord:
    check_id(commit_id, "commit_id")
    record = await graph.commit_record(repo, commit_id)
    if record is None:
        raise InvalidInputError(f"repo {repo!r} has no commit {commit_id!r}")
    return record


async def diff(graph: GraphStore, repo: str, commit_id: str) -> CommitDiff:
    """What the commit added and retired.

    Raises:
        InvalidInputError: a blank id, or no such commit in the repo.
    """
    record = await _record(graph, repo, commit_id)
    return CommitDiff(
        record,
        await graph.get_nodes(repo, record.node_ids),
        list(record.links),
        await graph.get_nodes(repo, record.retired),
    )


async def revert(graph: GraphStore, repo: str, commit_id: str) -> CommitDiff:
    """Undoes the commit in one transaction: its nodes and links go, the facts it retired
    hold again, its record leaves the history (and an ingested source's id is free again).
    Returns what was undone.

    Raises:
        InvalidInputError: a blank id, or no such commit in the repo.
        ConflictError: later work built on the commit (see the module's docstring).
    """
    check_id(commit_id, "commit_id")
    async with graph.lock(repo):
        undone = await diff(graph, repo, commit_id)
        record = undone.commit
        reasons = await _built_on(graph, record)
        if reasons:
            raise ConflictError(
                f"commit {commit_id!r} of repo {repo!r} cannot be reverted: {reasons[0]}"
                + (f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else "")
            )
        await graph.undo_commit(record)
    return undone


async def _built_on(graph: GraphStore, record: CommitRecord) -> list[str]:
    """Why later work depends on the commit: nothing if it can be reverted."""
    own = set(record.node_ids)
    reasons = []
    later = await graph.commit_log(record.repo, after_seq=record.seq)
    for other in later:
        touched = sorted(own & {*other.reworded, *other.retired})
        if touched:
            reasons.append(f"commit {other.id!r} changed its node {touched[0]!r}")
    added = {(link.src, link.dst, link.type) for link in record.links}
    for neighbor in await graph.neighbors(record.repo, sorted(own)):
        ends = (neighbor.origin, neighbor.node_id, neighbor.link_type)
        if ends not in added and (ends[1], ends[0], ends[2]) not in added:
            reasons.append(
                f"its node {neighbor.origin!r} has a {neighbor.link_type.value} link to "
                f"{neighbor.node_id!r} that a later change made"
            )
    return reasons


async def goals(
    read: Callable[[str], Awaitable[Node | None]], records: Iterable[CommitRecord]
) -> dict[str, str]:
    """Each commit's goal, by commit id: the text of the SOURCE node it added (the goal of
    the session's episode it committed, or of an ingested trajectory), read with `read`.
    None for a commit that added no source (a correction) or whose source is erased."""
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
