"""The SQL of the graph's deletes on SQLite: nodes by id, and everything a source produced.
Each function is one transaction, run by `SqliteGraph` under the repo's lock (which also
forgets the vectors of what went)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.graph.ports import SideWrite
from mnemo.storage.sqlite import history
from mnemo.storage.sqlite.database import chunks
from mnemo.storage.sqlite.sessions import side_writes


def delete_nodes(db: SqliteUtilsDatabase, repo: str, ids: list[str]) -> int:
    """See `GraphStore.delete_nodes`: returns how many of `ids` were rows."""
    gone = 0
    with db.atomic():
        for chunk in chunks(ids, 500):
            marks = ",".join("?" * len(chunk))
            gone += db.conn.execute(
                f"DELETE FROM nodes WHERE repo = ? AND id IN ({marks})",
                [repo, *chunk],
            ).rowcount
    return gone


def delete_source(
    db: SqliteUtilsDatabase, repo: str, source_id: str, also: Sequence[SideWrite]
) -> list[str]:
    """See `GraphStore.delete_source`: returns the ids of the nodes that went."""
    conn = db.conn
    with db.atomic():
        own = [row[0] for row in conn.execute(
            "SELECT id FROM nodes WHERE repo = ? AND source_id = ?"
            " AND type NOT IN ('tag', 'intent')", (repo, source_id))]
        routes = {row[0] for row in conn.execute(
            "SELECT id FROM nodes WHERE repo = ? AND source_id = ?"
            " AND type IN ('tag', 'intent')", (repo, source_id))}
        for chunk in chunks(own, 400):
            marks = ",".join("?" * len(chunk))
            routes.update(row[0] for row in conn.execute(
                f"SELECT n.id FROM links l JOIN nodes n ON n.id = l.src"
                f" WHERE l.dst IN ({marks}) AND n.type IN ('tag', 'intent')",
                chunk))
            conn.execute(f"DELETE FROM nodes WHERE id IN ({marks})", chunk)
        orphans = [
            node_id for node_id in sorted(routes)
            if conn.execute(
                "SELECT 1 FROM links WHERE src = ? OR dst = ? LIMIT 1",
                (node_id, node_id),
            ).fetchone() is None
        ]
        for chunk in chunks(orphans, 400):
            marks = ",".join("?" * len(chunk))
            conn.execute(f"DELETE FROM nodes WHERE id IN ({marks})", chunk)
        # A tag or intent the source created that another still uses stays, but
        # no longer names the source (its id is the user's text: erasure).
        conn.execute(
            "UPDATE nodes SET source_id = NULL WHERE repo = ? AND source_id = ?",
            (repo, source_id),
        )
        history.forget_source(conn, repo, source_id)
        side_writes(db, also)
    return own + orphans
