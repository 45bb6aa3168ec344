"""What the web app reads: `MemorySource`, through `Memory`'s public methods only, none of
which starts or resumes work; the two that write do so only with `writes=True`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mnemo.conversation.model import Message, ThreadInfo, Viewport
from mnemo.episode import EpisodeLog
from mnemo.errors import InvalidInputError
from mnemo.graph.history import CommitDiff, CommitRecord
from mnemo.graph.model import LinkType, Node, NodeType
from mnemo.memory import Memory
from mnemo.recall.engine import RecallResult
from mnemo.session.machine import SessionInfo


@dataclass(frozen=True, slots=True)
class LinkedNode:
    """A node one link away from another, and the type of that link."""

    link_type: LinkType
    node: Node


class MemorySource:
    """The web app's reads over an open `Memory`; without `writes`, a recall never counts
    accesses and `revert` raises InvalidInputError."""

    def __init__(self, memory: Memory, *, writes: bool = False) -> None:
        self._memory = memory
        self._writes = writes

    async def repos(self) -> list[str]:
        return await self._memory.list_repos()

    async def latest(self, repo: str, types: Sequence[NodeType], limit: int) -> list[Node]:
        return await self._memory.latest(repo, types=types, top_k=limit)

    async def nodes_of_type(self, repo: str, node_type: NodeType) -> list[Node]:
        return await self._memory.get_nodes_by_type(repo, [node_type])

    async def search_nodes(self, repo: str, query: str, limit: int,
                           where: Mapping[str, object] | None = None) -> list[Node]:
        return await self._memory.search_nodes(repo, query, limit=limit, where=where)

    async def node(self, repo: str, node_id: str) -> Node | None:
        return await self._memory.get_node(repo, node_id)

    async def links(self, repo: str, node_id: str) -> list[LinkedNode]:
        found: list[LinkedNode] = []
        for link_type in LinkType:
            for node in await self._memory.get_linked_nodes(repo, [node_id], link_type):
                found.append(LinkedNode(link_type, node))
        return found

    async def episode(self, episode_id: str) -> EpisodeLog | None:
        return await self._memory.episode(episode_id)

    async def sessions(self) -> list[SessionInfo]:
        return await self._memory.list_sessions()

    async def episodes(self, session_id: str) -> list[EpisodeLog]:
        return await self._memory.episodes(session_id)

    async def threads(self) -> list[ThreadInfo]:
        return await self._memory.list_threads()

    async def messages(self, thread_id: str) -> list[Message]:
        return await self._memory.conversation().raw(thread_id)

    async def viewport(self, thread_id: str, token_budget: int) -> Viewport:
        return await self._memory.viewport(thread_id, token_budget=token_budget)

    async def recall(self, repo: str, query: str, k: int, types: Sequence[NodeType] | None, *,
                     reinforce: bool = False,
                     where: Mapping[str, object] | None = None) -> RecallResult:
        return await self._memory.recall(
            repo, query, k=k, types=types, reinforce=reinforce and self._writes, where=where)

    async def history(self, repo: str, limit: int) -> list[CommitRecord]:
        return await self._memory.history(repo, limit=limit)

    async def commit_diff(self, repo: str, commit_id: str) -> CommitDiff:
        return await self._memory.commit_diff(repo, commit_id)

    async def revert(self, repo: str, commit_id: str) -> CommitDiff:
        if not self._writes:
            raise InvalidInputError("this view of the memory is read-only: no revert")
        return await self._memory.revert(repo, commit_id)

