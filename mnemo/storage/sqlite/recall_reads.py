"""The batched reads of recall on SQLite: a candidate set's nodes, access stats and links in
one call on the database's worker thread (each call is a thread hop, which a recall of a
small store pays more for than for its queries)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.graph.model import LinkType, Node, NodeType
from mnemo.graph.ports import Neighbor, NodeContext
from mnemo.storage.sqlite.rows import NODE_COLUMNS, NODE_WIDTH, node

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
