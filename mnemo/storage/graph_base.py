"""`GraphBase`: what `SqliteGraph` and `PgGraph` share. A `where` is read from `node_scopes` by
its first key's range, each other key a seek per node: its cost is bounded by the scope."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, cast

import anyio

from mnemo.cpu import DeferredRead, FallbackRead
from mnemo.errors import ConflictError
from mnemo.graph import commit, erasure
from mnemo.graph.commit import CommitPlan
from mnemo.graph.erasure import Embed
from mnemo.graph.model import (
    LINK_TYPES,
    NODE_TYPES,
    Changeset,
    CommitReceipt,
    Link,
    LinkType,
    Node,
    NodeType,
    Vector,
)
from mnemo.graph.ports import (
    IntentPolicy,
    More,
    Neighbor,
    NodeContext,
    PendingRead,
    Reverting,
    SideWrite,
    TypedLink,
    VectorsMoved,
)
from mnemo.graph.scope import SCOPE_LIMIT, WIDEN, Scope, Where, indexed
from mnemo.graph.vectors import VectorIndex
from mnemo.storage.graph_rows import NODE_COLUMNS, RowReads
from mnemo.storage.lexical.index import LexicalIndex
from mnemo.storage.row import Row
from mnemo.storage.sql import Driver, marks
from mnemo.storage.vector_log import CachedVectors, Hits

if TYPE_CHECKING:
    from mnemo.graph.commit import CommitTarget


def exists(repo: str, where: Where, node: str, skip: int) -> tuple[str, list[object]]:
    """EXISTS clauses for `where`'s keys after the first `skip`, about rowid `node`."""
    clauses = ""
    params: list[object] = []
    for key, values in list(where.items())[skip:]:
        clauses += (" AND EXISTS (SELECT 1 FROM node_scopes t WHERE t.repo = ? AND t.key = ?"
                    f" AND t.value IN ({marks(len(values))}) AND t.node = {node})")
        params += [repo, key, *map(indexed, values)]
    return clauses, params


def members(repo: str, where: Where, limit: int, columns: str = "n.id, n.rowid, n.type",
            offset: int = 0) -> tuple[str, list[object]]:
    """(SQL, params) of `columns` of `limit` nodes inside `where` by rowid, after the first
    `offset`."""
    (key, values), *_ = where.items()
    others, params = exists(repo, where, "s.node", 1)
    return (
        f"SELECT {columns} FROM node_scopes s JOIN nodes n ON n.rowid = s.node"
        f" WHERE s.repo = ? AND s.key = ? AND s.value IN ({marks(len(values))})"
        f"{others} ORDER BY s.node LIMIT ? OFFSET ?",
        [repo, key, *map(indexed, values), *params, limit, offset],
    )


def seen_from_asked(rows: Iterable[Row], asked: Collection[str]) -> list[TypedLink]:
    """Rows of (src, type, dst, type, link type) as typed links seen from each asked end."""
    return [(a, NODE_TYPES[a_type], b, NODE_TYPES[b_type], LINK_TYPES[kind])
            for src, src_type, dst, dst_type, kind in rows
            for a, a_type, b, b_type in ((src, src_type, dst, dst_type),
                                         (dst, dst_type, src, src_type)) if a in asked]


def neighbors_seen_from_asked(rows: Iterable[Row], asked: Collection[str]) -> list[Neighbor]:
    """Rows of (src, dst, link type) as neighbors seen from each end that was asked for."""
    return [Neighbor(a, b, LINK_TYPES[kind]) for src, dst, kind in rows
            for a, b in ((src, dst), (dst, src)) if a in asked]


def joined(first: NodeContext, more: NodeContext) -> NodeContext:
    """`first`, then `more`'s nodes, stats, links and vectors (a `node_context`'s `then`)."""
    return NodeContext([*first.nodes, *more.nodes], {**first.stats, **more.stats},
                       [*first.links, *more.links], {**first.vectors, **more.vectors})


