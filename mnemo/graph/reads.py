"""`GraphReads`: what `Memory` reads (and deletes) of a repo's graph by id, type, link or
text, without recall's embedding, hops, value or reinforcement."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence

from mnemo.errors import InvalidInputError
from mnemo.graph.model import Link, LinkType, Node, NodeType
from mnemo.graph.ports import GraphStore
from mnemo.inputs import check_count, check_id, check_text

RESULTS = "Config.max_results"


class GraphReads:
    """The graph lookups of `Memory`; each first checks the repo through `known` (which
    raises NotFoundError for an unknown repo)."""

    def __init__(
        self,
        graph: GraphStore,
        *,
        known: Callable[[str], Awaitable[object]],
        max_chars: Callable[[str], int],
        max_results: Callable[[str], int],
    ) -> None:
        self._graph = graph
        self._known = known
        self._max_chars = max_chars
        self._max_results = max_results

    async def get_node(self, repo: str, node_id: str) -> Node | None:
        await self._known(repo)
        nodes = await self._graph.get_nodes(repo, [check_id(node_id, "node_id")])
        return nodes[0] if nodes else None

    async def get_nodes_by_type(self, repo: str, types: Iterable[NodeType]) -> list[Node]:
        await self._known(repo)
        return await self._graph.get_nodes_by_type(repo, node_types(types))

    async def get_linked_nodes(
        self, repo: str, node_ids: Sequence[str], link_type: LinkType | None
    ) -> list[Node]:
        await self._known(repo)
        ids = self._node_ids(repo, node_ids)
        neighbors = await self._graph.neighbors(repo, ids, _link_type(link_type))
        asked = set(ids)
        linked = [n.node_id for n in neighbors if n.node_id not in asked]
        return await self._graph.get_nodes(repo, linked)

    async def links(self, repo: str) -> list[Link]:
        await self._known(repo)
        return await self._graph.links(repo)

    async def latest(self, repo: str, types: Iterable[NodeType], top_k: int) -> list[Node]:
        await self._known(repo)
        check_count("top_k", top_k, minimum=1, maximum=self._max_results(repo), setting=RESULTS)
        return await self._graph.latest(repo, node_types(types), top_k)

    async def search_nodes(
        self, repo: str, query: str, limit: int, types: Iterable[NodeType] | None
    ) -> list[Node]:
        await self._known(repo)
        check_text(query, "query", limit=self._max_chars(repo), stored=False)
        check_count("limit", limit, minimum=1, maximum=self._max_results(repo), setting=RESULTS)
        kinds = None if types is None else node_types(types)
        found = await self._graph.search_text(repo, query, limit, kinds)
        return await self._graph.get_nodes(repo, [node_id for node_id, _ in found])

    async def delete_nodes(self, repo: str, node_ids: Sequence[str]) -> int:
        await self._known(repo)
        return await self._graph.delete_nodes(repo, self._node_ids(repo, node_ids))

    def _node_ids(self, repo: str, node_ids: str | Sequence[str]) -> list[str]:
        """`node_ids` as a list (a lone string is one id), at most `Config.max_results` of
        them, each checked (`inputs.check_id`).

        Raises:
            InvalidInputError: not a string nor a list of them, too many, or a bad id.
        """
        if isinstance(node_ids, str):
            return [check_id(node_ids, "node id")]
        if not isinstance(node_ids, Iterable):
            raise InvalidInputError(
                f"node_ids must be a list of node ids, got {type(node_ids).__name__}"
            )
        ids = list(node_ids)
        most = self._max_results(repo)
        if len(ids) > most:
            raise InvalidInputError(
                f"node_ids holds {len(ids):,} ids, more than the {most:,} one call takes "
                f"({RESULTS})"
            )
        return [check_id(node_id, "node id") for node_id in ids]


def node_types(types: Iterable[NodeType]) -> list[NodeType]:
    """`types` as a list of `NodeType`; a lone string is one type, not its letters.

    Raises:
        InvalidInputError: not an iterable of node types (or of their values).
    """
    try:
        if isinstance(types, str):
            return [NodeType(types)]
        return [NodeType(t) for t in types]
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"types must be node types ({', '.join(t.value for t in NodeType)}): {exc}"
        ) from exc


def _link_type(link_type: LinkType | str | None) -> LinkType | None:
    """`link_type` as a `LinkType` (or None for every type).

    Raises:
        InvalidInputError: not a link type (nor one's value).
    """
    try:
        return None if link_type is None else LinkType(link_type)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"link_type must be a link type ({', '.join(t.value for t in LinkType)}): {exc}"
        ) from exc
