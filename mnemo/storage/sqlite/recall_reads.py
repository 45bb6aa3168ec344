"""The batched reads of recall on SQLite, each one call on the database's worker thread (each
call is a thread hop, which a recall of a small store pays more for than for its queries): a
candidate set's nodes, access stats and links; the links a hop follows, with the types of
their ends; every link of some nodes; and the store's own full-text search."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.graph.model import LinkType, Node, NodeType
from mnemo.graph.ports import More, Neighbor, NodeContext, TypedLink
from mnemo.storage.sqlite.database import chunks
from mnemo.storage.sqlite.rows import NODE_COLUMNS, NODE_WIDTH, node
from mnemo.storage.typed_links import neighbors_seen_from_asked, seen_from_asked

_CHUNK = 400


def node_context(
    db: SqliteUtilsDatabase,
    repo: str,
    node_ids: Sequence[str],
    linked: Iterable[NodeType],
    link_type: LinkType,
    then: More | None = None,
) -> NodeContext:
    """See `GraphStore.node_context` (the vectors are the caller's: they are in memory)."""
    first = _node_context(db, repo, node_ids, linked, link_type)
    if then is None:
        return first
    more, more_linked = then(first)
    if not more:
        return first
    second = _node_context(db, repo, more, more_linked, link_type)
    return NodeContext([*first.nodes, *second.nodes], {**first.stats, **second.stats},
                       [*first.links, *second.links])


def _node_context(
    db: SqliteUtilsDatabase,
    repo: str,
    node_ids: Sequence[str],
    linked: Iterable[NodeType],
    link_type: LinkType,
) -> NodeContext:
    ids = list(dict.fromkeys(node_ids))
    kinds = {NodeType(t) for t in linked}
    found: dict[str, Node] = {}
    stats: dict[str, tuple[int, datetime | None]] = {}
    for chunk in chunks(ids, _CHUNK):
        marks = ",".join("?" * len(chunk))
        for row in db.conn.execute(
            f"SELECT {NODE_COLUMNS}, access_count, last_access FROM nodes"
            f" WHERE repo = ? AND id IN ({marks})",
            [repo, *chunk],
        ):
            found[row[0]] = node(row)
            count, last = row[NODE_WIDTH:]
            stats[row[0]] = (count, datetime.fromisoformat(last) if last else None)
    origins = [i for i in ids if i in found and found[i].type in kinds]
    links: list[Neighbor] = []
    for chunk in chunks(origins, _CHUNK):
        marks = ",".join("?" * len(chunk))
        wanted = set(chunk)
        for src, dst in db.conn.execute(
            f"SELECT src, dst FROM links WHERE repo = ? AND src IN ({marks}) AND type = ?"
            f" UNION ALL SELECT src, dst FROM links WHERE repo = ? AND dst IN ({marks})"
            " AND type = ?",
            [repo, *chunk, link_type.value, repo, *chunk, link_type.value],
        ):
            if src in wanted:
                links.append(Neighbor(src, dst, link_type))
            if dst in wanted:
                links.append(Neighbor(dst, src, link_type))
    return NodeContext(
        [found[i] for i in ids if i in found], stats, list(dict.fromkeys(links))
    )


def typed_links(
    db: SqliteUtilsDatabase, repo: str, ids: list[str]
) -> list[TypedLink]:
    """See `GraphStore.typed_links`."""
    found: list[TypedLink] = []
    for chunk in chunks(ids, _CHUNK):
        marks = ",".join("?" * len(chunk))
        found += seen_from_asked(db.conn.execute(
            "SELECT l.src, a.type, l.dst, b.type, l.type FROM links l"
            # The planner takes the id's unique index, which reads each node's row
            # for its type; (id, type) answers from the index alone (m014).
            " JOIN nodes a INDEXED BY nodes_id_type ON a.id = l.src"
            " JOIN nodes b INDEXED BY nodes_id_type ON b.id = l.dst"
            f" WHERE l.repo = ? AND (l.src IN ({marks}) OR l.dst IN ({marks}))",
            [repo, *chunk, *chunk],
        ), set(chunk))
    return found


def neighbors(
    db: SqliteUtilsDatabase, repo: str, ids: list[str], link_type: LinkType | None
) -> list[Neighbor]:
    """See `GraphStore.neighbors`."""
    found: list[Neighbor] = []
    kind = "" if link_type is None else " AND type = ?"
    extra = [] if link_type is None else [link_type.value]
    for chunk in chunks(ids, _CHUNK):
        marks = ",".join("?" * len(chunk))
        found += neighbors_seen_from_asked(db.conn.execute(
            f"SELECT src, dst, type FROM links WHERE repo = ? AND src IN ({marks}){kind}"
            f" UNION ALL SELECT src, dst, type FROM links WHERE repo = ?"
            f" AND dst IN ({marks}){kind}",
            [repo, *chunk, *extra, repo, *chunk, *extra],
        ), set(chunk))
    return list(dict.fromkeys(found))


def fts_search(
    db: SqliteUtilsDatabase, repo: str, match: str, kinds: list[str] | None, limit: int
) -> list[tuple[str, float]]:
    """The store's own BM25 search (FTS5), for when the lexical index cannot answer: node ids
    matching `match`, best first, with scores where higher is better."""
    type_filter = "" if kinds is None else f" AND n.type IN ({','.join('?' * len(kinds))})"
    rows = db.conn.execute(
        "SELECT n.id, bm25(nodes_fts) AS score FROM nodes_fts"
        " JOIN nodes n ON n.rowid = nodes_fts.rowid"
        f" WHERE nodes_fts MATCH ? AND n.repo = ?{type_filter}"
        " ORDER BY score LIMIT ?",
        [match, repo, *(kinds or []), limit],
    ).fetchall()
    return [(node_id, -float(score)) for node_id, score in rows]
