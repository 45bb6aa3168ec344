"""The SQL of a commit on SQLite (`mnemo.graph.commit`'s `CommitTarget`): the reads that make
it happen once (an applied changeset's receipt, an ingested source's), the reads that plan it
(tags' owners, ids already present, nodes' texts) and the write of its plan, one transaction
with its side writes and its history record. `SqliteGraph` runs each on the database's
thread; the write under the repo's lock."""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.graph.commit import CommitPlan
from mnemo.graph.model import times
from mnemo.graph.ports import SideWrite
from mnemo.graph.scope import canonical, pairs
from mnemo.storage.sqlite import history
from mnemo.storage.sqlite.database import chunks
from mnemo.storage.sqlite.rows import half_blob, pack_text, unpack_text
from mnemo.storage.sqlite.sessions import side_writes


def receipt(db: SqliteUtilsDatabase, changeset_id: str) -> str | None:
    """The receipt (JSON) of an applied changeset, None if it was never applied."""
    rows = db.conn.execute(
        "SELECT receipt FROM applied_changesets WHERE id = ?", (changeset_id,)
    ).fetchall()
    return unpack_text(rows[0][0]) if rows else None


def ingested(db: SqliteUtilsDatabase, repo: str, source_id: str) -> tuple[str, str] | None:
    """An ingested source's payload digest and its changeset's receipt (JSON), None if the
    source was never ingested."""
    rows = db.conn.execute(
        "SELECT i.payload_hash, a.receipt FROM ingests i"
        " JOIN applied_changesets a ON a.id = i.changeset_id"
        " WHERE i.repo = ? AND i.source_id = ?",
        (repo, source_id),
    ).fetchall()
    return (rows[0][0], unpack_text(rows[0][1])) if rows else None


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


def tag_owners(db: SqliteUtilsDatabase, repo: str, keys: list[str]) -> dict[str, str]:
    """See `CommitTarget.tag_owners` (`keys` distinct)."""
    owners: dict[str, str] = {}
    for chunk in chunks(keys, 500):
        marks = ",".join("?" * len(chunk))
        owners.update(
            db.conn.execute(
                f"SELECT key, id FROM nodes WHERE repo = ? AND type = 'tag'"
                f" AND key IN ({marks})",
                [repo, *chunk],
            ).fetchall()
        )
    return owners


def present(db: SqliteUtilsDatabase, node_ids: list[str]) -> set[str]:
    """See `CommitTarget.present`."""
    found: set[str] = set()
    for chunk in chunks(node_ids, 500):
        marks = ",".join("?" * len(chunk))
        found.update(
            row[0]
            for row in db.conn.execute(
                f"SELECT id FROM nodes WHERE id IN ({marks})", chunk
            )
        )
    return found


def texts(db: SqliteUtilsDatabase, node_ids: list[str]) -> dict[str, str]:
    """See `CommitTarget.texts`."""
    marks = ",".join("?" * len(node_ids))
    return dict(
        db.conn.execute(f"SELECT id, text FROM nodes WHERE id IN ({marks})", node_ids).fetchall()
    )
