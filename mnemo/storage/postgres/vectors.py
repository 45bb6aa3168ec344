"""`PgVectors`: `PgGraph`'s vector searches over pgvector: exact below `exact_below` vectors,
else through the repo's partial HNSW index. TAG and INTENT vectors (probed by every recall and
commit) are also kept in memory, following the node log (`vector_log`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import anyio
import numpy as np
from psycopg import sql

from mnemo.errors import StorageError
from mnemo.graph import ann, ann_files
from mnemo.graph.model import NodeType, Vector
from mnemo.graph.vectors import VectorIndex, unit
from mnemo.storage import vector_log
from mnemo.storage.postgres import lexical, schema
from mnemo.storage.postgres.connection import Postgres, as_array
from mnemo.storage.row import Row
from mnemo.storage.vector_log import (
    CachedVectors,
    Change,
    Hits,
    RepoVectors,
    VectorState,
)

log = logging.getLogger("mnemo")

ROUTES = (NodeType.TAG, NodeType.INTENT)

# Smaller repos are searched exactly (BENCHMARKS.md), their order independent of HNSW.
EXACT_BELOW = 10_000

class PgVectors(CachedVectors):
    """The vector side of one database's graph; its caches follow this process's writes."""

    def __init__(
        self,
        pg: Postgres,
        dims: Callable[[str], int],
        *,
        exact_below: int = EXACT_BELOW,
        ann_dir: Path | None = None,
    ) -> None:
        """`ann_dir`: where the routes' HNSW graphs are saved (None: not saved)."""
        self._pg = pg
        self._dims = dims
        self._exact_below = exact_below
        self._ann_dir = ann_dir
        self._place: str | None = None  # the database's folder name, read once
        super().__init__(self._changes, self._load_routes)
        self._sizes: dict[str, int] = {}
        self._indexed: set[str] = set()

    async def committed(self, repo: str, new: int) -> None:
        """A commit wrote `new` vectors (its routes arrive from the node log at next use): creates
        the repo's HNSW index once it is past `exact_below` (a smaller repo would only pay for
        it on insert)."""
        if repo in self._sizes:
            self._sizes[repo] += new
        if repo not in self._indexed and await self._size(repo) > self._exact_below:
            async with self._pg.connection() as conn:
                await schema.ensure_vector_index(conn, repo, self._dims(repo))
            self._indexed.add(repo)

    async def switched(self, repo: str, dim: int) -> None:
        """The repo's vectors were all made again: rebuilds its HNSW index if large, without
        holding up commits (a failure is logged; searches are exact until a later commit
        builds it), and drops its routes' saved graphs."""
        self._indexed.discard(repo)
        self._sizes.pop(repo, None)
        if await self._size(repo) > self._exact_below:
            try:
                async with self._pg.connection() as conn:
                    await schema.build_vector_index(conn, repo, dim)
                self._indexed.add(repo)
            except StorageError as exc:
                log.warning("mnemo: the HNSW index of repo %r was not built again: %s", repo,
                            exc)
        folder = await self._graph_folder(repo)
        if folder is not None:
            await anyio.to_thread.run_sync(ann_files.discard, folder)

    def forget(self, repo: str, node_ids: Sequence[str]) -> None:
        if repo in self._sizes:
            self._sizes[repo] = max(0, self._sizes[repo] - len(node_ids))
        super().forget(repo, node_ids)

    async def search(
        self, repo: str, vector: Vector, limit: int, types: Iterable[NodeType] | None = None
    ) -> Hits:
        if limit <= 0:
            return []
        kinds = None if types is None else [NodeType(t).value for t in types]
        return (await self._nearest(repo, [vector], kinds, limit))[0]

    async def nearest_of_type(
        self, repo: str, probes: Vector, kind: NodeType, k: int,
        among: Sequence[str] | None = None,
    ) -> list[Hits]:
        if k <= 0:
            return [[] for _ in range(len(probes))]
        if kind in ROUTES:
            return await super().nearest_of_type(repo, probes, kind, k, among)
        if among is not None:
            return await ann.nearest_among(await self.of_nodes(repo, among), probes, k)
        return await self._nearest(repo, list(probes), [kind.value], k)

    async def similarities(
        self, repo: str, node_ids: Sequence[str], vector: Vector, limit: int | None = None
    ) -> dict[str, float]:
        """Cosine of each of these nodes to `vector`; with `limit`, only the `limit` most similar
        (ties kept), scored by the server."""
        if limit is not None:
            rows = await self._pg.fetch_all(NEAREST_OF_NODES, {
                "repo": repo, "ids": list(node_ids), "q": as_array(vector), "k": limit})
            # A zero vector has no direction: its distance is NaN, and it is never near.
            return {str(i): 1.0 - d for i, d in rows if isinstance(d, float) and math.isfinite(d)}
        found = await self.of_nodes(repo, node_ids)
        if not found:
            return {}
        scores = np.stack(list(found.values())) @ unit(vector)[0]
        return {node_id: float(score) for node_id, score in zip(found, scores, strict=True)}

    async def of_nodes(self, repo: str, node_ids: Sequence[str]) -> dict[str, Vector]:
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return {}
        rows = await self._pg.fetch_all(OF_NODES, {"repo": repo, "ids": ids}, binary=True)
        found = unit_rows(rows)
        return {i: found[i] for i in ids if i in found}

    async def of_type(self, repo: str, kind: NodeType) -> tuple[list[str], Vector]:
        if kind in ROUTES:
            return await super().of_type(repo, kind)
        _, ids, _, matrix = await self._load(repo, [kind.value])
        return ids, unit(matrix) if ids else matrix

    async def _load_routes(self, repo: str) -> RepoVectors:
        # faiss, if installed, is imported off the loop; graphs are built from `ann.WALK_FROM`.
        faiss = await anyio.to_thread.run_sync(ann.load_faiss)
        folder = None if faiss is None else await self._graph_folder(repo)
        # State before and after the vectors: a switch between them means reading again.
        state = await self._state(repo)
        while True:
            rowids, ids, types, matrix = await self._load(
                repo, [t.value for t in ROUTES], state.dim or self._dims(repo))
            after = await self._state(repo)
            if after.generation == state.generation:
                break
            state = after
        followed = RepoVectors(VectorIndex(matrix.shape[1], generation=state.generation),
                            state.seq, ROUTES)
        followed.load(rowids, ids, types, matrix)
        ann.attach(followed.index, threshold=ann.WALK_FROM - 1, folder=folder)
        return followed

    async def _state(self, repo: str) -> VectorState:
        return VectorState.of(
            await self._pg.fetch_all(vector_log.VECTOR_STATE.replace("?", "%s"), (repo,)))

    async def _changes(self, repo: str, followed: RepoVectors) -> tuple[int, list[Change]] | None:
        state = await self._state(repo)
        seq = state.seq
        if not followed.behind(seq, state.horizon, state.generation):
            return None
        rows = await self._pg.fetch_all(
            vector_log.CHANGED_OF_KINDS.replace("?", "%s"),
            (repo, followed.seq, seq, repo, [t.value for t in ROUTES]), binary=True)
        if any(v is not None and len(v) != followed.index.dim for _, _, _, v in rows):
            # A switch to another dimension committed after the state was read.
            raise vector_log.Reload
        return seq, [(int(r), i, t, v) for r, i, t, v in rows]

    async def _nearest(
        self, repo: str, probes: list[Vector], kinds: list[str] | None, k: int
    ) -> list[Hits]:
        dim = self._dims(repo)
        exact = await self._size(repo) <= self._exact_below
        statement = _exact_scan(repo, kinds) if exact else _hnsw_scan(repo, dim, kinds)
        results = []
        async with self._pg.connection() as conn:
            for probe in probes:
                cur = await conn.execute(statement, {"q": as_array(probe), "kinds": kinds, "k": k})
                rows = [(str(i), 1.0 - d) for i, d in await cur.fetchall()
                        if isinstance(d, float) and math.isfinite(d)]
                # An iterative HNSW scan returns rows in roughly distance order.
                results.append(rows if exact else sorted(rows, key=lambda r: -r[1]))
        return results

    async def _graph_folder(self, repo: str) -> Path | None:
        """Where the repo's routing graphs are saved: per database (cluster id, oid), per repo."""
        if self._ann_dir is None:
            return None
        if self._place is None:
            try:
                (place,), = await self._pg.fetch_all(lexical.PLACE)
            except StorageError as exc:
                # pg_control_system() may be revoked: graphs are then built at each open.
                log.warning("mnemo: the routes' HNSW graphs will not be saved (%s)", exc)
                self._ann_dir = None
                return None
            self._place = str(place)
        return ann_files.repo_folder(self._ann_dir / self._place / "hnsw", repo)

    async def _size(self, repo: str) -> int:
        if repo not in self._sizes:
            rows = await self._pg.fetch_all(
                "SELECT count(*) FROM vectors WHERE repo = %s", (repo,)
            )
            self._sizes[repo] = int(rows[0][0]) if rows else 0
        return self._sizes[repo]

    async def _load(
        self, repo: str, kinds: list[str], dim: int | None = None
    ) -> tuple[list[int], list[str], list[NodeType], Vector]:
        """The rowids, ids, types and vectors of the repo's nodes of `kinds`, oldest first."""
        rows = await self._pg.fetch_all(
            "SELECT n.rowid, v.node_id, n.type, v.vec FROM vectors v JOIN nodes n"
            " ON n.id = v.node_id WHERE v.repo = %s AND n.type = ANY(%s) ORDER BY n.rowid",
            (repo, kinds), binary=True,
        )
        matrix = (np.stack([r[3] for r in rows]) if rows
                  else np.zeros((0, dim or self._dims(repo)), dtype=np.float32))
        return ([int(r[0]) for r in rows], [str(r[1]) for r in rows],
                [NodeType(r[2]) for r in rows], matrix)


