"""The commit history's rows in SQLite (`graph.history`), written in a commit's transaction;
a record holds ids only (its nodes and links packed, `rows.pack_text`)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from mnemo.graph import shares
from mnemo.graph.commit import CommitPlan
from mnemo.graph.model import Link
from mnemo.storage.graph_rows import COMMIT_COLUMNS
from mnemo.storage.row import loads_object
from mnemo.storage.sqlite.database import chunks
from mnemo.storage.sqlite.rows import pack_text, unpack_text

# An end that is no node makes a NULL, which fails (NOT NULL).
_LINK = (
    "INSERT INTO links(src, dst, type, refs) VALUES ((SELECT rowid FROM nodes WHERE id = ?),"
    " (SELECT rowid FROM nodes WHERE id = ?), ?, ?) ON CONFLICT DO "
)
INSERT_LINK = _LINK + "NOTHING"
_ADD_LINK = _LINK + "UPDATE SET refs = refs + 1"


def add_links(conn: sqlite3.Connection, links: Iterable[Link]) -> None:
    """Inserts the commit's links (one present counts one more commit); `IntegrityError`
    when an end is no node."""
    conn.executemany(_ADD_LINK, [(k.src, k.dst, k.type.value, 1) for k in links])


def joined(conn: sqlite3.Connection, plan: CommitPlan) -> None:
    """Adds the commit's contribution to each node it joined (`graph.shares`); runs before
    the rewordings."""
    for node_id, brought in plan.joined.items():
        text, data, source, owners = conn.execute(
            "SELECT text, data, source_id, owners FROM nodes WHERE id = ?", (node_id,)
        ).fetchone()
        now = shares.Contribution(text, loads_object(data), source)
        conn.execute("UPDATE nodes SET owners = ? WHERE id = ?", (shares.dumps(shares.joined(
            owners and json.loads(owners), now, plan.changeset_id, brought)), node_id))


def record(conn: sqlite3.Connection, plan: CommitPlan) -> None:
    """Writes the commit's record (the caller holds the repo's lock: `seq` is max + 1)."""
    conn.execute(
        f"INSERT INTO commits({COMMIT_COLUMNS})"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
        (
            plan.changeset_id, plan.repo, _next_seq(conn, plan.repo), plan.created_at,
            plan.session_id, plan.source_id,
            pack_text(json.dumps([n.id for n, _, _ in plan.nodes])),
            pack_text(json.dumps([[k.src, k.dst, k.type.value] for k in plan.links])),
            json.dumps([node_id for node_id, _ in plan.retired]),
            json.dumps(sorted(plan.rewordings)), json.dumps(sorted(plan.joined)),
        ),
    )
    conn.executemany(
        "UPDATE nodes SET retired_at = ?, valid_to = ? WHERE repo = ? AND id = ?",
        [(plan.created_at, until or plan.created_at, plan.repo, node_id)
         for node_id, until in plan.retired],
    )


def _next_seq(conn: sqlite3.Connection, repo: str) -> int:
    (seq,) = conn.execute(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM commits WHERE repo = ?", (repo,)).fetchone()
    return int(seq)


def reverted(conn: sqlite3.Connection, repo: str, commit_id: str, revert_id: str, at: str) -> None:
    """Records the revert of a withdrawn commit (an ingested source's id is free again)."""
    conn.execute(
        f"INSERT INTO commits({COMMIT_COLUMNS}) VALUES (?, ?, ?, ?, NULL, NULL, ?, ?, '[]', '[]',"
        " '[]', NULL, ?)",
        (revert_id, repo, _next_seq(conn, repo), at, pack_text("[]"), pack_text("[]"),
         commit_id))
    conn.execute("UPDATE commits SET reverted_by = ? WHERE id = ?", (revert_id, commit_id))
    conn.execute("DELETE FROM ingests WHERE repo = ? AND changeset_id = ?", (repo, commit_id))


def unretire(conn: sqlite3.Connection, repo: str, node_ids: Sequence[str]) -> None:
    conn.executemany(
        "UPDATE nodes SET retired_at = NULL, valid_to = NULL WHERE repo = ? AND id = ?",
        [(repo, node_id) for node_id in node_ids],
    )


def forget_commits(conn: sqlite3.Connection, repo: str, commit_ids: Sequence[str]) -> None:
    """Removes the records of a forgotten source's commits and of their reverts."""
    for chunk in chunks(commit_ids, 400):
        marks = ",".join("?" * len(chunk))
        conn.execute(f"DELETE FROM commits WHERE repo = ? AND (id IN ({marks})"
                     f" OR reverts IN ({marks}))", [repo, *chunk, *chunk])


def stored_ids(value: str | bytes) -> list[Any]:
    """A list of a commit's record as stored (JSON, packed or plain)."""
    return list(json.loads(unpack_text(value)))
