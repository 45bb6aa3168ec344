"""`PgGraph`: the `GraphStore` port (`mnemo.graph.ports`) over PostgreSQL and pgvector.

Commits to one repo are serialised by the repo's lock: an in-process lock, then a session
advisory lock on a connection held for the block, so that commits of several processes on one
database take turns too. Each commit is one transaction recorded in `applied_changesets`, with
its side writes (a session's state change, an ingested source) in the same transaction.

Vectors live in pgvector. A repo of at most `exact_below` vectors is searched exactly (a scan
ordered by cosine distance, ties by insertion); past it, through the repo's partial HNSW index
(`schema.ensure_vector_index`), whose `WHERE repo = <literal>` the query repeats so the planner
can use it. The routing nodes' vectors (TAG and INTENT) are also kept in memory: a recall probes
them with every query and each commit compares its intents with them, and they are a small part
of a repo. Words are searched in the rows' generated `tsvector` (GIN), with every word of the
query a word of an OR query, as SQLite's FTS5 query is.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import anyio
import numpy as np
from psycopg import sql
from psycopg.types.json import Jsonb

from mnemo.config import Config
from mnemo.graph import commit
from mnemo.graph.commit import CommitPlan
from mnemo.graph.maintenance import ValidationReport
from mnemo.graph.model import (
    Changeset,
    CommitReceipt,
    Link,
    LinkType,
    Node,
    NodeType,
    Vector,
)
from mnemo.graph.ports import IntentPolicy, MergeResult, Neighbor, SideWrite, SweepResult, TypedLink
from mnemo.graph.vectors import VectorIndex, unit
from mnemo.inputs import query_terms
from mnemo.storage.postgres import maintenance, schema
from mnemo.storage.postgres.connection import Postgres
from mnemo.storage.postgres.sessions import side_writes

_WORD = re.compile(r"\w+", re.UNICODE)
_ROUTES = (NodeType.TAG, NodeType.INTENT)
_NODE_COLUMNS = "id, type, text, data, created_at"

# Below this many vectors a repo is searched exactly: a scan of 10k 384-d rows takes a few
# milliseconds, and an exact answer keeps small repos' order independent of the HNSW graph.
EXACT_BELOW = 10_000


def repo_lock_key(repo: str) -> int:
    """The advisory-lock key of a repo's commits: 64 bits of a digest of its name."""
    digest = hashlib.sha256(b"mnemo.repo:" + repo.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PgGraph:
    """`GraphStore` over a PostgreSQL database."""

    def __init__(
        self, pg: Postgres, dims: Callable[[str], int], *, exact_below: int = EXACT_BELOW
    ) -> None:
        self._pg = pg
        self._dims = dims
        self._exact_below = exact_below
        self._locks: dict[str, anyio.Lock] = {}
        self._routes: dict[str, VectorIndex] = {}
        self._routes_loading: dict[str, anyio.Lock] = {}
        self._sizes: dict[str, int] = {}
        self._indexed: set[str] = set()

    def dim(self, repo: str) -> int:
        return self._dims(repo)

    @asynccontextmanager
    async def lock(self, repo: str) -> AsyncIterator[None]:
        """The repo's write lock: this process's lock, then the database's advisory lock (the
        wait for another process is bounded by the busy timeout: StorageError "busy")."""
        async with self._locks.setdefault(repo, anyio.Lock()), self._pg.connection() as conn:
            key = repo_lock_key(repo)
            await conn.execute("SELECT pg_advisory_lock(%s)", (key,))
            try:
                yield
            finally:
                # Shielded: a cancelled block must not hand a locked connection to the pool.
                with anyio.CancelScope(shield=True):
                    await conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

    # ---- commits --------------------------------------------------------------------------

    async def apply(
        self, changeset: Changeset, *, intents: IntentPolicy, also: Sequence[SideWrite] = ()
    ) -> CommitReceipt:
        """Adds the changeset's nodes and links (deduplicated), durably, once
        (`mnemo.graph.commit.apply`).

        Raises:
            StorageError: the transaction failed; nothing of it was written.
            ValueError: a vector is not of the repo's dimension; nothing was written.
        """
        return await commit.apply(self, changeset, intents=intents, also=also)

    async def write_commit(self, plan: CommitPlan, also: Sequence[SideWrite]) -> None:
        repo, created = plan.repo, datetime.fromisoformat(plan.created_at)
        await self._ensure_index(repo)
        async with self._pg.transaction() as conn, conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO nodes (id, repo, type, text, data, key, source_id, created_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                [(n.id, repo, n.type.value, text, Jsonb(n.data), n.key, n.source_id, created)
                 for n, text, _ in plan.nodes],
            )
            await cur.executemany(
                "INSERT INTO vectors (node_id, repo, vec) VALUES (%s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                [(n.id, repo, _array(vector)) for n, _, vector in plan.nodes],
            )
            for node_id, (text, vector) in plan.rewordings.items():
                await cur.execute("UPDATE nodes SET text = %s WHERE id = %s", (text, node_id))
                await cur.execute(
                    "UPDATE vectors SET vec = %s WHERE node_id = %s", (_array(vector), node_id)
                )
            await cur.executemany(
                "INSERT INTO links (repo, src, dst, type) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                [(repo, link.src, link.dst, link.type.value) for link in plan.links],
            )
            await cur.execute(
                "INSERT INTO applied_changesets (id, repo, receipt, applied_at)"
                " VALUES (%s, %s, %s, %s)",
                (plan.changeset_id, repo, plan.receipt.to_json(), created),
            )
            await side_writes(conn, also)
        if repo in self._sizes:
            self._sizes[repo] += len(plan.nodes)
        routes = self._routes.get(repo)
        if routes is not None:
            new = [(n.id, n.type, v) for n, _, v in plan.nodes if n.type in _ROUTES]
            new += [(i, NodeType.INTENT, v) for i, (_, v) in plan.rewordings.items()]
            if new:
                routes.add([i for i, _, _ in new], [t for _, t, _ in new],
                           np.array([v for _, _, v in new], dtype=np.float32))

    async def write_side(self, also: Sequence[SideWrite]) -> None:
        async with self._pg.transaction() as conn:
            await side_writes(conn, also)

    async def receipt(self, changeset_id: str) -> CommitReceipt | None:
        row = await self._one("SELECT receipt FROM applied_changesets WHERE id = %s",
                              (changeset_id,))
        return None if row is None else _receipt(row[0])

    async def ingested(self, repo: str, source_id: str) -> tuple[str, list[str]] | None:
        row = await self._one(
            "SELECT i.payload_hash, a.receipt FROM ingests i"
            " JOIN applied_changesets a ON a.id = i.changeset_id"
            " WHERE i.repo = %s AND i.source_id = %s",
            (repo, source_id),
        )
        return None if row is None else (str(row[0]), _receipt(row[1]).node_ids)

    async def texts(self, node_ids: list[str]) -> dict[str, str]:
        rows = await self._all("SELECT id, text FROM nodes WHERE id = ANY(%s)", (node_ids,))
        return {str(i): str(t) for i, t in rows}

    async def tag_owners(self, repo: str, keys: list[str]) -> dict[str, str]:
        if not keys:
            return {}
        rows = await self._all(
            "SELECT key, id FROM nodes WHERE repo = %s AND type = 'tag' AND key = ANY(%s)",
            (repo, list(dict.fromkeys(keys))),
        )
        return {str(k): str(i) for k, i in rows}

    async def present(self, repo: str, node_ids: list[str]) -> set[str]:
        if not node_ids:
            return set()
        rows = await self._all("SELECT id FROM nodes WHERE id = ANY(%s)", (node_ids,))
        return {str(i) for (i,) in rows}

    # ---- reads ----------------------------------------------------------------------------

    async def get_nodes(self, repo: str, node_ids: Sequence[str]) -> list[Node]:
        """The nodes with these ids, in the order asked (unknown ids are left out)."""
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return []
        rows = await self._all(
            f"SELECT {_NODE_COLUMNS} FROM nodes WHERE repo = %s AND id = ANY(%s)", (repo, ids)
        )
        found = {node.id: node for node in map(_node, rows)}
        return [found[i] for i in ids if i in found]

    async def get_nodes_by_type(self, repo: str, types: Iterable[NodeType]) -> list[Node]:
        kinds = _kinds(types)
        if not kinds:
            return []
        rows = await self._all(
            f"SELECT {_NODE_COLUMNS} FROM nodes WHERE repo = %s AND type = ANY(%s)"
            " ORDER BY rowid",
            (repo, kinds),
        )
        return [_node(row) for row in rows]

    async def latest(self, repo: str, types: Iterable[NodeType], top_k: int) -> list[Node]:
        kinds = _kinds(types)
        if not kinds or top_k <= 0:
            return []
        rows = await self._all(
            f"SELECT {_NODE_COLUMNS} FROM nodes WHERE repo = %s AND type = ANY(%s)"
            " ORDER BY rowid DESC LIMIT %s",
            (repo, kinds, top_k),
        )
        return [_node(row) for row in rows]

    async def neighbors(
        self, repo: str, node_ids: Sequence[str], link_type: LinkType | None = None
    ) -> list[Neighbor]:
        """Every link touching these nodes, seen from each of them, in either direction."""
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return []
        kind = "" if link_type is None else " AND type = %(kind)s"
        rows = await self._all(
            f"SELECT src, dst, type FROM links WHERE repo = %(repo)s AND src = ANY(%(ids)s){kind}"
            f" UNION ALL SELECT src, dst, type FROM links WHERE repo = %(repo)s"
            f" AND dst = ANY(%(ids)s){kind}",
            {"repo": repo, "ids": ids, "kind": None if link_type is None else link_type.value},
        )
        wanted = set(ids)
        found: list[Neighbor] = []
        for src, dst, typ in rows:
            if src in wanted:
                found.append(Neighbor(src, dst, LinkType(typ)))
            if dst in wanted:
                found.append(Neighbor(dst, src, LinkType(typ)))
        return list(dict.fromkeys(found))

    async def typed_links(self, repo: str, node_ids: Sequence[str]) -> list[TypedLink]:
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return []
        rows = await self._all(
            "SELECT l.src, a.type, l.dst, b.type, l.type FROM links l"
            " JOIN nodes a ON a.id = l.src JOIN nodes b ON b.id = l.dst"
            " WHERE l.repo = %(repo)s AND (l.src = ANY(%(ids)s) OR l.dst = ANY(%(ids)s))",
            {"repo": repo, "ids": ids},
        )
        wanted = set(ids)
        found: list[TypedLink] = []
        for src, src_type, dst, dst_type, kind in rows:
            link = LinkType(kind)
            if src in wanted:
                found.append((src, NodeType(src_type), dst, NodeType(dst_type), link))
            if dst in wanted:
                found.append((dst, NodeType(dst_type), src, NodeType(src_type), link))
        return found

    async def links(self, repo: str) -> list[Link]:
        rows = await self._all(
            "SELECT src, dst, type FROM links WHERE repo = %s ORDER BY type, src, dst", (repo,)
        )
        return [Link(src, dst, LinkType(kind)) for src, dst, kind in rows]

    async def access_stats(
        self, repo: str, node_ids: Sequence[str]
    ) -> dict[str, tuple[int, datetime | None]]:
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return {}
        rows = await self._all(
            "SELECT id, access_count, last_access FROM nodes WHERE repo = %s AND id = ANY(%s)",
            (repo, ids),
        )
        return {str(i): (int(count), last) for i, count, last in rows}

    async def reinforce(self, repo: str, node_ids: Sequence[str], when: datetime) -> None:
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return
        async with self._pg.connection() as conn:
            await conn.execute(
                "UPDATE nodes SET access_count = access_count + 1, last_access = %s"
                " WHERE repo = %s AND id = ANY(%s)",
                (when, repo, ids),
            )

    # ---- deletes --------------------------------------------------------------------------

    async def delete_nodes(self, repo: str, node_ids: Sequence[str]) -> int:
        """Deletes nodes with their links, vectors and search entries; returns how many went."""
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return 0
        async with self.lock(repo), self._pg.transaction() as conn:
            cur = await conn.execute(
                "DELETE FROM nodes WHERE repo = %s AND id = ANY(%s) RETURNING id", (repo, ids)
            )
            gone = [str(i) for (i,) in await cur.fetchall()]
        self._forget(repo, gone)
        return len(gone)

    async def delete_source(
        self, repo: str, source_id: str, *, also: Sequence[SideWrite] = ()
    ) -> int:
        """Deletes every node a source produced, then the tags and intents that this left
        without links (a tag a source created but another still uses stays); returns how
        many nodes went."""
        async with self.lock(repo):
            async with self._pg.transaction() as conn:
                cur = await conn.execute(
                    "SELECT id, type IN ('tag', 'intent') FROM nodes"
                    " WHERE repo = %s AND source_id = %s",
                    (repo, source_id),
                )
                rows = await cur.fetchall()
                own = [str(i) for i, route in rows if not route]
                routes = {str(i) for i, route in rows if route}
                cur = await conn.execute(
                    "SELECT DISTINCT n.id FROM links l JOIN nodes n ON n.id = l.src"
                    " WHERE l.dst = ANY(%s) AND n.type IN ('tag', 'intent')",
                    (own,),
                )
                routes.update(str(i) for (i,) in await cur.fetchall())
                await conn.execute("DELETE FROM nodes WHERE id = ANY(%s)", (own,))
                cur = await conn.execute(
                    "DELETE FROM nodes n WHERE n.id = ANY(%s) AND NOT EXISTS"
                    " (SELECT 1 FROM links l WHERE l.src = n.id OR l.dst = n.id) RETURNING id",
                    (sorted(routes),),
                )
                orphans = [str(i) for (i,) in await cur.fetchall()]
                await side_writes(conn, also)
            self._forget(repo, own + orphans)
            return len(own) + len(orphans)

    def _forget(self, repo: str, node_ids: Sequence[str]) -> None:
        if repo in self._sizes:
            self._sizes[repo] = max(0, self._sizes[repo] - len(node_ids))
        if repo in self._routes:
            self._routes[repo].remove(node_ids)

    # ---- search ---------------------------------------------------------------------------

    async def search_text(
        self, repo: str, query: str, limit: int, types: Iterable[NodeType] | None = None
    ) -> list[tuple[str, float]]:
        """Nodes matching any word of `query` (stemmed), best `ts_rank_cd` first."""
        words = query_terms(_WORD.findall(query))
        if not words or limit <= 0:
            return []
        tsquery = sql.SQL(" || ").join(
            sql.SQL("plainto_tsquery({}, {})").format(
                sql.Literal(schema.TEXT_SEARCH_CONFIG), sql.Literal(word)
            )
            for word in words
        )
        kinds = None if types is None else _kinds(types)
        statement = sql.SQL(
            "SELECT id, ts_rank_cd(search, q) AS score FROM nodes, (SELECT {}) AS query(q)"
            " WHERE repo = %s AND search @@ q{} ORDER BY score DESC, rowid LIMIT %s"
        ).format(tsquery, sql.SQL("" if kinds is None else " AND type = ANY(%s)"))
        params: list[Any] = [repo, *([] if kinds is None else [kinds]), limit]
        rows = await self._all(statement, params)
        return [(str(i), float(score)) for i, score in rows]

    async def search_vectors(
        self, repo: str, vector: Vector, limit: int, types: Iterable[NodeType] | None = None
    ) -> list[tuple[str, float]]:
        """Nodes nearest to `vector` by cosine (similarity, best first)."""
        if limit <= 0:
            return []
        kinds = None if types is None else _kinds(types)
        return (await self._nearest(repo, [vector], kinds, limit))[0]

    async def nearest_of_type(
        self, repo: str, probes: Vector, kind: NodeType, k: int
    ) -> list[list[tuple[str, float]]]:
        """For each probe row, the `k` nodes of one type nearest by cosine."""
        if k <= 0:
            return [[] for _ in range(len(probes))]
        if kind in _ROUTES:
            ids, matrix = (await self._routes_of(repo)).of_type(kind)
            return _top(unit(probes) @ matrix.T, ids, k) if ids else [[] for _ in probes]
        return await self._nearest(repo, list(probes), [kind.value], k)

    async def similarities(
        self, repo: str, node_ids: Sequence[str], vector: Vector
    ) -> dict[str, float]:
        found = await self.vectors(repo, node_ids)
        if not found:
            return {}
        scores = np.stack(list(found.values())) @ unit(vector)[0]
        return {node_id: float(score) for node_id, score in zip(found, scores, strict=True)}

    async def vectors(self, repo: str, node_ids: Sequence[str]) -> dict[str, Vector]:
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return {}
        rows = await self._all(
            "SELECT node_id, vec FROM vectors WHERE repo = %s AND node_id = ANY(%s)",
            (repo, ids), binary=True,
        )
        found = {str(i): unit(v)[0] for i, v in rows}
        return {i: found[i] for i in ids if i in found}

    async def vectors_of_type(self, repo: str, kind: NodeType) -> tuple[list[str], Vector]:
        if kind in _ROUTES:
            return (await self._routes_of(repo)).of_type(kind)
        ids, _, matrix = await self._load(repo, [kind.value])
        return ids, unit(matrix) if ids else matrix

    async def vector_index(self, repo: str) -> VectorIndex:
        """The repo's TAG and INTENT vectors, in memory (`CommitTarget`)."""
        return await self._routes_of(repo)

    async def _nearest(
        self, repo: str, probes: list[Vector], kinds: list[str] | None, k: int
    ) -> list[list[tuple[str, float]]]:
        dim = self._dims(repo)
        exact = await self._size(repo) <= self._exact_below
        # The HNSW index matches `vec::vector(dim)` under `repo = <literal>`; without the cast
        # the planner cannot use it and the scan is exact.
        distance = sql.SQL("v.vec <=> %(q)s") if exact else sql.SQL(
            "v.vec::vector({}) <=> %(q)s::vector({})").format(sql.Literal(dim), sql.Literal(dim))
        statement = sql.SQL(
            "SELECT v.node_id, {distance} AS d FROM vectors v"
            "{join} WHERE v.repo = {repo}{kind} ORDER BY {distance}{tie} LIMIT %(k)s"
        ).format(
            distance=distance,
            join=sql.SQL("" if kinds is None and not exact else
                         " JOIN nodes n ON n.id = v.node_id"),
            repo=sql.Literal(repo),
            kind=sql.SQL("" if kinds is None else " AND n.type = ANY(%(kinds)s)"),
            tie=sql.SQL(", n.rowid" if exact else ""),
        )
        results = []
        async with self._pg.connection() as conn:
            for probe in probes:
                cur = await conn.execute(statement, {"q": _array(probe), "kinds": kinds, "k": k})
                # A zero vector has no direction: its distance is NaN, and it is never near.
                distances = [(str(i), float(d)) for i, d in await cur.fetchall()
                             if isinstance(d, float)]
                rows = [(i, 1.0 - d) for i, d in distances if math.isfinite(d)]
                # An iterative HNSW scan returns rows in roughly distance order.
                results.append(rows if exact else sorted(rows, key=lambda r: -r[1]))
        return results

    # ---- maintenance (the caller holds the repo's lock) -----------------------------------

    async def unconsolidated(self, repo: str) -> set[str]:
        async with self._pg.connection() as conn:
            return await maintenance.unconsolidated(conn, repo)

    async def merge_duplicates(
        self, repo: str, pairs: list[tuple[str, str]], examined: list[str]
    ) -> MergeResult:
        async with self._pg.transaction() as conn:
            result = await maintenance.merge_duplicates(conn, repo, pairs, examined)
        self._forget(repo, result.deleted)
        return result

    async def decay_sweep(self, repo: str, config: Config, *, now: datetime) -> SweepResult:
        async with self._pg.transaction() as conn:
            swept = await maintenance.decay_sweep(conn, repo, config, now)
        self._forget(repo, [*swept.doomed, *swept.pruned])
        return swept

    async def validate(self, repo: str, dim: int) -> ValidationReport:
        async with self._pg.transaction() as conn:
            return await maintenance.validate(conn, repo, dim)

    async def settle(self, repo: str) -> None:
        """Nothing to wait for: pgvector's index is written with the rows."""

    async def aclose(self) -> None:
        """Nothing to stop: the connections belong to the backend."""

    # ---- helpers --------------------------------------------------------------------------

    async def _ensure_index(self, repo: str) -> None:
        if repo not in self._indexed:
            async with self._pg.connection() as conn:
                await schema.ensure_vector_index(conn, repo, self._dims(repo))
            self._indexed.add(repo)

    async def _size(self, repo: str) -> int:
        if repo not in self._sizes:
            row = await self._one("SELECT count(*) FROM vectors WHERE repo = %s", (repo,))
            self._sizes[repo] = int(row[0]) if row else 0
        return self._sizes[repo]

    async def _routes_of(self, repo: str) -> VectorIndex:
        index = self._routes.get(repo)
        if index is not None:
            return index
        async with self._routes_loading.setdefault(repo, anyio.Lock()):
            index = self._routes.get(repo)
            if index is None:
                index = VectorIndex(self._dims(repo))
                ids, types, matrix = await self._load(repo, [t.value for t in _ROUTES])
                index.add(ids, types, matrix)
                self._routes[repo] = index
        return index

    async def _load(
        self, repo: str, kinds: list[str]
    ) -> tuple[list[str], list[NodeType], Vector]:
        rows = await self._all(
            "SELECT v.node_id, n.type, v.vec FROM vectors v JOIN nodes n ON n.id = v.node_id"
            " WHERE v.repo = %s AND n.type = ANY(%s) ORDER BY n.rowid",
            (repo, kinds), binary=True,
        )
        dim = self._dims(repo)
        matrix = np.zeros((len(rows), dim), dtype=np.float32)
        for i, (_, _, vec) in enumerate(rows):
            matrix[i] = vec
        return [str(r[0]) for r in rows], [NodeType(r[1]) for r in rows], matrix

    async def _all(
        self, statement: Any, params: Any = None, *, binary: bool = False
    ) -> list[tuple[Any, ...]]:
        async with self._pg.connection() as conn, conn.cursor(binary=binary) as cur:
            await cur.execute(statement, params)
            return await cur.fetchall()

    async def _one(self, statement: Any, params: Any = None) -> tuple[Any, ...] | None:
        rows = await self._all(statement, params)
        return rows[0] if rows else None


def _kinds(types: Iterable[NodeType]) -> list[str]:
    return [NodeType(t).value for t in types]


def _array(vector: Vector) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.asarray(vector, dtype=np.float32).reshape(-1)


def _node(row: tuple[Any, ...]) -> Node:
    node_id, kind, text, data, created_at = row
    return Node(str(node_id), NodeType(kind), str(text), dict(data), created_at)


def _receipt(value: Any) -> CommitReceipt:
    # jsonb comes back parsed; a receipt written as a JSON string is a jsonb string.
    if isinstance(value, str):
        return CommitReceipt.from_json(value)
    return CommitReceipt(value["changeset_id"], value["repo"], list(value["node_ids"]))


def _top(scores: Vector, ids: list[str], k: int) -> list[list[tuple[str, float]]]:
    k = min(k, len(ids))
    result = []
    for row in scores:
        top = np.argpartition(-row, k - 1)[:k] if k < len(ids) else np.arange(len(ids))
        top = top[np.argsort(-row[top], kind="stable")]
        result.append([(ids[i], float(row[i])) for i in top])
    return result
