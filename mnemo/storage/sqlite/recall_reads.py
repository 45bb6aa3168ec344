"""The batched reads of recall on SQLite: a candidate set's nodes, access stats and links in
one call on the database's worker thread (each call is a thread hop, which a recall of a
small store pays more for than for its queries)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.graph.model import LinkType, Node, NodeType
from mnemo.graph.ports import Neighbor, NodeContext

_CHUNK = 400


def node_context(
    db: SqliteUtilsDatabase,
    repo: str,
    node_ids: Sequence[str],
    linked: Iterable[NodeType],
    link_type: LinkType,
) -> NodeContext:
    """See `GraphStore.node_context`."""
    ids = list(dict.fromkeys(node_ids))
    kinds = {NodeType(t) for t in linked}
    found: dict[str, Node] = {}
    stats: dict[str, tuple[int, datetime | None]] = {}
    for chunk in _chunks(ids):
        marks = ",".join("?" * len(chunk))
        for node_id, kind, text, data, created, count, last in db.conn.execute(
            "SELECT id, type, text, data, created_at, access_count, last_access FROM nodes"
            f" WHERE repo = ? AND id IN ({marks})",
            [repo, *chunk],
        ):
            found[node_id] = Node(
                node_id, NodeType(kind), text, json.loads(data), datetime.fromisoformat(created)
            )
            stats[node_id] = (count, datetime.fromisoformat(last) if last else None)
    origins = [i for i in ids if i in found and found[i].type in kinds]
    links: list[Neighbor] = []
    for chunk in _chunks(origins):
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


def _chunks(items: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]
