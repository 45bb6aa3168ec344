"""Recall's batched reads on PostgreSQL, one round trip each: a candidate set's nodes, stats
and links, and a hop's typed links with their far ends' cosine to the query."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime

from mnemo import cpu
from mnemo.graph.model import LINK_TYPES, NODE_TYPES, LinkType, Node, NodeId, NodeType, Vector
from mnemo.graph.ports import More, Neighbor, NodeContext, TypedLink
from mnemo.storage.graph_base import joined
from mnemo.storage.graph_rows import NODE_COLUMNS, NODE_WIDTH
from mnemo.storage.postgres.connection import Connection, Postgres, as_array, rows_of
from mnemo.storage.postgres.vectors import OF_NODES, unit_rows
from mnemo.storage.row import ON_LOOP_NODES, Row


def node(row: Row) -> Node:
    node_id, kind, text, data, created_at, start, end, recorded, retired, metadata = (
        row[:NODE_WIDTH])
    return Node(NodeId(str(node_id)), NODE_TYPES[kind], str(text), dict(data), created_at, start,
                end, recorded, retired, dict(metadata or {}))


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


async def node_context(
    pg: Postgres, repo: str, node_ids: Sequence[str], linked: Iterable[NodeType],
    link_type: LinkType, then: More | None = None,
) -> NodeContext:
    """See `GraphStore.node_context`: `then`'s nodes on the same connection."""
    async with pg.connection() as conn:
        first = await _node_context(conn, repo, node_ids, linked, link_type)
        more, more_linked = ((), ()) if then is None else then(first)
        if not more:
            return first
        return joined(first, await _node_context(conn, repo, more, more_linked, link_type))


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
        found: dict[str, Node] = {}
        stats: dict[str, tuple[int, datetime | None]] = {}
        for row in node_rows:
            found[str(row[0])] = node(row)
            count, last = row[NODE_WIDTH:]
            stats[str(row[0])] = (int(count), last)
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


async def typed_links_near(
    pg: Postgres, repo: str, node_ids: Sequence[str], vector: Vector
) -> tuple[list[TypedLink], dict[str, float]]:
    ids = list(dict.fromkeys(node_ids))
    rows = await pg.fetch_all(_HOP, {"repo": repo, "ids": ids, "q": as_array(vector)})
    return await cpu.run(lambda: hop_links(rows), len(ids), on_loop_below=ON_LOOP_NODES + 1)


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
