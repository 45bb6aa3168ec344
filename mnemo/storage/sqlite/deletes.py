"""The SQL of the graph's deletes on SQLite: nodes by id, what a source committed, one commit's
work (a revert). Each is one transaction under the repo's lock; erasures end with `scrub`."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.graph import shares
from mnemo.graph.erasure import Inherited, Plan, Scope, Shared
from mnemo.graph.model import Vector
from mnemo.graph.ports import SideWrite
from mnemo.graph.shares import Contribution
from mnemo.storage.graph_rows import KNOWLEDGE, ROUTES, scope_of, scope_query
from mnemo.storage.row import loads_object
from mnemo.storage.sqlite import history
from mnemo.storage.sqlite.database import chunks
from mnemo.storage.sqlite.rows import half_blob
from mnemo.storage.sqlite.sessions import side_writes


def delete_nodes(db: SqliteUtilsDatabase, repo: str, ids: list[str]) -> list[str]:
    """See `GraphStore.delete_nodes`: returns those of `ids` that were rows."""
    gone: list[str] = []
    with db.atomic():
        for chunk in chunks(ids, 500):
            gone += [row[0] for row in db.conn.execute(
                f"DELETE FROM nodes WHERE repo = ? AND id IN ({','.join('?' * len(chunk))})"
                " RETURNING id", [repo, *chunk])]
        if gone:
            scrub(db.conn)
    return gone


def _scope(conn: sqlite3.Connection, repo: str, key: str, *, one: bool) -> Scope:
    return scope_of(conn.execute(*scope_query(repo, key, one=one)), history.stored_ids)


def _types(conn: sqlite3.Connection, repo: str, ids: Iterable[str]) -> dict[str, str]:
    """The type of each of these nodes that is a node of the repo."""
    found: dict[str, str] = {}
    for chunk in chunks(sorted(ids), 400):
        marks = ",".join("?" * len(chunk))
        found.update(conn.execute(
            f"SELECT id, type FROM nodes WHERE repo = ? AND id IN ({marks})", [repo, *chunk]))
    return found


def inherited(
    db: SqliteUtilsDatabase, repo: str, key: str, *, one: bool = False
) -> Inherited:
    """What withdrawing the commits of the source `key` (with `one`, the commit `key`)
    re-words (`graph.erasure.Inherited`): their intents with linked procedures, oldest first,
    and the facts and instructions they created or joined."""
    conn = db.conn
    scope = _scope(conn, repo, key, one=one)
    intents = {row[0] for row in conn.execute(
        "SELECT id FROM nodes WHERE repo = ? AND source_id = ? AND type = 'intent'",
        (repo, key))}
    intents.update(i for i, kind in _types(conn, repo, scope.added).items() if kind == "intent")
    intents.update(scope.reworded)
    ordered = sorted(intents)
    procedures: list[tuple[str, str, object, str | None]] = []
    for chunk in chunks(ordered, 400):
        marks = ",".join("?" * len(chunk))
        procedures.extend(
            (intent_id, node_id, json.loads(data), owner)
            for intent_id, node_id, data, owner in conn.execute(
                f"SELECT i.id, n.id, n.data, n.source_id FROM nodes i"
                f" JOIN links l ON l.src = i.rowid JOIN nodes n ON n.rowid = l.dst"
                f" WHERE i.id IN ({marks}) AND l.type = 'hierarchical'"
                f" AND n.type = 'procedural' ORDER BY n.created_at, n.rowid", chunk))
    shared: list[Shared] = []
    rows = list(conn.execute(
        "SELECT id, text, data, source_id, owners FROM nodes WHERE repo = ? AND source_id = ?"
        " AND type IN ('semantic', 'procedural')", (repo, key)))
    for chunk in chunks(sorted(scope.added | scope.joined), 400):
        marks = ",".join("?" * len(chunk))
        rows.extend(conn.execute(
            f"SELECT id, text, data, source_id, owners FROM nodes WHERE repo = ? AND id IN"
            f" ({marks}) AND type IN ('semantic', 'procedural')", [repo, *chunk]))
    for node_id, text, data, source, owners in sorted(dict.fromkeys(rows)):
        shared.append((node_id, Contribution(text, loads_object(data), source),
                       owners and json.loads(owners),
                       node_id in scope.added or source == key))
    return Inherited(ordered, procedures, shared, frozenset(scope.commits))


def _withdraw(
    conn: sqlite3.Connection, repo: str, key: str, scope: Scope, plan: Plan
) -> list[str]:
    """Takes the work of `scope`'s commits off the graph: links counted down, steps, facts no
    other commit supports and routes left unlinked deleted, the rest re-worded per `plan`,
    retired facts restored. Returns the ids of the nodes that went."""
    mine = dict(conn.execute(
        "SELECT id, type FROM nodes WHERE repo = ? AND source_id = ?", (repo, key)))
    mine.update(_types(conn, repo, scope.added))
    own = [i for i, kind in sorted(mine.items()) if kind not in (*ROUTES, *KNOWLEDGE)]
    own += [i for i, (left, _) in sorted(plan.shared.items()) if left is None] + plan.dropped
    routes = {i for i, kind in mine.items() if kind in ROUTES} | set(plan.intents)
    ends = {end for src, dst, _ in scope.links for end in (src, dst)}
    routes.update(i for i, kind in _types(conn, repo, ends).items() if kind in ROUTES)
    ends_of = "src = (SELECT rowid FROM nodes WHERE id = ?) AND dst = (SELECT rowid FROM nodes" \
        " WHERE id = ?) AND type = ?"
    conn.executemany(f"UPDATE links SET refs = refs - 1 WHERE {ends_of}", scope.links)
    conn.executemany(f"DELETE FROM links WHERE {ends_of} AND refs <= 0", scope.links)
    kinds = ",".join(f"'{kind}'" for kind in ROUTES)
    for chunk in chunks(own, 400):
        marks = ",".join("?" * len(chunk))
        routes.update(row[0] for row in conn.execute(
            f"SELECT n.id FROM nodes d JOIN links l ON l.dst = d.rowid"
            f" JOIN nodes n ON n.rowid = l.src WHERE d.id IN ({marks}) AND n.type IN ({kinds})"
            f" UNION SELECT n.id FROM nodes d JOIN links l ON l.src = d.rowid"
            f" JOIN nodes n ON n.rowid = l.dst WHERE d.id IN ({marks}) AND n.type IN ({kinds})",
            [*chunk, *chunk]))
        conn.execute(f"DELETE FROM nodes WHERE id IN ({marks})", chunk)
    for intent_id, (heir, vector) in plan.heirs.items():
        conn.execute(
            "UPDATE nodes SET text = ?, data = json_set(data, '$.intent', ?),"
            " source_id = ? WHERE repo = ? AND id = ?",
            (heir.text, heir.text, heir.source_id, repo, intent_id))
        _revector(conn, intent_id, vector)
    for node_id, (left, made) in plan.shared.items():
        if left is not None:
            conn.execute(
                "UPDATE nodes SET text = ?, data = ?, source_id = ?, owners = ? WHERE id = ?",
                (left.heir.text, json.dumps(left.heir.data, sort_keys=True),
                 left.heir.source_id, shares.dumps(left.owners), node_id))
            if made is not None:
                _revector(conn, node_id, made)
    # The routes still there without links, counted once.
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
    history.unretire(conn, repo, scope.retired)
    return own + orphans


def _revector(conn: sqlite3.Connection, node_id: str, vector: Vector) -> None:
    conn.execute("UPDATE vectors SET vec = ? WHERE node = (SELECT rowid FROM nodes WHERE id = ?)",
                 (half_blob(vector), node_id))


def withdraw(
    db: SqliteUtilsDatabase,
    repo: str,
    key: str,
    also: Sequence[SideWrite],
    plan: Plan,
    revert: tuple[str, str] | None,
) -> list[str]:
    """See `GraphStore.withdraw`: the ids of the nodes that went. With `revert`, reverts the
    commit `key`; else forgets the source `key` with its stored steps and records, then `scrub`."""
    conn = db.conn
    with db.atomic():
        scope = _scope(conn, repo, key, one=revert is not None)
        gone = _withdraw(conn, repo, key, scope, plan)
        if revert is not None:
            history.reverted(conn, repo, key, *revert)
            return gone
        # A node still used elsewhere stays, but no longer names the source.
        conn.execute(
            "UPDATE nodes SET source_id = NULL WHERE repo = ? AND source_id = ?", (repo, key))
        history.forget_commits(conn, repo, scope.records)
        _erase_steps(conn, key, scope.records)
        side_writes(db, also)
        if gone or plan.heirs or plan.shared or scope.records:
            scrub(conn)
    return gone


def _erase_steps(conn: sqlite3.Connection, source_id: str, commits: Sequence[str]) -> None:
    """Erases a forgotten source's stored steps: a finished episode goes whole; an open one's
    committed steps keep their index but lose words, metadata and vector."""
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
    """An erasure's end, in its transaction: merges the nodes' FTS5 index (deleted words stay
    in old segments until then; costs the whole index) and gives the lexical index a new epoch
    (each slot wipes itself before answering again)."""
    conn.execute("INSERT INTO nodes_fts(nodes_fts) VALUES ('optimize')")
    conn.execute("UPDATE lexical_epoch SET epoch = lower(hex(randomblob(16)))")
