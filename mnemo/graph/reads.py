"""`GraphReads`: what `Memory` reads (and deletes) of a repo's graph by id, type, link or
text, without recall's embedding, hops, value or reinforcement."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Protocol, TypeVar

from mnemo.config import Config
from mnemo.errors import InvalidInputError
from mnemo.graph.model import Link, LinkType, Node, NodeType
from mnemo.graph.ports import GraphStore
from mnemo.graph.scope import Where
from mnemo.inputs import check_count, check_id, check_text, names_id

RESULTS = "Config.max_results"
# The most node types one call takes (there are seven; a longer list repeats them).
MAX_TYPES = 100
# The most ids `node_ids` returns.
MAX_IDS = 100

T = TypeVar("T")


class Repos(Protocol):
    """The repos of a Memory (`memory.repos.Repos`)."""

    async def checked(self, name: str, check: Callable[[Config], T]) -> T:
        """Runs `check` on a call's input with the repo's bounds, before the store is read
        when this Memory knows the repo. Raises NotFoundError for an unknown repo."""
        ...


class GraphReads:
    """The graph lookups of `Memory`; each checks its input and the repo (`checked`) before
    it reads the store."""

    def __init__(self, graph: GraphStore, repos: Repos) -> None:
        self._graph = graph
        self._checked = repos.checked

    async def get_node(self, repo: str, node_id: str) -> Node | None:
        await self._checked(repo, lambda _: check_id(node_id, "node_id"))
        nodes = await self._graph.get_nodes(repo, [node_id])
        return nodes[0] if nodes else None

    async def get_nodes_by_type(self, repo: str, types: Iterable[NodeType]) -> list[Node]:
        kinds = await self._checked(repo, lambda _: node_types(types))
        return await self._graph.get_nodes_by_type(repo, kinds)

    async def node_ids(self, repo: str, prefix: str, limit: int) -> list[str]:
        def check(_: Config) -> None:
            check_id(prefix, "prefix")
            check_count("limit", limit, minimum=1, maximum=MAX_IDS)

        await self._checked(repo, check)
        head, colon, index = prefix.partition(":")
        # What the store returns holds `head` after an underscore (or at the start, given a
        # kind); `names_id` keeps those it names.
        start = _literal(head) if "_" in head else "%\\_" + _literal(head)
        like = f"{start}%{_literal(colon + index)}"
        found = await self._graph.node_ids(repo, like, "" if colon else "%:%", limit)
        return [node_id for node_id in found if names_id(prefix, node_id)]

    async def get_linked_nodes(
        self, repo: str, node_ids: Sequence[str], link_type: LinkType | None
    ) -> list[Node]:
        kind = _link_type(link_type)
        ids = await self._checked(repo, lambda config: node_id_list(node_ids, config))
        neighbors = await self._graph.neighbors(repo, ids, kind)
        asked = set(ids)
        linked = [n.node_id for n in neighbors if n.node_id not in asked]
        return await self._graph.get_nodes(repo, linked)

    async def links(self, repo: str) -> list[Link]:
        await self._checked(repo, lambda _: None)
        return await self._graph.links(repo)

    async def latest(
        self, repo: str, types: Iterable[NodeType | str], top_k: int
    ) -> list[Node]:
        def check(config: Config) -> list[NodeType]:
            check_count("top_k", top_k, minimum=1, maximum=config.max_results, setting=RESULTS)
            return node_types(types)

        return await self._graph.latest(repo, await self._checked(repo, check), top_k)

    async def search_nodes(
        self, repo: str, query: str, limit: int, types: Iterable[NodeType] | None,
        where: Where | None = None,
    ) -> list[Node]:
        def check(config: Config) -> list[NodeType] | None:
            check_text(query, "query", limit=config.max_text_chars, stored=False)
            check_count("limit", limit, minimum=1, maximum=config.max_results, setting=RESULTS)
            return None if types is None else node_types(types)

        kinds = await self._checked(repo, check)
        scope = None if where is None else await self._graph.scope(repo, where)
        found = await self._graph.search_text(repo, query, limit, kinds, scope)
        return await self._graph.get_nodes(repo, [node_id for node_id, _ in found])

    async def delete_nodes(self, repo: str, node_ids: Sequence[str]) -> int:
        ids = await self._checked(repo, lambda config: node_id_list(node_ids, config))
        return await self._graph.delete_nodes(repo, ids)


def node_id_list(node_ids: object, config: Config) -> list[str]:
    """`node_ids` as a list of at most `config.max_results` ids, each checked
    (`inputs.check_id`); no more of an iterable is read than one past the bound.

    Raises:
        InvalidInputError: a string (it is not a list of one-letter ids), not an iterable,
            too many ids, or a bad id.
    """
    if isinstance(node_ids, str | bytes) or not isinstance(node_ids, Iterable):
        raise InvalidInputError(
            f"node_ids must be a list of node ids, got {type(node_ids).__name__}"
            + (f" (write [{node_ids!r}] for one id)" if isinstance(node_ids, str) else "")
        )
    most = config.max_results
    ids = list(islice(node_ids, most + 1))
    if len(ids) > most:
        raise InvalidInputError(
            f"node_ids holds more than the {most:,} ids one call takes ({RESULTS})"
        )
    return [check_id(node_id, "node id") for node_id in ids]


def node_types(types: Iterable[NodeType | str]) -> list[NodeType]:
    """`types` as a list of `NodeType`; a lone string is one type, not its letters.

    Raises:
        InvalidInputError: not an iterable of node types (or of their values), or one of
            more than `MAX_TYPES`.
    """
    try:
        if isinstance(types, str):
            return [NodeType(types)]
        kinds = [NodeType(t) for t in islice(types, MAX_TYPES + 1)]
        if len(kinds) <= MAX_TYPES:
            return kinds
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"types must be node types ({', '.join(t.value for t in NodeType)}): {exc}"
        ) from exc
    raise InvalidInputError(f"types holds more than the {MAX_TYPES} types one call takes")


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


def _literal(text: str) -> str:
    """`text` as a LIKE pattern that matches it alone."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
