"""`PgGraph`: the `GraphStore` port over PostgreSQL and pgvector. Commits to a repo are
serialised by an in-process lock, then a session advisory lock (across processes); each is one
transaction recorded in `applied_changesets` with its side writes. Recall's batched reads
are one round trip each: a candidate set's nodes, stats and links (`_context`), and a hop's
typed links with their far ends' cosine to the query (`_links_near`)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from pathlib import Path

import anyio
import anyio.to_thread

from mnemo import cpu
from mnemo.errors import ConflictError
from mnemo.graph.commit import CommitPlan
from mnemo.graph.model import LINK_TYPES, NODE_TYPES, LinkType, Node, NodeId, NodeType, Vector
from mnemo.graph.ports import More, Neighbor, NodeContext, TypedLink
from mnemo.graph.scope import Where
from mnemo.storage import graph_base as scopes
from mnemo.storage.graph_base import joined, neighbors_seen_from_asked, seen_from_asked
from mnemo.storage.graph_rows import NODE_COLUMNS, NODE_WIDTH
from mnemo.storage.graph_writes import SqlGraphWrites
from mnemo.storage.lexical.index import LexicalIndex
from mnemo.storage.maintenance import MaintainedGraph, SqlMaintenance
from mnemo.storage.postgres.connection import (
    Connection,
    PgDialect,
    Postgres,
    as_array,
    lock_key,
    rows_of,
)
from mnemo.storage.postgres.schema import vector_index_name
from mnemo.storage.postgres.sessions import PgSessions
from mnemo.storage.postgres.text_search import SEARCH_VECTOR, WORD_QUERY
from mnemo.storage.postgres.vectors import EXACT_BELOW, OF_NODES, PgVectors, unit_rows
from mnemo.storage.reembeds import ReembeddedGraph, SqlReembeds
from mnemo.storage.row import ON_LOOP_NODES, Row
from mnemo.storage.sql import Statements, number
from mnemo.text import query_words


def node(row: Row) -> Node:
    node_id, kind, text, data, created_at, start, end, recorded, retired, metadata = (
        row[:NODE_WIDTH])
    return Node(NodeId(str(node_id)), NODE_TYPES[kind], str(text), dict(data), created_at, start,
                end, recorded, retired, dict(metadata or {}))


class PgReembeds(PgDialect, SqlReembeds):
    OF_REPO = "repo = ?"
    STAGED = "s.node_id = n.id"
    STAGE = (
        "INSERT INTO staged_vectors (node_id, repo, vec) SELECT id, repo, ? FROM nodes"
        " WHERE rowid = ? AND id = ? ON CONFLICT (node_id) DO UPDATE SET vec = excluded.vec"
    )
    UNSTAGE_LOGGED = (
        "DELETE FROM staged_vectors s USING nodes n WHERE s.node_id = n.id AND n.rowid IN"
        " (SELECT node FROM lexical_log WHERE repo = ? AND seq > ? AND seq <= ?)"
    )
    VECTOR_COLUMNS = "node_id, repo, vec"


class PgGraphWrites(PgDialect, SqlGraphWrites):
    KEY = "id"
    LINK = "src = ? AND dst = ? AND type = ?"
    ADD_LINK = (
        "INSERT INTO links(src, dst, type, repo) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (src, dst, type) DO UPDATE SET refs = links.refs + 1"
    )
    LINK_PARAMS = 4
    ADD_VECTOR = (
        "INSERT INTO vectors(node_id, repo, vec) SELECT id, repo, ? FROM nodes WHERE id = ?"
        " ON CONFLICT DO NOTHING"
    )
    VECTOR_OF = "node_id = ?"
    SET_INTENT = "jsonb_set(data, '{intent}', to_jsonb(?::text))"
    ZEROS = "decode(repeat('00', length(subgoal_vec)), 'hex')"
    SCRUB = ("UPDATE lexical_epoch SET epoch = md5(random()::text || clock_timestamp()::text)",)
    SESSIONS = PgSessions


class PgMaintenance(SqlMaintenance, PgGraphWrites):
    LINKS = "links(repo, src, dst, type)"
    FALSE, TRUE = "false", "true"
    HAS_VECTOR = "v.node_id = n.id"
    DANGLING = (
        "repo = ? AND (NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = links.src)"
        " OR NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = links.dst))"
    )
    FIELD = "{}data -> '{}'"
    REPO = "{}.repo, "

    async def _bad_vectors(self, sql: Statements, repo: str, dim: int) -> int:
        return await number(
            sql, "SELECT count(*) FROM vectors WHERE repo = ? AND vector_dims(vec) <> ?", repo, dim)

    async def _search_rebuilt(self, sql: Statements, repo: str) -> bool:
        # A generated column disagrees only after a configuration change; an UPDATE recomputes.
        return bool(await sql.run(
            "UPDATE nodes SET text = text WHERE repo = ?"
            f" AND search IS DISTINCT FROM {SEARCH_VECTOR}", (repo,),
        ))


class PgGraph(ReembeddedGraph, MaintainedGraph):
    MAINTENANCE = PgMaintenance()
    REEMBEDS = PgReembeds()
    WRITES = PgGraphWrites()
    _vectors: PgVectors

    def __init__(
        self,
        pg: Postgres,
        dims: Callable[[str], int],
        *,
        exact_below: int = EXACT_BELOW,
        lexical: LexicalIndex | None = None,
        ann_dir: Path | None = None,
    ) -> None:
        super().__init__(pg, dims, lexical)
        self._pg = pg
        # At most half the pool holds repo locks, leaving connections for the work.
        self._lock_slots = anyio.CapacityLimiter(max(1, pg.max_size // 2))
        self._vectors = PgVectors(pg, dims, exact_below=exact_below, ann_dir=ann_dir)

    @asynccontextmanager
    async def _advisory(self, name: str, busy: Exception | None) -> AsyncIterator[None]:
        """The advisory lock `name` held on a connection of its own for the block: waited for
        (`StorageError("busy")` past the busy timeout), or with `busy`, tried once (`busy`
        raised when another holds it)."""
        async with self._pg.connection() as conn:
            key = lock_key(name)
            if busy is None:
                await conn.execute("SELECT pg_advisory_lock(%s)", (key,))
            else:
                cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (key,))
                row = await cur.fetchone()
                if row is None or row[0] is not True:
                    raise busy
            try:
                yield
            finally:
                # Shielded: a cancelled block must not hand a locked connection to the pool.
                with anyio.CancelScope(shield=True):
                    await conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

    @asynccontextmanager
    async def _repo_lock(self, repo: str) -> AsyncIterator[None]:
        async with self._lock_slots, self._advisory("mnemo.repo:" + repo, None):
            yield

    def _reembed_lock(self, repo: str, busy: ConflictError
                      ) -> AbstractAsyncContextManager[None]:
        return self._advisory("mnemo.reembed:" + repo, busy)

    async def switch_vectors(self, repo: str) -> tuple[int, int]:
        # The index's cast to the old dimension would refuse the new vectors (rebuilt after).
        await self._pg.write(
            lambda sql: sql.run(f'DROP INDEX IF EXISTS "{vector_index_name(repo)}"')
        )
        return await super().switch_vectors(repo)

    async def vectors_switched(self, repo: str, dim: int) -> None:
        await self._vectors.switched(repo, dim)

    async def _committed(self, plan: CommitPlan) -> None:
        await self._vectors.committed(plan.repo, len(plan.nodes))

    _node = staticmethod(node)

    async def neighbors(
        self, repo: str, node_ids: Sequence[str], link_type: LinkType | None = None
    ) -> list[Neighbor]:
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return []
        kind = "" if link_type is None else " AND type = %(kind)s"
        rows = await self._pg.fetch_all(
            f"SELECT src, dst, type FROM links WHERE repo = %(repo)s AND src = ANY(%(ids)s){kind}"
            f" UNION ALL SELECT src, dst, type FROM links WHERE repo = %(repo)s"
            f" AND dst = ANY(%(ids)s){kind}",
            {"repo": repo, "ids": ids, "kind": None if link_type is None else link_type.value},
        )
        return list(dict.fromkeys(neighbors_seen_from_asked(rows, set(ids))))

    async def _context(self, repo: str, node_ids: Sequence[str], linked: list[NodeType],
                       link_type: LinkType, then: More | None) -> NodeContext:
        async with self._pg.connection() as conn:  # `then`'s nodes on the same connection
            first = await _node_context(conn, repo, node_ids, linked, link_type)
            more, more_linked = ((), ()) if then is None else then(first)
            if not more:
                return first
            return joined(first, await _node_context(conn, repo, more, more_linked, link_type))

    async def _links_near(self, repo: str, node_ids: Sequence[str], vector: Vector
                          ) -> tuple[list[TypedLink], dict[str, float]]:
        ids = list(dict.fromkeys(node_ids))
        rows = await self._pg.fetch_all(_HOP, {"repo": repo, "ids": ids, "q": as_array(vector)})
        return await cpu.run(lambda: hop_links(rows), len(ids), on_loop_below=ON_LOOP_NODES + 1)

    async def typed_links(self, repo: str, node_ids: Sequence[str]) -> list[TypedLink]:
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return []
        rows = await self._pg.fetch_all(
            "SELECT l.src, a.type, l.dst, b.type, l.type FROM links l"
            " JOIN nodes a ON a.id = l.src JOIN nodes b ON b.id = l.dst"
            " WHERE l.repo = %(repo)s AND (l.src = ANY(%(ids)s) OR l.dst = ANY(%(ids)s))",
            {"repo": repo, "ids": ids},
        )
        return seen_from_asked(rows, set(ids))

    async def reinforce(self, repo: str, node_ids: Sequence[str], when: datetime) -> None:
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return
        # A read's side write skips locked nodes; NO KEY UPDATE, as FOR UPDATE would also
        # skip nodes a commit in flight links to.
        await self._driver.one(lambda sql: sql.run(
            "UPDATE nodes SET access_count = access_count + 1, last_access = ?"
            " WHERE id IN (SELECT id FROM nodes WHERE repo = ? AND id = ANY(?)"
            " FOR NO KEY UPDATE SKIP LOCKED)", (when, repo, ids)))

    async def _store_text(
        self, repo: str, query: str, limit: int, kinds: list[str] | None,
        where: Where | None = None,
    ) -> list[tuple[str, float]]:
        # Longer queries have their words read in a worker thread.
        words = (query_words(query) if len(query) <= 2_000
                 else await anyio.to_thread.run_sync(query_words, query))
        if not words or limit <= 0:
            return []
        scoped, inside = ("", []) if where is None else scopes.exists(repo, where, "n.rowid", 0)
        rows = await self._rows(
            f"SELECT id, ts_rank_cd(search, q) AS score FROM nodes n, (SELECT"
            f" {' || '.join(WORD_QUERY for _ in words)}) AS query(q) WHERE repo = ? AND search @@ q"
            f"{'' if kinds is None else ' AND type = ANY(?)'}{scoped} ORDER BY score DESC, rowid"
            " LIMIT ?", [*words, repo, *([] if kinds is None else [kinds]), *inside, limit])
        return [(str(i), float(score)) for i, score in rows]


_NODES = (
    f"SELECT {NODE_COLUMNS}, access_count, last_access FROM nodes"
    " WHERE repo = %(repo)s AND id = ANY(%(ids)s)"
)
# Seen from the end whose type was asked for: side 0 from `src`, side 1 from `dst`.
_LINKS = (
    "SELECT 0, l.src, l.dst FROM links l JOIN nodes n ON n.id = l.src"
    " WHERE l.repo = %(repo)s AND l.src = ANY(%(ids)s) AND l.type = %(link)s"
    " AND n.type = ANY(%(kinds)s)"
    " UNION ALL SELECT 1, l.src, l.dst FROM links l JOIN nodes n ON n.id = l.dst"
    " WHERE l.repo = %(repo)s AND l.dst = ANY(%(ids)s) AND l.type = %(link)s"
    " AND n.type = ANY(%(kinds)s)"
)


async def _node_context(
    conn: Connection, repo: str, node_ids: Sequence[str], linked: Iterable[NodeType],
    link_type: LinkType,
) -> NodeContext:
    ids = list(dict.fromkeys(node_ids))
    params = {"repo": repo, "ids": ids, "link": link_type.value,
              "kinds": sorted(NodeType(t).value for t in linked)}
    async with conn.pipeline():
        nodes = await conn.execute(_NODES, params)
        links = await conn.execute(_LINKS, params)
        vectors = await conn.execute(OF_NODES, params, binary=True)
        node_rows = await rows_of(nodes)
        link_rows = await rows_of(links)
        vector_rows = await rows_of(vectors)

    def built() -> NodeContext:
        found = {str(row[0]): node(row) for row in node_rows}
        stats = {str(row[0]): (int(row[NODE_WIDTH]), row[NODE_WIDTH + 1]) for row in node_rows}
        seen = [
            Neighbor(str(src), str(dst), link_type) if side == 0
            else Neighbor(str(dst), str(src), link_type)
            for side, src, dst in link_rows
        ]
        return NodeContext([found[i] for i in ids if i in found], stats,
                           list(dict.fromkeys(seen)), unit_rows(vector_rows))

    return await cpu.run(built, len(node_rows), on_loop_below=ON_LOOP_NODES + 1)


# `_LINKS` with the other end's cosine to the query (NULL without a vector).
_HOP = (
    "SELECT 0, l.src, a.type, l.dst, b.type, l.type, 1 - (v.vec <=> %(q)s) FROM links l"
    " JOIN nodes a ON a.id = l.src JOIN nodes b ON b.id = l.dst"
    " LEFT JOIN vectors v ON v.node_id = l.dst"
    " WHERE l.repo = %(repo)s AND l.src = ANY(%(ids)s)"
    " UNION ALL SELECT 1, l.src, a.type, l.dst, b.type, l.type, 1 - (v.vec <=> %(q)s)"
    " FROM links l JOIN nodes a ON a.id = l.src JOIN nodes b ON b.id = l.dst"
    " LEFT JOIN vectors v ON v.node_id = l.src"
    " WHERE l.repo = %(repo)s AND l.dst = ANY(%(ids)s)"
)


def hop_links(rows: list[Row]) -> tuple[list[TypedLink], dict[str, float]]:
    """A hop's rows (`_HOP`) as links seen from the end asked for, and the cosines."""
    links: list[TypedLink] = []
    similarity: dict[str, float] = {}
    for side, src, src_type, dst, dst_type, kind, cosine in rows:
        if side:  # seen from `dst`
            src, src_type, dst, dst_type = dst, dst_type, src, src_type
        links.append(
            (str(src), NODE_TYPES[src_type], str(dst), NODE_TYPES[dst_type], LINK_TYPES[kind]))
        if isinstance(cosine, float) and math.isfinite(cosine):
            similarity[str(dst)] = cosine
    return links, similarity
