"""The write of a commit's plan on SQLite: one transaction with its side writes and history
record, under the repo's lock."""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.graph.commit import CommitPlan
from mnemo.graph.model import times
from mnemo.graph.ports import SideWrite
from mnemo.graph.scope import canonical, pairs
from mnemo.storage.sqlite import history
from mnemo.storage.sqlite.rows import half_blob, pack_text
from mnemo.storage.sqlite.sessions import side_writes


def write_commit(db: SqliteUtilsDatabase, plan: CommitPlan, also: Sequence[SideWrite]) -> None:
    """See `CommitTarget.write_commit`: the rows only (the caller updates the vector index)."""
    repo, created = plan.repo, plan.created_at
    with db.atomic():
        conn = db.conn
        conn.executemany(
            "INSERT OR IGNORE INTO nodes(id, repo, type, text, data, key, source_id,"
            " created_at, recorded_at, valid_from, metadata)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (n.id, repo, n.type.value, text, json.dumps(n.data, sort_keys=True),
                 n.key, n.source_id, created, *times(n, created),
                 canonical(plan.metadata))
                for n, text, _ in plan.nodes
            ],
        )
        conn.executemany(
            "INSERT OR IGNORE INTO node_scopes(repo, key, value, node)"
            " SELECT ?, ?, ?, rowid FROM nodes WHERE id = ?",
            [(repo, key, value, n.id) for n, _, _ in plan.nodes
             for key, value in pairs(plan.metadata)],
        )
        conn.executemany(
            "INSERT OR IGNORE INTO vectors(node, vec) SELECT rowid, ? FROM nodes WHERE id = ?",
            [(half_blob(vector), n.id) for n, _, vector in plan.nodes],
        )
        history.joined(conn, plan)  # before the rewordings
        for node_id, (text, vector) in plan.rewordings.items():
            conn.execute("UPDATE nodes SET text = ? WHERE id = ?", (text, node_id))
            conn.execute(
                "UPDATE vectors SET vec = ? WHERE node = (SELECT rowid FROM nodes WHERE id = ?)",
                (half_blob(vector), node_id),
            )
        history.add_links(conn, plan.links)
        conn.execute(
            "INSERT INTO applied_changesets(id, repo, receipt, applied_at)"
            " VALUES (?, ?, ?, ?)",
            (plan.changeset_id, repo, pack_text(plan.receipt.to_json()), created),
        )
        history.record(conn, plan)
        side_writes(db, also)
