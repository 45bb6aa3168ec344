"""`SqliteGraph`: the `GraphStore` port over SQLite. Commits to a repo are serialised by a
per-repo lock (across processes too); each is one transaction recorded in `applied_changesets`
with its side writes. Recall's batched reads (`read_*`, `fts_search`) are each one call on the
database's worker thread (each call is a thread hop, which a recall of a small store pays more
for than for its queries)."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import filelock
from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.errors import ConflictError, StorageError
from mnemo.graph import ann, ann_files
from mnemo.graph.commit import CommitPlan
from mnemo.graph.model import LinkType, Node, NodeType, Vector
from mnemo.graph.ports import More, Neighbor, NodeContext, PendingRead, TypedLink
from mnemo.graph.scope import Where
from mnemo.storage import graph_base as scopes
from mnemo.storage.graph_base import joined, neighbors_seen_from_asked, seen_from_asked
from mnemo.storage.graph_rows import NODE_COLUMNS, NODE_WIDTH
from mnemo.storage.graph_writes import SqlGraphWrites
from mnemo.storage.lexical.index import LexicalIndex
from mnemo.storage.maintenance import MaintainedGraph, SqlMaintenance
from mnemo.storage.reembeds import ReembeddedGraph, SqlReembeds
from mnemo.storage.row import loads
from mnemo.storage.sessions import SqlSessions
from mnemo.storage.sql import Statements, chunks, marks, number
from mnemo.storage.sqlite.database import Database, side_write
from mnemo.storage.sqlite.rows import half_blob, node, pack_text, unpack_text
from mnemo.storage.sqlite.vectors import SqliteVectors
from mnemo.text import query_words

log = logging.getLogger("mnemo")


class SqliteSessions(SqlSessions):
    """The `SessionStore` port over SQLite (times as UTC ISO-8601 text, JSON as text, a list
    parameter a JSON array read by `json_each`)."""

    # The host's wall clock, in milliseconds, written as `_stamp` writes a time.
    NOW = "strftime('%Y-%m-%dT%H:%M:%f000+00:00', 'now')"


class SqliteReembeds(SqlReembeds):
    _vector = staticmethod(half_blob)


class SqliteGraphWrites(SqlGraphWrites):
    # An erasure merges the FTS5 index: deleted words stay in old segments until a merge.
    SCRUB = ("INSERT INTO nodes_fts(nodes_fts) VALUES ('optimize')",
             "UPDATE lexical_epoch SET epoch = lower(hex(randomblob(16)))")
    SESSIONS = SqliteSessions
    _vector = staticmethod(half_blob)
    _receipt = staticmethod(pack_text)

    @staticmethod
    def _record(values: list[Any], packed: bool) -> object:
        text = json.dumps(values)
        return pack_text(text) if packed else text

    @staticmethod
    def _loads(value: Any) -> Any:
        return None if value is None else loads(unpack_text(value))


class SqliteMaintenance(SqlMaintenance, SqliteGraphWrites):
    # Neither end in another repo (links have no repo: it is their ends').
    DANGLING = (
        "(NOT EXISTS (SELECT 1 FROM nodes n WHERE n.rowid = links.src)"
        " OR NOT EXISTS (SELECT 1 FROM nodes n WHERE n.rowid = links.dst))"
        " AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.rowid IN (links.src, links.dst)"
        " AND n.repo != ?)"
    )

    async def _bad_vectors(self, sql: Statements, repo: str, dim: int) -> int:
        # Half floats: two bytes a number.
        return await number(sql, "SELECT count(*) FROM nodes n JOIN vectors v ON v.node = n.rowid"
                            " WHERE n.repo = ? AND length(v.vec) != ?", repo, 2 * dim)

    async def _search_rebuilt(self, sql: Statements, repo: str) -> bool:
        try:
            # rank = 1: also compare the index with its content table (the nodes).
            await sql.run("INSERT INTO nodes_fts(nodes_fts, rank) VALUES ('integrity-check', 1)")
            return False
        except sqlite3.DatabaseError:
            await sql.run("INSERT INTO nodes_fts(nodes_fts) VALUES ('rebuild')")
            return True


class SqliteGraph(MaintainedGraph, ReembeddedGraph):
    MAINTENANCE = SqliteMaintenance()
    REEMBEDS = SqliteReembeds()
    WRITES = SqliteGraphWrites()
    _vectors: SqliteVectors

    def __init__(self, database: Database, dims: Callable[[str], int], *,
                 ann_threshold: int | None = ann.DEFAULT_THRESHOLD,
                 lexical: LexicalIndex | None = None, ann_dir: Path | None = None) -> None:
        """`ann_threshold`: size past which searches use HNSW (None: always exact); `lexical`:
        the index for `search_text` (None: FTS5); `ann_dir`: where HNSW graphs are saved."""
        super().__init__(database, dims, lexical)
        self._database = database
        self._vectors = SqliteVectors(database, dims, ann_threshold=ann_threshold, ann_dir=ann_dir)

    def _repo_lock(self, repo: str) -> AbstractAsyncContextManager[None]:
        timeout = self._database.busy_timeout
        busy = StorageError("busy", f"another process held repo {repo!r}'s lock for {timeout}s")
        return self._holding(repo, "repo", timeout, busy)

    @asynccontextmanager
    async def _holding(self, repo: str, kind: str, wait: float,
                       busy: Exception) -> AsyncIterator[None]:
        """The repo's lock file of `kind` (none for a database in memory), taken within
        `wait` seconds (`busy` raised past them)."""
        held = self._file_lock(repo, kind)
        if held is None:
            yield
            return
        try:
            # Shielded: a lock taken in the thread must be released, not abandoned.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(functools.partial(held.acquire, timeout=wait))
        except filelock.Timeout:
            raise busy from None
        except OSError as exc:  # its folder gone, read-only, full: no driver error out
            raise StorageError(
                "unavailable", f"cannot take repo {repo!r}'s {kind} lock file: {exc}") from exc
        try:
            yield
        finally:
            held.release()

    def _file_lock(self, repo: str, kind: str) -> filelock.FileLock | None:
        path = self._database.path
        if path == ":memory:" or path.startswith("file:"):
            return None
        digest = hashlib.sha256(repo.encode()).hexdigest()[:24]
        # Not thread-local: taken in a worker thread, released on the event loop's.
        return filelock.FileLock(f"{path}-{kind}-{digest}.lock", thread_local=False)

    async def _committed(self, plan: CommitPlan) -> None:
        if self._vectors.loaded(plan.repo) is not None:
            await self._vectors.index(plan.repo)

    _node = staticmethod(node)

    async def _erased(self) -> None:
        try:
            await self._database.scrub()
        finally:
            await super()._erased()

    def _reembed_lock(self, repo: str, busy: ConflictError
                      ) -> AbstractAsyncContextManager[None]:
        """A lock file beside the file, taken without waiting (freed when its process dies)."""
        return self._holding(repo, "reembed", 0, busy)

    async def vectors_switched(self, repo: str, dim: int) -> None:
        """Drops the repo's saved HNSW graphs; the index in memory reloads at its next use."""
        folder = self._vectors.graph_folder(repo)
        if folder is not None:
            await anyio.to_thread.run_sync(ann_files.discard, folder)

    async def neighbors(
        self, repo: str, node_ids: Sequence[str], link_type: LinkType | None = None
    ) -> list[Neighbor]:
        """Every link touching these nodes, seen from each of them, in either direction."""
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return []
        return await self._database.run(lambda db: read_neighbors(db, repo, ids, link_type))

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

        context = await self._database.run(lambda db: read_node_context(
            db, repo, node_ids, kinds, link_type, None if then is None else more))
        context.vectors.update(vectors)
        if asked and asked[0]:
            context.vectors.update(await self._vectors.of_nodes(repo, asked[0]))
        return context

    async def _store_text(
        self, repo: str, query: str, limit: int, kinds: list[str] | None,
        where: Where | None = None,
    ) -> list[tuple[str, float]]:
        return await self._database.run(
            lambda db: fts_search(db, repo, query, kinds, limit, where))

    def _start_store_text(self, repo: str, query: str, limit: int, kinds: list[str] | None
                          ) -> PendingRead[list[tuple[str, float]]]:
        return self._database.start(
            lambda db: fts_search(db, repo, query, kinds, limit))

    async def reinforce(self, repo: str, node_ids: Sequence[str], when: datetime) -> None:
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return
        stamp = when.isoformat()

        def write(db: SqliteUtilsDatabase) -> None:
            with side_write(db):
                # One statement a chunk, not one a node: each statement gives the GIL up and
                # takes it back, and this runs while a recall's Python holds it.
                for chunk in chunks(ids, 400):
                    db.conn.execute(
                        "UPDATE nodes SET access_count = access_count + 1, last_access = ?"
                        f" WHERE repo = ? AND id IN ({marks(len(chunk))})",
                        [stamp, repo, *chunk],
                    )

        def refused(exc: StorageError) -> None:
            log.warning("the access counts of %d nodes in %s were not written: %r",
                        len(ids), repo, exc)

        self._database.post(write, refused)

    async def typed_links(self, repo: str, node_ids: Sequence[str]) -> list[TypedLink]:
        """Every link touching these nodes, seen from each (`TypedLink`), in one query."""
        ids = list(dict.fromkeys(node_ids))
        if not ids:
            return []
        return await self._database.run(lambda db: read_typed_links(db, repo, ids))

    async def _links_near(self, repo: str, node_ids: Sequence[str], vector: Vector
                          ) -> tuple[list[TypedLink], dict[str, float]]:
        links = await self.typed_links(repo, node_ids)
        # The vectors are in memory: the cosines cost no second read.
        targets = [target for _, _, target, _, _ in links]
        return links, await self._vectors.similarities(repo, targets, vector, None)


