"""The scope index's SQL, one text for both backends (`?` placeholders; PostgreSQL's store
swaps them): a `where`'s nodes read from `node_scopes`, driven by its first key's rows (one
range of the index) and each other key checked by a seek per node, so that what a filtered
read costs is bounded by its scope, never by the repo."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

from mnemo.graph.scope import SCOPE_LIMIT, WIDEN, Scope, Where
from mnemo.storage.lexical import LexicalIndex

Hits = list[tuple[str, float]]


def exists(repo: str, where: Where, node: str, skip: int) -> tuple[str, list[object]]:
    """EXISTS clauses for `where`'s keys after the first `skip`, about the node whose rowid
    is the SQL `node`."""
    clauses: list[str] = []
    params: list[object] = []
    for key, values in list(where.items())[skip:]:
        clauses.append(
            "EXISTS (SELECT 1 FROM node_scopes t WHERE t.repo = ? AND t.key = ?"
            f" AND t.value IN ({', '.join('?' * len(values))}) AND t.node = {node})")
        params += [repo, key, *values]
    return "".join(f" AND {c}" for c in clauses), params


def members(repo: str, where: Where, limit: int, columns: str = "n.id, n.rowid, n.type"
            ) -> tuple[str, list[object]]:
    """(SQL, params) of `columns` of the first `limit` nodes inside `where`, by rowid (the
    order they were added)."""
    (key, values), *_ = where.items()
    others, params = exists(repo, where, "s.node", 1)
    return (
        f"SELECT {columns} FROM node_scopes s JOIN nodes n ON n.rowid = s.node"
        f" WHERE s.repo = ? AND s.key = ? AND s.value IN ({', '.join('?' * len(values))})"
        f"{others} ORDER BY s.node LIMIT ?",
        [repo, key, *values, *params, limit],
    )


def inside(repo: str, where: Where, node_ids: Sequence[str]) -> tuple[str, list[object]]:
    """(SQL, params) of those of `node_ids` that are inside `where`."""
    others, params = exists(repo, where, "n.rowid", 0)
    return (
        f"SELECT n.id FROM nodes n WHERE n.repo = ? AND n.id IN ({', '.join('?' * len(node_ids))})"
        f"{others}",
        [repo, *node_ids, *params],
    )


class ScopeReads:
    """`GraphStore.scope`, `inside` and the scoped searches, over a store's `_scope_rows`
    (runs a statement of this module, its `?` placeholders the store's), its lexical index
    and its own full-text search (`_store_text`)."""

    _lexical: LexicalIndex | None

    async def _scope_rows(self, statement: str, params: list[object]) -> list[Any]:
        raise NotImplementedError

    async def _store_text(
        self, repo: str, query: str, limit: int, kinds: list[str] | None, where: Where
    ) -> Hits:
        raise NotImplementedError

    async def scope(self, repo: str, where: Where) -> Scope:
        """`where`'s nodes, read from the scope index when they are at most `SCOPE_LIMIT`."""
        rows = await self._scope_rows(*members(repo, where, SCOPE_LIMIT + 1))
        return Scope(where, None if len(rows) > SCOPE_LIMIT
                     else {str(i): (int(r), str(t)) for i, r, t in rows})

    async def inside(self, repo: str, scope: Scope, node_ids: Sequence[str]) -> set[str]:
        """Those of `node_ids` inside the scope."""
        ids = list(dict.fromkeys(node_ids))
        if scope.members is not None:
            return {i for i in ids if i in scope.members}
        found: set[str] = set()
        for at in range(0, len(ids), 500):
            rows = await self._scope_rows(*inside(repo, scope.where, ids[at:at + 500]))
            found |= {str(row[0]) for row in rows}
        return found

    async def scope_sources(
        self, repo: str, where: Where, limit: int | None = None
    ) -> list[tuple[str | None, str, str]]:
        """(source id or None, node id, type) of the nodes inside `where` (the first `limit`
        in the order they were added; all for None)."""
        return [(None if s is None else str(s), str(i), str(t)) for s, i, t in
                await self._scope_rows(*members(repo, where, 2**62 if limit is None else limit,
                                                "n.source_id, n.id, n.type"))]

    async def scoped(
        self, repo: str, scope: Scope, limit: int, kinds: Collection[str] | None,
        within: Callable[[list[str]], Awaitable[Hits]], wide: Callable[[int], Awaitable[Hits]],
    ) -> Hits:
        """A search inside the scope: `within` its members (of `kinds`), or, for a scope too
        large to list, `wide`, the repo's search, `WIDEN` times as wide, cut to the scope."""
        if scope.members is None:
            hits = await wide(limit * WIDEN)
            keep = await self.inside(repo, scope, [i for i, _ in hits])
            return [(i, score) for i, score in hits if i in keep][:limit]
        ids = scope.ids(kinds)
        return await within(ids) if ids and limit > 0 else []

    async def scoped_vectors(
        self, repo: str, scope: Scope, vector: Any, limit: int, kinds: Collection[str] | None,
        similarities: Callable[[str, Sequence[str], Any], Awaitable[dict[str, float]]],
        wide: Callable[[int], Awaitable[Hits]],
    ) -> Hits:
        """The dense channel inside the scope: exact cosine over its members' vectors."""

        async def within(ids: list[str]) -> Hits:
            assert scope.members is not None
            rows = scope.members
            similar = await similarities(repo, ids, vector)
            return sorted(similar.items(), key=lambda hit: (-hit[1], rows[hit[0]][0]))[:limit]

        return await self.scoped(repo, scope, limit, kinds, within, wide)

    async def scoped_text(
        self, repo: str, query: str, limit: int, kinds: list[str] | None, scope: Scope,
        wide: Callable[[int], Awaitable[Hits]],
    ) -> Hits:
        """The words channel inside the scope: the lexical index over its members' documents
        (their keys' postings), or the store's own search with the scope's condition."""
        lexical = self._lexical

        async def within(ids: list[str]) -> Hits:
            assert scope.members is not None
            if lexical is not None:
                rows = scope.members
                found = await lexical.search(repo, query, limit, kinds, [rows[i][0] for i in ids])
                if found is not None:
                    return found
            return await self._store_text(repo, query, limit, kinds, scope.where)

        return await self.scoped(repo, scope, limit, kinds, within, wide)
