"""`SqliteRecallReads`: the reads of a recall on SQLite (`SqliteGraph` inherits them): the words
search, the hops' links, the best candidates' nodes and links, access stats and the access
counts' write, each one call on the connection's thread (where the nodes and links are built,
off the event loop).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.errors import StorageError
from mnemo.graph.model import LinkType, NodeType, Vector
from mnemo.graph.ports import More, Neighbor, NodeContext, PendingRead, TypedLink
from mnemo.graph.scope import Scope, Where
from mnemo.storage.graph_base import GraphBase
from mnemo.storage.lexical import LexicalIndex
from mnemo.storage.sqlite import recall_reads
from mnemo.storage.sqlite.database import Database, chunks, side_write
from mnemo.storage.sqlite.vectors import SqliteVectors
from mnemo.storage.worker import DeferredRead, FallbackRead

log = logging.getLogger("mnemo")


class SqliteRecallReads(GraphBase):
    """Recall's reads of a `SqliteGraph` (its database, vectors and lexical index)."""

    _database: Database
    _vectors: SqliteVectors
    _lexical: LexicalIndex | None

    async def neighbors(
        self, repo: str, node_ids: Sequence[str], link_type: LinkType | None = None
    ) -> list[Neighbor]:
        """Every link touching these nodes, seen from each of them, in either direction."""
        if not node_ids:
            return []
        ids = list(dict.fromkeys(node_ids))

        return await self._database.run(
            lambda db: recall_reads.neighbors(db, repo, ids, link_type)
        )

    async def _context(self, repo: str, node_ids: Sequence[str], kinds: list[NodeType],
                       link_type: LinkType, then: More | None) -> NodeContext:
        # The vectors are in memory: no read, and `then` sees the first read's with its nodes.
        vectors = await self._vectors.of_nodes(repo, node_ids)
        asked: list[Sequence[str]] = []

        def more(first: NodeContext) -> tuple[Sequence[str], Iterable[NodeType]]:
            assert then is not None
            first.vectors.update(vectors)
            found, found_linked = then(first)
            asked.append(found)
            return found, found_linked

        context = await self._database.run(lambda db: recall_reads.node_context(
            db, repo, node_ids, kinds, link_type, None if then is None else more))
        context.vectors.update(vectors)
        if asked and asked[0]:
            context.vectors.update(await self._vectors.of_nodes(repo, asked[0]))
        return context

    async def _rows(self, statement: str, params: list[object]) -> list[Any]:
        return await self._database.run(lambda db: db.conn.execute(statement, params).fetchall())

    async def _store_text(
        self, repo: str, query: str, limit: int, kinds: list[str] | None, where: Where
    ) -> list[tuple[str, float]]:
        return await self._database.run(
            lambda db: recall_reads.fts_search(db, repo, query, kinds, limit, where))

    def start_search_text(
        self, repo: str, query: str, limit: int, types: Iterable[NodeType] | None = None,
        scope: Scope | None = None,
    ) -> PendingRead[list[tuple[str, float]]]:
        """`search_text` begun now: on the lexical index's thread, or on the connection's
        (FTS5) when there is no index; FTS5 when the index cannot answer is asked then.
        Inside a `scope`, read when the answer is awaited (`ScopeReads.scoped_text`)."""
        kinds = None if types is None else [NodeType(t).value for t in types]
        if scope is not None:
            return DeferredRead(lambda: self.scoped_text(
                repo, query, limit, kinds, scope,
                lambda n: self.start_search_text(repo, query, n, types).result()))

        def fts(db: SqliteUtilsDatabase) -> list[tuple[str, float]]:
            return recall_reads.fts_search(db, repo, query, kinds, limit)

        if self._lexical is None:
            return self._database.start(fts)
        return FallbackRead(self._lexical.start_search(repo, query, limit, kinds),
                      lambda: self._database.run(fts))

    async def access_stats(
        self, repo: str, node_ids: Sequence[str]
    ) -> dict[str, tuple[int, datetime | None]]:
        """How often and when last each node was recalled."""
        ids = list(dict.fromkeys(node_ids))

        def read(db: SqliteUtilsDatabase) -> dict[str, tuple[int, datetime | None]]:
            stats: dict[str, tuple[int, datetime | None]] = {}
            for chunk in chunks(ids, 500):
                marks = ",".join("?" * len(chunk))
                for node_id, count, last in db.conn.execute(
                    f"SELECT id, access_count, last_access FROM nodes WHERE repo = ?"
                    f" AND id IN ({marks})",
                    [repo, *chunk],
                ):
                    stats[node_id] = (count, datetime.fromisoformat(last) if last else None)
            return stats

        return await self._database.run(read) if ids else {}

    async def reinforce(self, repo: str, node_ids: Sequence[str], when: datetime) -> None:
        """Counts one more access of each node, at `when`: queued on the connection's thread,
        not waited for (`Database.post`). Every later call of this store runs after it and
        sees the counts; a refusal (another writer's lock held past `SIDE_WRITE_WAIT`) is
        logged and costs these counts.

        Raises:
            StorageError: "closed", the store is closed.
        """
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return
        stamp = when.isoformat()

        def write(db: SqliteUtilsDatabase) -> None:
            with side_write(db):
                # One statement a chunk, not one a node: each statement gives the GIL up and
                # takes it back, and this runs while a recall's Python holds it (15
                # statements cost three times what one does beside a recall).
                for chunk in chunks(ids, 400):
                    db.conn.execute(
                        "UPDATE nodes SET access_count = access_count + 1, last_access = ?"
                        f" WHERE repo = ? AND id IN ({','.join('?' * len(chunk))})",
                        [stamp, repo, *chunk],
                    )

        def refused(exc: StorageError) -> None:
            log.warning("the access counts of %d nodes in %s were not written: %r",
                        len(ids), repo, exc)

        self._database.post(write, refused)

    async def typed_links(
        self, repo: str, node_ids: Sequence[str]
    ) -> list[tuple[str, NodeType, str, NodeType, LinkType]]:
        """Every link touching these nodes, seen from each: (origin, its type, the node at the
        other end, its type, link type), in one query (what a recall hop needs)."""
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return []
        return await self._database.run(lambda db: recall_reads.typed_links(db, repo, ids))

    async def _links_near(self, repo: str, node_ids: Sequence[str], vector: Vector
                          ) -> tuple[list[TypedLink], dict[str, float]]:
        links = await self.typed_links(repo, node_ids)
        # The vectors are in memory: the cosines cost no second read.
        targets = [target for _, _, target, _, _ in links]
        return links, await self._vectors.similarities(repo, targets, vector)