_CHUNK = 400


def read_node_context(
    db: SqliteUtilsDatabase, repo: str, node_ids: Sequence[str], linked: Iterable[NodeType],
    link_type: LinkType, then: More | None = None,
) -> NodeContext:
    """See `GraphStore.node_context` (the vectors are the caller's: they are in memory)."""
    first = _node_context(db, repo, node_ids, linked, link_type)
    more, more_linked = ((), ()) if then is None else then(first)
    if not more:
        return first
    return joined(first, _node_context(db, repo, more, more_linked, link_type))


def _node_context(
    db: SqliteUtilsDatabase, repo: str, node_ids: Sequence[str], linked: Iterable[NodeType],
    link_type: LinkType,
) -> NodeContext:
    ids = list(dict.fromkeys(node_ids))
    kinds = {NodeType(t) for t in linked}
    found: dict[str, Node] = {}
    stats: dict[str, tuple[int, datetime | None]] = {}
    rowids: dict[int, str] = {}
    for chunk in chunks(ids, _CHUNK):
        for row in db.conn.execute(
            f"SELECT {NODE_COLUMNS}, access_count, last_access, rowid FROM nodes"
            f" WHERE repo = ? AND id IN ({marks(len(chunk))})",
            [repo, *chunk],
        ):
            found[row[0]] = node(row)
            count, last, rowid = row[NODE_WIDTH:]
            stats[row[0]] = (count, datetime.fromisoformat(last) if last else None)
            rowids[rowid] = row[0]
    origins = [r for r, i in rowids.items() if found[i].type in kinds]
    links: list[Neighbor] = []
    for rows in chunks(origins, _CHUNK):
        held = marks(len(rows))
        # Each half reads a link from one asked end (by rowid) to the other's id.
        for origin, other in db.conn.execute(
            f"SELECT l.src, b.id FROM links l JOIN nodes b ON b.rowid = l.dst"
            f" WHERE l.src IN ({held}) AND l.type = ?"
            f" UNION ALL SELECT l.dst, a.id FROM links l JOIN nodes a ON a.rowid = l.src"
            f" WHERE l.dst IN ({held}) AND l.type = ?",
            [*rows, link_type.value, *rows, link_type.value],
        ):
            links.append(Neighbor(rowids[origin], other, link_type))
    return NodeContext(
        [found[i] for i in ids if i in found], stats, list(dict.fromkeys(links))
    )


