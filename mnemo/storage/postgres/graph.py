"""`PgGraph`: the `GraphStore` port over PostgreSQL and pgvector. Commits to a repo are
serialised by an in-process lock, then a session advisory lock (across processes); each is one
transaction recorded in `applied_changesets` with its side writes."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from psycopg import sql
from psycopg.types.json import Jsonb

from mnemo.graph import erasure, model
from mnemo.graph.commit import CommitPlan
from mnemo.graph.erasure import Inherited
from mnemo.graph.model import CommitReceipt, Link, LinkType, NodeType, Vector
from mnemo.graph.ports import (
    More,
    Neighbor,
    NodeContext,
    PendingRead,
    Reverting,
    SideWrite,
    TypedLink,
)
from mnemo.graph.scope import Scope, Where, pairs
from mnemo.storage import graph_base as scopes
from mnemo.storage.graph_base import neighbors_seen_from_asked, seen_from_asked
from mnemo.storage.lexical import LexicalIndex
from mnemo.storage.maintenance import MaintainedGraph
from mnemo.storage.postgres import deletes, history, recall_reads
from mnemo.storage.postgres.connection import Postgres
from mnemo.storage.postgres.maintenance import PgMaintenance
from mnemo.storage.postgres.reembedding import PgReembedding
from mnemo.storage.postgres.rows import node as node_of
from mnemo.storage.postgres.sessions import side_writes
from mnemo.storage.postgres.text_search import WORD_QUERY
from mnemo.storage.postgres.vectors import EXACT_BELOW, PgVectors, as_array, kind_values
from mnemo.storage.row import Column
from mnemo.storage.worker import DeferredRead, FallbackRead
from mnemo.text import query_words

# Longer queries have their words read in a worker thread.
_INLINE_CHARS = 2_000


def repo_lock_key(repo: str) -> int:
    """The advisory-lock key of a repo's commits: 64 bits of a digest of its name."""
    digest = hashlib.sha256(b"mnemo.repo:" + repo.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PgGraph(PgReembedding, MaintainedGraph):
    """`GraphStore` over a PostgreSQL database."""

    MAINTENANCE = PgMaintenance()

    def __init__(
        self,
        pg: Postgres,
        dims: Callable[[str], int],
        *,
        exact_below: int = EXACT_BELOW,
        lexical: LexicalIndex | None = None,
        ann_dir: Path | None = None,
    ) -> None:
        self._pg = self._driver = pg
        self._dims = dims
        self._lexical = lexical
        self._locks: dict[str, anyio.Lock] = {}
        self._reembeds = set()
        # At most half the pool holds repo locks, leaving connections for the work.
        self._lock_slots = anyio.CapacityLimiter(max(1, pg.max_size // 2))
        self._vectors = PgVectors(pg, dims, exact_below=exact_below, ann_dir=ann_dir)

    @asynccontextmanager
    async def _repo_lock(self, repo: str) -> AsyncIterator[None]:
        """This process's lock, then the advisory lock (`StorageError("busy")` past the busy
        timeout)."""
        async with (
            self._locks.setdefault(repo, anyio.Lock()),
            self._lock_slots,
            self._pg.connection() as conn,
        ):
            key = repo_lock_key(repo)
            await conn.execute("SELECT pg_advisory_lock(%s)", (key,))
            try:
                yield
            finally:
                # Shielded: a cancelled block must not hand a locked connection to the pool.
                with anyio.CancelScope(shield=True):
                    await conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

    # ---- commits --------------------------------------------------------------------------

    async def write_commit(self, plan: CommitPlan, also: Sequence[SideWrite]) -> None:
        repo, created = plan.repo, datetime.fromisoformat(plan.created_at)
        scoped = Jsonb(plan.metadata) if plan.metadata else None
        async with self._pg.transaction() as conn, conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO nodes (id, repo, type, text, data, key, source_id, created_at,"
                " recorded_at, valid_from, metadata) VALUES (%s, %s, %s, %s, %s, %s, %s, %s,"
                " %s::timestamptz, %s::timestamptz, %s) ON CONFLICT DO NOTHING",
                [(n.id, repo, n.type.value, text, Jsonb(n.data), n.key, n.source_id, created,
                  *model.times(n, plan.created_at), scoped)
                 for n, text, _ in plan.nodes],
            )
            if plan.metadata and plan.nodes:
                await cur.execute(
                    "INSERT INTO node_scopes (repo, key, value, node)"
                    " SELECT %s, p.key, p.value, n.rowid FROM nodes n,"
                    " unnest(%s::text[], %s::text[]) AS p(key, value)"
                    " WHERE n.id = ANY(%s) ON CONFLICT DO NOTHING",
                    (repo, *map(list, zip(*pairs(plan.metadata), strict=True)),
                     [n.id for n, _, _ in plan.nodes]),
                )
            await cur.executemany(
                "INSERT INTO vectors (node_id, repo, vec) VALUES (%s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                [(n.id, repo, as_array(vector)) for n, _, vector in plan.nodes],
            )
            await history.joined(conn, plan)  # before the rewordings
            for node_id, (text, vector) in plan.rewordings.items():
                await cur.execute("UPDATE nodes SET text = %s WHERE id = %s", (text, node_id))
                await cur.execute(
                    "UPDATE vectors SET vec = %s WHERE node_id = %s", (as_array(vector), node_id)
                )
            await history.add_links(conn, repo, plan.links)
            await cur.execute(
                "INSERT INTO applied_changesets (id, repo, receipt, applied_at)"
                " VALUES (%s, %s, %s, %s)",
                (plan.changeset_id, repo, plan.receipt.to_json(), created),
            )
            await history.record(conn, plan)
            await side_writes(conn, also)
        self._vectors.added(repo, len(plan.nodes))
        await self._vectors.index_if_large(repo)

    async def write_side(self, also: Sequence[SideWrite]) -> None:
        async with self._pg.transaction() as conn:
            await side_writes(conn, also)

    @staticmethod
    def _ids(value: Any) -> list[Any]:
        return list(value)
    _node = staticmethod(node_of)

    @staticmethod
    def _receipt(value: Any) -> CommitReceipt:
        # jsonb comes back parsed; a receipt written as a JSON string is a jsonb string.
        if isinstance(value, str):
            return CommitReceipt.from_json(value)
        return CommitReceipt(value["changeset_id"], value["repo"], list(value["node_ids"]))

    # ---- reads ----------------------------------------------------------------------------

    async def neighbors(
        self, repo: str, node_ids: Sequence[str], link_type: LinkType | None = None
    ) -> list[Neighbor]:
        """Every link touching these nodes, seen from each of them, in either direction."""
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
        return await recall_reads.node_context(self._pg, repo, node_ids, linked, link_type, then)

    async def _links_near(self, repo: str, node_ids: Sequence[str], vector: Vector
                          ) -> tuple[list[TypedLink], dict[str, float]]:
        return await recall_reads.typed_links_near(self._pg, repo, node_ids, vector)

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

    async def links(self, repo: str) -> list[Link]:
        rows = await self._pg.fetch_all(
            "SELECT src, dst, type FROM links WHERE repo = %s ORDER BY type, src, dst", (repo,)
        )
        return [Link(src, dst, LinkType(kind)) for src, dst, kind in rows]

    async def access_stats(
        self, repo: str, node_ids: Sequence[str]
    ) -> dict[str, tuple[int, datetime | None]]:
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return {}
        rows = await self._pg.fetch_all(
            "SELECT id, access_count, last_access FROM nodes WHERE repo = %s AND id = ANY(%s)",
            (repo, ids),
        )
        return {str(i): (int(count), last) for i, count, last in rows}

    async def reinforce(self, repo: str, node_ids: Sequence[str], when: datetime) -> None:
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return
        # A read's side write skips locked nodes; NO KEY UPDATE, as FOR UPDATE would also
        # skip nodes a commit in flight links to.
        async with self._pg.connection() as conn:
            await conn.execute(
                "UPDATE nodes SET access_count = access_count + 1, last_access = %s"
                " WHERE id IN (SELECT id FROM nodes WHERE repo = %s AND id = ANY(%s)"
                " FOR NO KEY UPDATE SKIP LOCKED)",
                (when, repo, ids),
            )

    # ---- deletes --------------------------------------------------------------------------

    async def _delete_rows(self, repo: str, ids: list[str]) -> list[str]:
        async with self._pg.transaction() as conn:
            cur = await conn.execute(
                "DELETE FROM nodes WHERE repo = %s AND id = ANY(%s) RETURNING id", (repo, ids))
            gone = [str(i) for (i,) in await cur.fetchall()]
            if gone:
                await deletes.new_epoch(conn)
        return gone

    async def _inherited(self, repo: str, key: str, one: bool) -> Inherited:
        async with self._pg.connection() as conn:
            return await deletes.inherited(conn, repo, key, one=one)

    async def _withdraw_rows(self, repo: str, key: str, also: Sequence[SideWrite],
                             plan: erasure.Plan, reverting: Reverting | None) -> list[str]:
        async with self._pg.transaction() as conn:
            return await deletes.withdraw(
                conn, repo, key, also, plan, None if reverting is None else reverting.revert_id)

    # ---- search ---------------------------------------------------------------------------

    def start_search_text(
        self, repo: str, query: str, limit: int, types: Iterable[NodeType] | None = None,
        scope: Scope | None = None,
    ) -> PendingRead[list[tuple[str, float]]]:
        """`search_text` begun now on the lexical index's thread; PostgreSQL's own search (and
        a scoped one) runs when the answer is awaited."""
        kinds = None if types is None else kind_values(types)
        if scope is not None:
            return DeferredRead(lambda: self.scoped_text(
                repo, query, limit, kinds, scope,
                lambda n: self.start_search_text(repo, query, n, types).result()))
        if self._lexical is None:
            return DeferredRead(lambda: self._store_text(repo, query, limit, kinds))
        return FallbackRead(self._lexical.start_search(repo, query, limit, kinds),
                      lambda: self._store_text(repo, query, limit, kinds))

    async def _rows(self, statement: str, params: list[object]) -> list[Any]:
        return await self._pg.fetch_all(statement.replace("?", "%s"), params)

    async def _store_text(
        self, repo: str, query: str, limit: int, kinds: list[str] | None,
        where: Where | None = None,
    ) -> list[tuple[str, float]]:
        """PostgreSQL's full-text search (see `search_text`), inside `where` when given."""
        words = (query_words(query) if len(query) <= _INLINE_CHARS
                 else await anyio.to_thread.run_sync(query_words, query))
        if not words or limit <= 0:
            return []
        tsquery = sql.SQL(" || ".join(WORD_QUERY for _ in words))
        scoped, inside = ("", []) if where is None else scopes.exists(repo, where, "n.rowid", 0)
        statement = sql.SQL(
            "SELECT id, ts_rank_cd(search, q) AS score FROM nodes n, (SELECT {}) AS query(q)"
            " WHERE repo = %s AND search @@ q{}{} ORDER BY score DESC, rowid LIMIT %s"
        ).format(tsquery, sql.SQL("" if kinds is None else " AND type = ANY(%s)"),
                 sql.SQL(scoped.replace("?", "%s")))
        params: list[Column] = [*words, repo, *([] if kinds is None else [kinds]),
                                *inside, limit]
        rows = await self._pg.fetch_all(statement, params)
        return [(str(i), float(score)) for i, score in rows]
