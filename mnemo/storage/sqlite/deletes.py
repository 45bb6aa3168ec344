"""The SQL of the graph's deletes on SQLite: nodes by id, and everything a source (an ingested
source, a session, an episode) committed. Each function is one transaction, run by
`SqliteGraph` under the repo's lock (which also forgets the vectors of what went); each is an
erasure, and ends with `scrub`."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.graph.erasure import Inherited, Plan, Scope
from mnemo.graph.ports import SideWrite
from mnemo.storage.sqlite import history
from mnemo.storage.sqlite.database import chunks
from mnemo.storage.sqlite.rows import half_blob, unpack_text
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
        if gone:
            scrub(db.conn)
    return gone


# What a source committed: the commits of an ingested source, of a session, or of an
# episode (those its steps were committed in).
_SCOPE = (
    "SELECT id, nodes, reworded FROM commits WHERE repo = ?1 AND (source_id = ?2"
    " OR session_id = ?2 OR id IN (SELECT committed_in FROM steps WHERE episode_id = ?2"
    " AND committed_in IS NOT NULL))"
)


def _scope(conn: sqlite3.Connection, repo: str, source_id: str) -> Scope:
    commits: list[str] = []
    added: set[str] = set()
    reworded: set[str] = set()
    for commit_id, nodes, words in conn.execute(_SCOPE, (repo, source_id)):
        commits.append(commit_id)
        added.update(json.loads(unpack_text(nodes)))
        reworded.update(json.loads(words))
    return Scope(commits, added, reworded)


def _types(conn: sqlite3.Connection, repo: str, ids: Iterable[str]) -> dict[str, str]:
    """The type of each of these nodes that is a node of the repo."""
    found: dict[str, str] = {}
    for chunk in chunks(sorted(ids), 400):
        marks = ",".join("?" * len(chunk))
        found.update(conn.execute(
            f"SELECT id, type FROM nodes WHERE repo = ? AND id IN ({marks})", [repo, *chunk]))
    return found


def inherited(
    db: SqliteUtilsDatabase, repo: str, source_id: str
) -> Inherited:
    """The intents the source created or re-worded, and (intent, data, source) of each
    procedure of another source linked to them, oldest first (`mnemo.graph.erasure.heirs`).
    The source is an ingested source, a session or an episode (`Scope`)."""
    conn = db.conn
    scope = _scope(conn, repo, source_id)
    intents = {row[0] for row in conn.execute(
        "SELECT id FROM nodes WHERE repo = ? AND source_id = ? AND type = 'intent'",
        (repo, source_id))}
    intents.update(i for i, kind in _types(conn, repo, scope.added).items() if kind == "intent")
    intents.update(scope.reworded)
    ordered = sorted(intents)
    procedures: list[tuple[str, object, str | None]] = []
    for chunk in chunks(ordered, 400):
        marks = ",".join("?" * len(chunk))
        procedures.extend(
            (intent_id, json.loads(data), owner)
            for intent_id, node_id, data, owner in conn.execute(
                f"SELECT i.id, n.id, n.data, n.source_id FROM nodes i"
                f" JOIN links l ON l.src = i.rowid JOIN nodes n ON n.rowid = l.dst"
                f" WHERE i.id IN ({marks}) AND l.type = 'hierarchical'"
                f" AND n.type = 'procedural' AND n.source_id IS NOT ?"
                f" ORDER BY n.created_at, n.rowid",
                [*chunk, source_id])
            if node_id not in scope.added)
    return ordered, procedures


def delete_source(
    db: SqliteUtilsDatabase,
    repo: str,
    source_id: str,
    also: Sequence[SideWrite],
    plan: Plan,
) -> list[str]:
    """See `GraphStore.delete_source`: returns the ids of the nodes that went. `plan` says
    what becomes of the intents the source created or re-worded (`inherited`). The source is
    an ingested source, a session or an episode (`Scope`): a session's or an episode's
    stored steps go too (`_erase_steps`). The search index is merged (FTS5 keeps a deleted
    entry's words in its old segments until then) and the lexical index's stores are told
    to start again (`lexical_epoch`): erasure."""
    conn = db.conn
    with db.atomic():
        scope = _scope(conn, repo, source_id)
        mine = dict(conn.execute(
            "SELECT id, type FROM nodes WHERE repo = ? AND source_id = ?", (repo, source_id)))
        mine.update(_types(conn, repo, scope.added))
        own = [i for i, kind in sorted(mine.items()) if kind not in ("tag", "intent")]
        routes = {i for i, kind in mine.items() if kind in ("tag", "intent")}
        routes.update(plan.intents)
        own.extend(plan.dropped)
        for chunk in chunks(own, 400):
            marks = ",".join("?" * len(chunk))
            routes.update(row[0] for row in conn.execute(
                f"SELECT n.id FROM nodes d JOIN links l ON l.dst = d.rowid"
                f" JOIN nodes n ON n.rowid = l.src"
                f" WHERE d.id IN ({marks}) AND n.type IN ('tag', 'intent')",
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
                " (SELECT 1 FROM links WHERE src = n.rowid OR dst = n.rowid)",
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
        history.forget_commits(conn, repo, scope.commits)
        _erase_steps(conn, source_id, scope.commits)
        side_writes(db, also)
        if own or orphans or plan.heirs or scope.commits:
            scrub(conn)
    return own + orphans


def _erase_steps(conn: sqlite3.Connection, source_id: str, commits: Sequence[str]) -> None:
    """A forgotten session's or episode's stored steps: an episode that is over (committed
    or discarded) goes with its steps; of one still open, the steps it committed keep their
    place (their indexes) but none of their words, metadata or subgoal vector."""
    episodes = conn.execute(
        "SELECT id, status FROM episodes WHERE session_id = ?1 OR id = ?1", (source_id,)
    ).fetchall()
    over = [episode for episode, status in episodes if status != "open"]
    still_open = [episode for episode, status in episodes if status == "open"]
    for chunk in chunks(over, 400):
        marks = ",".join("?" * len(chunk))
        for table in ("steps", "task_results"):
            conn.execute(f"DELETE FROM {table} WHERE episode_id IN ({marks})", chunk)
        conn.execute(f"DELETE FROM episodes WHERE id IN ({marks})", chunk)
    for episode in still_open:
        for chunk in chunks(list(commits), 400):
            marks = ",".join("?" * len(chunk))
            conn.execute(
                "UPDATE steps SET observation = '', action = '', state_summary = '',"
                " subgoal = '', metadata = NULL, subgoal_vec = zeroblob(length(subgoal_vec))"
                f" WHERE episode_id = ? AND committed_in IN ({marks})", [episode, *chunk])


def scrub(conn: sqlite3.Connection) -> None:
    """What an erasure does after its deletes, in its transaction: merges the nodes' search
    index into one segment (FTS5 marks a deleted entry in a new segment and keeps its words
    in the old ones until a merge; the connection's `secure_delete` zeroes the pages that
    held them), and gives the lexical index's stores a new epoch, so that each wipes its
    documents before it answers again (`mnemo.storage.lexical`). The merge costs time in
    proportion to the whole index."""
    conn.execute("INSERT INTO nodes_fts(nodes_fts) VALUES ('optimize')")
    conn.execute("UPDATE lexical_epoch SET epoch = lower(hex(randomblob(16)))")