def read_typed_links(
    db: SqliteUtilsDatabase, repo: str, ids: list[str]
) -> list[TypedLink]:
    found: list[TypedLink] = []
    for chunk in chunks(ids, _CHUNK):
        # Links name their ends by rowid: the asked nodes' rowids (and ids, types) read once
        # through the id's index, then each link's other end from its row, by rowid; a link
        # between two asked nodes is read from its src only.
        found += seen_from_asked(db.conn.execute(
            f"WITH asked(node, id, type) AS MATERIALIZED (SELECT rowid, id, type FROM nodes"
            f" WHERE repo = ? AND id IN ({marks(len(chunk))}))"
            " SELECT s.id, s.type, b.id, b.type, l.type FROM asked s"
            " JOIN links l ON l.src = s.node JOIN nodes b ON b.rowid = l.dst"
            " UNION ALL SELECT a.id, a.type, d.id, d.type, l.type FROM asked d"
            " JOIN links l ON l.dst = d.node JOIN nodes a ON a.rowid = l.src"
            " WHERE l.src NOT IN (SELECT node FROM asked)",
            [repo, *chunk],
        ), set(chunk))
    return found


def read_neighbors(
    db: SqliteUtilsDatabase, repo: str, ids: list[str], link_type: LinkType | None
) -> list[Neighbor]:
    found: list[Neighbor] = []
    kind = "" if link_type is None else " WHERE l.type = ?"
    extra = [] if link_type is None else [link_type.value]
    for chunk in chunks(ids, _CHUNK):
        # As `read_typed_links`: the asked nodes read once, each link's other end by rowid.
        found += neighbors_seen_from_asked(db.conn.execute(
            f"WITH asked(node, id) AS MATERIALIZED (SELECT rowid, id FROM nodes"
            f" WHERE repo = ? AND id IN ({marks(len(chunk))}))"
            " SELECT s.id, b.id, l.type FROM asked s JOIN links l ON l.src = s.node"
            f" JOIN nodes b ON b.rowid = l.dst{kind}"
            " UNION ALL SELECT a.id, d.id, l.type FROM asked d JOIN links l ON l.dst = d.node"
            f" JOIN nodes a ON a.rowid = l.src{kind}",
            [repo, *chunk, *extra, *extra],
        ), set(chunk))
    return list(dict.fromkeys(found))


