"""Recall's batched reads on SQLite, each one call on the database's worker thread (each call
is a thread hop, which a recall of a small store pays more for than for its queries)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.graph.model import LinkType, Node, NodeType
from mnemo.graph.ports import More, Neighbor, NodeContext, TypedLink
from mnemo.graph.scope import Where
from mnemo.storage import graph_base as scopes
from mnemo.storage.graph_base import joined, neighbors_seen_from_asked, seen_from_asked
from mnemo.storage.graph_rows import NODE_COLUMNS, NODE_WIDTH
from mnemo.storage.sql import chunks, marks
from mnemo.storage.sqlite.rows import node
from mnemo.text import query_words

_CHUNK = 400


def node_context(
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


def typed_links(
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


def neighbors(
    db: SqliteUtilsDatabase, repo: str, ids: list[str], link_type: LinkType | None
) -> list[Neighbor]:
    found: list[Neighbor] = []
    kind = "" if link_type is None else " WHERE l.type = ?"
    extra = [] if link_type is None else [link_type.value]
    for chunk in chunks(ids, _CHUNK):
        # As `typed_links`: the asked nodes read once, each link's other end by rowid.
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
    """Any user text as a safe FTS5 query: its distinct words (`query_words`, at most
    `MAX_QUERY_TERMS`: the cost must not grow with the text) quoted, OR-combined ('' if none)."""
    words = query_words(text)
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in words)
