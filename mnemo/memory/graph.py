"""`Memory`'s methods over the graph: nodes and links looked up, the commit history, and
maintenance (`Memory` inherits them; see `mnemo.memory.facade`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from mnemo.graph import history as commit_history
from mnemo.graph import maintenance
from mnemo.graph.history import CommitDiff, CommitRecord
from mnemo.graph.maintenance import ConsolidationReport, DecayReport, ValidationReport
from mnemo.graph.model import Link, LinkType, Node, NodeType
from mnemo.inputs import check_count
from mnemo.memory.parts import Parts


class GraphMethods(Parts):
    """`Memory`'s methods over a repo's graph, its history and its upkeep."""

    # ---- the graph ------------------------------------------------------------------------

    async def get_node(self, repo: str, node_id: str) -> Node | None:
        """The node, or None if the repo has no such node."""
        return await self._reads.get_node(repo, node_id)

    async def get_nodes_by_type(self, repo: str, types: Iterable[NodeType]) -> list[Node]:
        """Every node of these types, oldest first."""
        return await self._reads.get_nodes_by_type(repo, types)

    async def get_linked_nodes(
        self, repo: str, node_ids: Sequence[str], link_type: LinkType | None = None
    ) -> list[Node]:
        """The nodes linked to any of `node_ids` (either direction), not those themselves."""
        return await self._reads.get_linked_nodes(repo, node_ids, link_type)

    async def links(self, repo: str) -> list[Link]:
        """Every link of the repo (`src`, `dst`, `type`), by type, then source, then
        destination.

        Raises:
            NotFoundError: an unknown repo.
        """
        return await self._reads.links(repo)

    async def latest(
        self,
        repo: str,
        *,
        types: Iterable[NodeType] = (NodeType.SEMANTIC, NodeType.PROCEDURAL),
        top_k: int = 10,
    ) -> list[Node]:
        """The newest nodes of these types, newest first.

        Raises:
            InvalidInputError: a `top_k` below 1 or above the repo's `Config.max_results`, or
                an unknown node type.
            NotFoundError: an unknown repo.
        """
        return await self._reads.latest(repo, types, top_k)

    async def search_nodes(
        self,
        repo: str,
        query: str,
        *,
        limit: int = 20,
        types: Iterable[NodeType] | None = None,
    ) -> list[Node]:
        """Nodes whose text holds any word of `query` (full text, BM25), best first: a plain
        lookup, without recall's embedding, hops, value or reinforcement.

        Raises:
            InvalidInputError: a blank query, one longer than the repo's
                `Config.max_text_chars`, or a limit below 1 or above its
                `Config.max_results`.
            NotFoundError: an unknown repo.
        """
        return await self._reads.search_nodes(repo, query, limit, types)

    async def delete_nodes(self, repo: str, node_ids: Sequence[str]) -> int:
        """Deletes nodes with their links, vectors and search entries; returns how many."""
        return await self._reads.delete_nodes(repo, node_ids)

    # ---- history --------------------------------------------------------------------------

    async def history(self, repo: str, *, limit: int = 20) -> list[CommitRecord]:
        """The repo's `limit` newest commits (every applied changeset: a session's commit, an
        ingest), newest first: id, time, session or source, and the ids of what each added,
        retired and reworded (no text).

        Raises:
            InvalidInputError: a limit below 1 or above the repo's `Config.max_results`.
            NotFoundError: an unknown repo.
        """
        runtime = await self._repos.known(repo)
        check_count("limit", limit, minimum=1, maximum=runtime.config.max_results,
                    setting="Config.max_results")
        return await commit_history.history(self._graph, repo, limit)

    async def commit_diff(self, repo: str, commit_id: str) -> CommitDiff:
        """What one commit changed: the nodes it added and the facts it retired (those still
        in the graph), and the links it added.

        Raises:
            InvalidInputError: no such commit in the repo.
            NotFoundError: an unknown repo.
        """
        await self._repos.known(repo)
        return await commit_history.diff(self._graph, repo, commit_id)

    async def revert(self, repo: str, commit_id: str) -> CommitDiff:
        """Undoes one commit in one transaction: the nodes and links it added go, the facts it
        retired hold again, and it leaves the history (an ingested source's id is free
        again). Returns what was undone.

        Raises:
            InvalidInputError: no such commit in the repo.
            ConflictError: a later change built on it (linked to, merged into, retired or
                reworded one of its nodes): revert that first.
            NotFoundError: an unknown repo.
        """
        await self._repos.known(repo)
        return await commit_history.revert(self._graph, repo, commit_id)

    # ---- maintenance ----------------------------------------------------------------------

    async def consolidate(self, repo: str, *, full: bool = False) -> ConsolidationReport:
        """Merges SEMANTIC near-duplicates (raw cosine >= `Config.consolidate_threshold`) into
        the most confident (then oldest) of them, keeping every link and the merged metadata,
        then deletes tags left with no links. Only nodes not compared before are compared,
        unless `full`. Safe while sessions commit: it holds the repo's write lock.

        Raises:
            NotFoundError: an unknown repo.
        """
        runtime = await self._repos.known(repo)
        return await maintenance.consolidate(self._graph, repo, runtime.config, full=full)

    async def decay(self, repo: str, *, now: datetime | None = None) -> DecayReport:
        """Deletes the memories whose value (recency decay x frequency floor x reward) at `now`
        is below `Config.decay_threshold`, then the routing and source nodes left with no
        links. Safe while sessions commit: it holds the repo's write lock.

        Raises:
            NotFoundError: an unknown repo.
        """
        runtime = await self._repos.known(repo)
        return await maintenance.decay(self._graph, repo, runtime.config, now=now)

    async def validate_episodic(self, repo: str) -> ValidationReport:
        """Checks episodic integrity (every step linked to its subgoal and source, no dangling
        links, a vector of the right size per node, the full-text index in step) and repairs
        what it can: missing step links, dangling links, the full-text index.

        Raises:
            NotFoundError: an unknown repo.
        """
        await self._repos.known(repo)
        return await maintenance.validate_episodic(self._graph, repo)
