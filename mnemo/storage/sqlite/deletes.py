"""The SQL of the graph's deletes on SQLite: nodes by id, and everything a source produced.
Each function is one transaction, run by `SqliteGraph` under the repo's lock (which also
forgets the vectors of what went)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.graph.erasure import Inherited, Plan
from mnemo.graph.ports import SideWrite
from mnemo.storage.sqlite import history
from mnemo.storage.sqlite.database import chunks
from mnemo.storage.sqlite.rows import half_blob
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


def inherited(
    db: SqliteUtilsDatabase, repo: str, source_id: str
) -> Inherited:
    """The intents the source created or re-worded, and (intent, data, source) of each
    procedure of another source linked to them, oldest first (`mnemo.graph.erasure.heirs`)."""
    conn = db.conn
    intents = [row[0] for row in conn.execute(
        "SELECT id FROM nodes WHERE repo = ? AND source_id = ? AND type = 'intent'",
        (repo, source_id))]
    for (reworded,) in conn.execute(
        "SELECT reworded FROM commits WHERE repo = ? AND source_id = ?", (repo, source_id)
    ):
        intents.extend(json.loads(reworded))
    intents = sorted(set(intents))
    procedures: list[tuple[str, Any, str | None]] = []
    for chunk in chunks(intents, 400):
        marks = ",".join("?" * len(chunk))
        procedures.extend(
            (intent_id, json.loads(data), owner) for intent_id, data, owner in conn.execute(
                f"SELECT l.src, n.data, n.source_id FROM links l JOIN nodes n ON n.id = l.dst"
                f" WHERE l.src IN ({marks}) AND l.type = 'hierarchical'"
                f" AND n.type = 'procedural' AND n.source_id IS NOT ?"
                f" ORDER BY n.created_at, n.rowid",
                [*chunk, source_id]))
    return intents, procedures


def delete_source(
    db: SqliteUtilsDatabase,
    repo: str,
    source_id: str,
    also: Sequence[SideWrite],
    plan: Plan,
) -> list[str]:
    """See `GraphStore.delete_source`: returns the ids of the nodes that went. `plan` says
    what becomes of the intents the source created or re-worded (`inherited`)."""
    conn = db.conn
    with db.atomic():
        own = [row[0] for row in conn.execute(
            "SELECT id FROM nodes WHERE repo = ? AND source_id = ?"
            " AND type NOT IN ('tag', 'intent')", (repo, source_id))]
        routes = {row[0] for row in conn.execute(
            "SELECT id FROM nodes WHERE repo = ? AND source_id = ?"
            " AND type IN ('tag', 'intent')", (repo, source_id))}
        routes.update(plan.intents)
        own.extend(plan.dropped)
        for chunk in chunks(own, 400):
            marks = ",".join("?" * len(chunk))
            routes.update(row[0] for row in conn.execute(
                f"SELECT n.id FROM links l JOIN nodes n ON n.id = l.src"
                f" WHERE l.dst IN ({marks}) AND n.type IN ('tag', 'intent')",
                chunk))
            conn.execute(f"DELETE FROM nodes WHERE id IN ({marks})", chunk)
        for intent_id, (heir, vector) in plan.heirs.items():
            conn.execute(
                "UPDATE nodes SET text = ?, data = json_set(data, '$.intent', ?),"
                " source_id = ? WHERE repo = ? AND id = ?",
                (heir.text, heir.text, heir.source_id, repo, intent_id))
            conn.execute("UPDATE vectors SET vec = ? WHERE node ="
                         " (SELECT rowid FROM nodes WHERE id = ?)",
                         (half_blob(vector), intent_id))
        # Of the routes still there (not deleted above, not already gone: an intent a
        # record names may be), those without links; counted once.
        orphans = [
            node_id for node_id in sorted(routes - set(own))
            if conn.execute(
                "SELECT 1 FROM nodes n WHERE n.id = ? AND NOT EXISTS"
                " (SELECT 1 FROM links WHERE src = n.id OR dst = n.id)",
                (node_id,),
            ).fetchone() is not None
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
