"""The commit history's rows in SQLite (`mnemo.graph.history`): written in a commit's own
transaction, read back, and undone. A record holds ids only (JSON lists, `sort_keys`; its
nodes and links packed, `rows.pack_text`)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from datetime import datetime

from mnemo.graph.commit import CommitPlan
from mnemo.graph.history import CommitRecord
from mnemo.graph.model import Link, LinkType
from mnemo.storage.row import Row
from mnemo.storage.sqlite.database import chunks
from mnemo.storage.sqlite.rows import pack_text, unpack_text

_COLUMNS = "id, repo, seq, committed_at, session_id, source_id, nodes, links, retired, reworded"


# A link names its ends by their rowids. An end that is no node makes a NULL, which fails
# (NOT NULL constraint) as the foreign key did: DO NOTHING skips only a link already there.
INSERT_LINK = (
    "INSERT INTO links(src, dst, type) VALUES ((SELECT rowid FROM nodes WHERE id = ?),"
    " (SELECT rowid FROM nodes WHERE id = ?), ?) ON CONFLICT DO NOTHING"
)


def insert_links(conn: sqlite3.Connection, links: Iterable[Link]) -> list[Link]:
    """Inserts the links not there yet; returns those it inserted (what the commit added).

    Raises:
        sqlite3.IntegrityError: an end is no node.
    """
    added = []
    for link in links:
        cursor = conn.execute(INSERT_LINK, (link.src, link.dst, link.type.value))
        if cursor.rowcount == 1:
            added.append(link)
    return added


def record(conn: sqlite3.Connection, plan: CommitPlan, links: Sequence[Link]) -> None:
    """Writes the commit's record (the caller holds the repo's lock: `seq` is max + 1)."""
    (seq,) = conn.execute(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM commits WHERE repo = ?", (plan.repo,)
    ).fetchone()
    conn.execute(
        f"INSERT INTO commits({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            plan.changeset_id, plan.repo, seq, plan.created_at, plan.session_id, plan.source_id,
            pack_text(json.dumps([n.id for n, _, _ in plan.nodes])),
            pack_text(json.dumps([[link.src, link.dst, link.type.value] for link in links])),
            json.dumps([node_id for node_id, _ in plan.retired]),
            json.dumps(sorted(plan.rewordings)),
        ),
    )
    conn.executemany(
        "UPDATE nodes SET retired_at = ?, valid_to = ? WHERE repo = ? AND id = ?",
        [(plan.created_at, until or plan.created_at, plan.repo, node_id)
         for node_id, until in plan.retired],
    )


def log(
    conn: sqlite3.Connection, repo: str, *, limit: int | None, after_seq: int | None
) -> list[CommitRecord]:
    """The repo's commits, newest first: the `limit` newest, or every one after `after_seq`."""
    if after_seq is not None:
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM commits WHERE repo = ? AND seq > ? ORDER BY seq DESC",
            (repo, after_seq),
        ).fetchall()
    else:
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM commits WHERE repo = ? ORDER BY seq DESC LIMIT ?",
            (repo, -1 if limit is None else limit),
        ).fetchall()
    return [_record(row) for row in rows]


def one(conn: sqlite3.Connection, repo: str, commit_id: str) -> CommitRecord | None:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM commits WHERE repo = ? AND id = ?", (repo, commit_id)
    ).fetchone()
    return None if row is None else _record(row)


def undo(conn: sqlite3.Connection, commit: CommitRecord) -> list[str]:
    """Deletes the commit's nodes (their links, vectors and search entries with them) and
    links, brings back the facts it retired, and forgets that it was applied; returns the ids
    of the nodes deleted. The caller holds the repo's lock and the transaction."""
    gone = []
    for node_id in commit.node_ids:
        if conn.execute(
            "DELETE FROM nodes WHERE repo = ? AND id = ?", (commit.repo, node_id)
        ).rowcount:
            gone.append(node_id)
    conn.executemany(
        "DELETE FROM links WHERE src = (SELECT rowid FROM nodes WHERE repo = ?1 AND id = ?2)"
        " AND dst = (SELECT rowid FROM nodes WHERE repo = ?1 AND id = ?3) AND type = ?4",
        [(commit.repo, link.src, link.dst, link.type.value) for link in commit.links],
    )
    unretire(conn, commit.repo, commit.retired)
    conn.execute("DELETE FROM commits WHERE id = ?", (commit.id,))
    conn.execute("DELETE FROM applied_changesets WHERE id = ?", (commit.id,))
    conn.execute(
        "DELETE FROM ingests WHERE repo = ? AND changeset_id = ?", (commit.repo, commit.id)
    )
    return gone


def unretire(conn: sqlite3.Connection, repo: str, node_ids: Sequence[str]) -> None:
    conn.executemany(
        "UPDATE nodes SET retired_at = NULL, valid_to = NULL WHERE repo = ? AND id = ?",
        [(repo, node_id) for node_id in node_ids],
    )


def forget_commits(conn: sqlite3.Connection, repo: str, commit_ids: Sequence[str]) -> None:
    """Removes the records of a forgotten source's commits (a source id is the user's text,
    a record names the nodes that held the source's words) and brings back the facts they
    retired (their successors are gone)."""
    for chunk in chunks(commit_ids, 400):
        marks = ",".join("?" * len(chunk))
        for row in conn.execute(
            f"SELECT {_COLUMNS} FROM commits WHERE repo = ? AND id IN ({marks})", [repo, *chunk]
        ).fetchall():
            unretire(conn, repo, _record(row).retired)
        conn.execute(f"DELETE FROM commits WHERE repo = ? AND id IN ({marks})", [repo, *chunk])


def _record(row: Row) -> CommitRecord:
    commit_id, repo, seq, at, session_id, source_id, nodes, links, retired, reworded = row
    return CommitRecord(
        id=commit_id,
        repo=repo,
        seq=int(seq),
        committed_at=datetime.fromisoformat(at),
        session_id=session_id,
        source_id=source_id,
        node_ids=tuple(json.loads(unpack_text(nodes))),
        links=tuple(Link(s, d, LinkType(t)) for s, d, t in json.loads(unpack_text(links))),
        retired=tuple(json.loads(retired)),
        reworded=tuple(json.loads(reworded)),
    )