def fts_search(
    db: SqliteUtilsDatabase, repo: str, query: str, kinds: list[str] | None, limit: int,
    where: Where | None = None,
) -> list[tuple[str, float]]:
    """The store's own BM25 search (FTS5), for when the lexical index cannot answer: node ids,
    best first, with scores where higher is better."""
    match = fts_query(query)
    if not match or limit <= 0:
        return []
    type_filter = "" if kinds is None else f" AND n.type IN ({marks(len(kinds))})"
    scoped, params = ("", []) if where is None else scopes.exists(repo, where, "n.rowid", 0)
    return [(node_id, -float(score)) for node_id, score in db.conn.execute(
        "SELECT n.id, bm25(nodes_fts) AS score FROM nodes_fts"
        " JOIN nodes n ON n.rowid = nodes_fts.rowid"
        f" WHERE nodes_fts MATCH ? AND n.repo = ?{type_filter}{scoped}"
        " ORDER BY score LIMIT ?",
        [match, repo, *(kinds or []), *params, limit],
    )]


def fts_query(text: str) -> str:
    """Any user text as a safe FTS5 query: the `match_expression` of its distinct words
    (`query_words`, at most `MAX_QUERY_TERMS`: the cost must not grow with the text)."""
    return match_expression(query_words(text))


def match_expression(words: Sequence[str]) -> str:
    """The FTS5 MATCH expression of a query's words, each quoted: never FTS5 syntax ("" if none)."""
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in words)