# The vectors of some nodes (read in binary: `unit_rows` takes the rows).
OF_NODES = "SELECT node_id, vec FROM vectors WHERE repo = %(repo)s AND node_id = ANY(%(ids)s)"
# The `k` of some nodes nearest to `q` by cosine distance, all tied with the last kept.
NEAREST_OF_NODES = (
    "SELECT node_id, vec <=> %(q)s AS d FROM vectors WHERE repo = %(repo)s"
    " AND node_id = ANY(%(ids)s) ORDER BY d FETCH FIRST %(k)s ROWS WITH TIES")


def unit_rows(rows: Sequence[Row]) -> dict[str, Vector]:
    """(node id, vector) rows as unit vectors by id, scaled in one numpy call."""
    if not rows:
        return {}
    matrix = unit(np.stack([vector for _, vector in rows]))
    return {str(node_id): row for (node_id, _), row in zip(rows, matrix, strict=True)}


def _exact_scan(repo: str, kinds: list[str] | None) -> sql.Composed:
    """Every vector of the repo (of `kinds`) by cosine distance, ties by insertion. Without a
    type filter, ranked on `vectors` alone (`WITH TIES`) before joining `nodes`: joined first,
    lagging statistics made the planner hash every vector."""
    if kinds is not None:
        return sql.SQL(
            "SELECT v.node_id, v.vec <=> %(q)s AS d FROM vectors v JOIN nodes n ON n.id ="
            " v.node_id WHERE v.repo = {} AND n.type = ANY(%(kinds)s)"
            " ORDER BY v.vec <=> %(q)s, n.rowid LIMIT %(k)s"
        ).format(sql.Literal(repo))
    return sql.SQL(
        "SELECT t.node_id, t.d FROM (SELECT v.node_id, v.vec <=> %(q)s AS d FROM vectors v"
        " WHERE v.repo = {} ORDER BY d FETCH FIRST %(k)s ROWS WITH TIES) t"
        " JOIN nodes n ON n.id = t.node_id ORDER BY t.d, n.rowid LIMIT %(k)s"
    ).format(sql.Literal(repo))


def _hnsw_scan(repo: str, dim: int, kinds: list[str] | None) -> sql.Composed:
    """The repo's HNSW index walked from the query (needs the cast and the literal repo)."""
    distance = sql.SQL("v.vec::vector({}) <=> %(q)s::vector({})").format(
        sql.Literal(dim), sql.Literal(dim))
    return sql.SQL(
        "SELECT v.node_id, {distance} AS d FROM vectors v{join} WHERE v.repo = {repo}{kind}"
        " ORDER BY {distance} LIMIT %(k)s"
    ).format(
        distance=distance,
        join=sql.SQL("" if kinds is None else " JOIN nodes n ON n.id = v.node_id"),
        repo=sql.Literal(repo),
        kind=sql.SQL("" if kinds is None else " AND n.type = ANY(%(kinds)s)"),
    )
