"""What the web app reads, and with `writes` changes: `MemorySource`, over `Memory`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mnemo.errors import InvalidInputError
from mnemo.graph.history import CommitDiff
from mnemo.graph.model import LinkType, Node, NodeType
from mnemo.memory import Memory
from mnemo.recall.engine import RecallResult


@dataclass(frozen=True, slots=True)
class LinkedNode:
    """A node one link away from another, and the type of that link."""

    link_type: LinkType
    node: Node


class MemorySource:
    """The web app's reads over an open `Memory` (`memory`, opened for inspection: none of its
    reads starts or resumes work); without `writes`, a recall never counts accesses and
    `revert` raises InvalidInputError."""

    def __init__(self, memory: Memory, *, writes: bool = False) -> None:
        self.memory = memory
        self._writes = writes

    async def links(self, repo: str, node_id: str) -> list[LinkedNode]:
        return [LinkedNode(link_type, node) for link_type in LinkType
                for node in await self.memory.get_linked_nodes(repo, [node_id], link_type)]

    async def recall(self, repo: str, query: str, k: int, types: Sequence[NodeType] | None, *,
                     reinforce: bool = False,
                     where: Mapping[str, object] | None = None) -> RecallResult:
        return await self.memory.recall(
            repo, query, k=k, types=types, reinforce=reinforce and self._writes, where=where)

    async def commit_diff(self, repo: str, commit_id: str) -> CommitDiff:
        return await self.memory.commit_diff(repo, commit_id)

    async def revert(self, repo: str, commit_id: str) -> CommitDiff:
        if not self._writes:
            raise InvalidInputError("this view of the memory is read-only: no revert")
        return await self.memory.revert(repo, commit_id)