class GraphBase(RowReads):
    _vectors: CachedVectors

    def __init__(self, driver: Driver, dims: Callable[[str], int],
                 lexical: LexicalIndex | None) -> None:
        super().__init__(driver)
        self.dim = dims
        self._lexical = lexical
        self._locks: dict[str, anyio.Lock] = {}  # this process's lock of each repo
        self._reembeds: set[str] = set()  # the repos this store is re-embedding

    # The repo's lock across processes (this process's, `_locks`, is taken first).
    _repo_lock: Callable[[str], AbstractAsyncContextManager[None]]
    _reembed_lock: Callable[[str, ConflictError], AbstractAsyncContextManager[None]]
    # The store's own full-text search (see `search_text`), inside the `Where` when given.
    _store_text: Callable[[str, str, int, list[str] | None, Where | None], Awaitable[Hits]]
    _committed: Callable[[CommitPlan], Awaitable[None]]  # the vector side follows a commit
    _context: Callable[[str, Sequence[str], list[NodeType], LinkType, More | None],
                       Awaitable[NodeContext]]
    _links_near: Callable[[str, Sequence[str], Vector],
                          Awaitable[tuple[list[TypedLink], dict[str, float]]]]

    def _start_store_text(self, repo: str, query: str, limit: int, kinds: list[str] | None
                          ) -> PendingRead[Hits]:
        """`_store_text` (no `Where`), begun when awaited (SQLite: queued now)."""
        return DeferredRead(lambda: self._store_text(repo, query, limit, kinds, None))

    async def node_context(self, repo: str, node_ids: Sequence[str], linked: Iterable[NodeType],
                           link_type: LinkType, then: More | None = None) -> NodeContext:
        if not node_ids:
            return NodeContext([], {}, [])
        return await self._context(repo, node_ids, list(linked), link_type, then)

    async def typed_links_near(self, repo: str, node_ids: Sequence[str], vector: Vector
                               ) -> tuple[list[TypedLink], dict[str, float]]:
        return await self._links_near(repo, node_ids, vector) if node_ids else ([], {})

    def start_search_text(
        self, repo: str, query: str, limit: int, types: Iterable[NodeType] | None = None,
        scope: Scope | None = None,
    ) -> PendingRead[Hits]:
        kinds = None if types is None else [NodeType(t).value for t in types]
        if scope is not None:
            async def within(ids: list[str], rows: dict[str, tuple[int, str]]) -> Hits:
                if self._lexical is not None:
                    found = await self._lexical.search(
                        repo, query, limit, kinds, [rows[i][0] for i in ids])
                    if found is not None:
                        return found
                return await self._store_text(repo, query, limit, kinds, scope.where)

            return DeferredRead(lambda: self.scoped(
                repo, scope, limit, kinds, within,
                lambda n: self.start_search_text(repo, query, n, types).result()))
        if self._lexical is None:
            return self._start_store_text(repo, query, limit, kinds)
        return FallbackRead(self._lexical.start_search(repo, query, limit, kinds),
                            lambda: self._store_text(repo, query, limit, kinds, None))

    @asynccontextmanager
    async def lock(self, repo: str) -> AsyncIterator[None]:
        try:
            async with self._locks.setdefault(repo, anyio.Lock()), self._repo_lock(repo):
                yield
        finally:
            if self._lexical is not None:
                self._lexical.changed(repo)

    @asynccontextmanager
    async def reembedding(self, repo: str) -> AsyncIterator[None]:
        busy = ConflictError(f"repo {repo!r} is being re-embedded by another Memory")
        if repo in self._reembeds:
            raise busy
        self._reembeds.add(repo)
        try:
            async with self._reembed_lock(repo, busy):
                yield
        finally:
            self._reembeds.discard(repo)

    async def apply(
        self, changeset: Changeset, *, intents: IntentPolicy, also: Sequence[SideWrite] = ()
    ) -> CommitReceipt:
        return await commit.apply(cast("CommitTarget", self), changeset, intents=intents,
                                  also=also)

    async def links(self, repo: str) -> list[Link]:
        key = self.WRITES.KEY
        rows = await self._rows(
            f"SELECT a.id, b.id, l.type FROM nodes a JOIN links l ON l.src = a.{key}"
            f" JOIN nodes b ON b.{key} = l.dst WHERE a.repo = ? ORDER BY l.type, a.id, b.id",
            [repo])
        return [Link(src, dst, LinkType(kind)) for src, dst, kind in rows]

    async def write_commit(self, plan: CommitPlan, also: Sequence[SideWrite]) -> None:
        await self._driver.write(lambda sql: self.WRITES.write_commit(sql, plan, also))
        await self._committed(plan)

    async def write_side(self, also: Sequence[SideWrite]) -> None:
        await self._driver.write(lambda sql: self.WRITES.SESSIONS.side_writes(sql, also))

    async def generation(self, repo: str) -> int:
        return (await self._vectors.index(repo)).generation

    async def vector_index(self, repo: str) -> VectorIndex:
        return await self._vectors.index(repo)

    async def delete_nodes(self, repo: str, node_ids: Sequence[str]) -> int:
        """Deletes nodes with their links, vectors and search entries; returns how many went."""
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return 0
        async with self.lock(repo):
            gone = await self._driver.write(lambda sql: self.WRITES.delete_nodes(sql, repo, ids))
            self._vectors.forget(repo, gone)
            if gone:
                await self._erased()
        return len(gone)

    async def withdraw(
        self, repo: str, key: str, *, embed: Embed, also: Sequence[SideWrite] = (),
        generation: int | None = None, reverting: Reverting | None = None,
    ) -> int:
        async def delete(plan: erasure.Plan) -> list[str]:
            if reverting is not None:
                await reverting.refused()
            gone = await self._driver.write(lambda sql: self.WRITES.withdraw(
                sql, repo, key, also, plan, None if reverting is None else reverting.revert_id))
            self._vectors.forget(repo, gone)
            if reverting is None:
                await self._erased()
            return gone

        async def same_generation() -> None:
            if generation is not None and (now := await self.generation(repo)) != generation:
                raise VectorsMoved(now)

        return len(await erasure.forget(
            lambda: self.lock(repo),
            lambda: self._driver.read(
                lambda sql: self.WRITES.inherited(sql, repo, key, reverting is not None)),
            embed, delete, same_generation))

    async def _erased(self) -> None:
        """After an erasure's transaction: wipes the lexical index's slots."""
        if self._lexical is not None:
            await self._lexical.erase()

    async def search_text(
        self, repo: str, query: str, limit: int, types: Iterable[NodeType] | None = None,
        scope: Scope | None = None,
    ) -> Hits:
        """Nodes matching `query` by BM25, best first (the lexical index, else the store's)."""
        return await self.start_search_text(repo, query, limit, types, scope).result()

    async def search_vectors(
        self, repo: str, vector: Vector, limit: int, types: Iterable[NodeType] | None = None,
        scope: Scope | None = None,
    ) -> Hits:
        """Nodes nearest to `vector` by cosine, best first (inside `scope`, when given)."""
        if scope is None:
            return await self._vectors.search(repo, vector, limit, types)
        kinds = None if types is None else [NodeType(t).value for t in types]

        async def within(ids: list[str], rows: dict[str, tuple[int, str]]) -> Hits:
            # Exact cosine over the members; ties kept at the cut, ordered by rowid.
            similar = await self._vectors.similarities(repo, ids, vector, limit)
            return sorted(similar.items(), key=lambda hit: (-hit[1], rows[hit[0]][0]))[:limit]

        return await self.scoped(repo, scope, limit, kinds, within,
                                 lambda n: self._vectors.search(repo, vector, n, types))

    async def nearest_of_type(
        self, repo: str, probes: Vector, kind: NodeType, k: int,
        among: Sequence[str] | None = None,
    ) -> list[Hits]:
        return await self._vectors.nearest_of_type(repo, probes, kind, k, among)

    async def similarities(
        self, repo: str, node_ids: Sequence[str], vector: Vector
    ) -> dict[str, float]:
        return await self._vectors.similarities(repo, node_ids, vector, None)

    def reading(self, repo: str) -> AbstractAsyncContextManager[None]:
        return self._vectors.reading(repo)

    def vectors_on_loop(self, repo: str) -> bool:
        return self._vectors.on_loop(repo)

    async def vectors(self, repo: str, node_ids: Sequence[str]) -> dict[str, Vector]:
        return await self._vectors.of_nodes(repo, node_ids)

    async def vectors_of_type(self, repo: str, kind: NodeType) -> tuple[list[str], Vector]:
        return await self._vectors.of_type(repo, kind)

    async def settle(self, repo: str) -> None:
        await self._vectors.settle(repo)
        if self._lexical is not None:
            await self._lexical.settle(repo)

    async def aclose(self) -> None:
        try:
            await self._vectors.aclose()
        finally:
            if self._lexical is not None:
                await self._lexical.aclose()

    async def scope(self, repo: str, where: Where) -> Scope:
        rows = await self._rows(*members(repo, where, SCOPE_LIMIT + 1))
        return Scope(where, None if len(rows) > SCOPE_LIMIT
                     else {str(i): (int(r), str(t)) for i, r, t in rows})

    async def inside(self, repo: str, scope: Scope, node_ids: Sequence[str]) -> set[str]:
        ids = list(dict.fromkeys(node_ids))
        if scope.members is not None:
            return {i for i in ids if i in scope.members}
        others, params = exists(repo, scope.where, "n.rowid", 0)
        rows = await self._among(
            f"SELECT n.id FROM nodes n WHERE n.repo = ?{others} AND n.id IN ({{}})",
            ids, repo, *params)
        return {str(row[0]) for row in rows}

    async def scope_sources(self, repo: str, where: Where) -> list[tuple[str | None, str, str]]:
        return [(None if s is None else str(s), str(i), str(t)) for s, i, t in
                await self._rows(*members(repo, where, 2**62, "n.source_id, n.id, n.type"))]

    async def scope_nodes(self, repo: str, where: Where, limit: int, offset: int) -> list[Node]:
        rows = await self._rows(*members(repo, where, limit, NODE_COLUMNS, offset))
        return [self._node(row) for row in rows]

    async def scoped(
        self, repo: str, scope: Scope, limit: int, kinds: Collection[str] | None,
        within: Callable[[list[str], dict[str, tuple[int, str]]], Awaitable[Hits]],
        wide: Callable[[int], Awaitable[Hits]],
    ) -> Hits:
        """A search `within` the scope's members, or for a scope too large to list, `wide`
        (`WIDEN` times as wide) cut to the scope."""
        if scope.members is None:
            hits = await wide(limit * WIDEN)
            keep = await self.inside(repo, scope, [i for i, _ in hits])
            return [(i, score) for i, score in hits if i in keep][:limit]
        ids = scope.ids(kinds)
        return await within(ids, scope.members) if ids and limit > 0 else []
