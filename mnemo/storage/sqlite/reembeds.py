"""The SQL of a repo's re-embedding (`mnemo.graph.reembed`) on SQLite: new vectors staged
beside the old ones, keyed by their node's rowid as `vectors` is, then put in place in one
transaction. Each function runs in the database's thread (`Database.run`)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.errors import StorageError
from mnemo.graph.model import NODE_TYPES, Vector, now_utc
from mnemo.graph.reembed import Staging, Unstaged
from mnemo.storage import vector_log
from mnemo.storage.lexical.source import STATE, state_of
from mnemo.storage.sqlite.rows import half_blob

# SQLite's largest rowid: no bound.
MAX_ROWID = 2**63 - 1

_OF_REPO = "SELECT rowid FROM nodes WHERE repo = ?"


def _log_state(db: SqliteUtilsDatabase, repo: str) -> tuple[int, int]:
    return state_of(db.conn.execute(STATE, (repo,)).fetchall())


def begin(db: SqliteUtilsDatabase, repo: str, embedder: str, dim: int) -> Staging:
    """Starts the repo's re-embedding with `embedder` of `dim`, or carries on with the one
    under way when it is of the same embedder and dimension (another's staged vectors go)."""
    with db.atomic():
        conn = db.conn
        found = conn.execute(
            "SELECT embedder, dim FROM reembeds WHERE repo = ?", (repo,)
        ).fetchall()
        resumed = bool(found) and tuple(found[0]) == (embedder, dim)
        if not resumed:
            conn.execute(f"DELETE FROM staged_vectors WHERE node IN ({_OF_REPO})", (repo,))
            conn.execute(
                "INSERT OR REPLACE INTO reembeds (repo, embedder, dim, seq, started_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (repo, embedder, dim, _log_state(db, repo)[0], now_utc().isoformat()),
            )
        (total,), = conn.execute("SELECT count(*) FROM nodes WHERE repo = ?", (repo,))
        (staged,), = conn.execute(
            f"SELECT count(*) FROM staged_vectors WHERE node IN ({_OF_REPO})", (repo,)
        )
    return Staging(embedder, dim, int(staged), int(total), resumed)


def unstaged(
    db: SqliteUtilsDatabase, repo: str, after: int, limit: int, upto: int | None
) -> list[Unstaged]:
    """Up to `limit` of the repo's nodes past rowid `after` (at most `upto`) with no staged
    vector."""
    rows = db.conn.execute(
        "SELECT n.rowid, n.id, n.type, n.text FROM nodes n WHERE n.repo = ? AND n.rowid > ?"
        " AND n.rowid <= ?"
        " AND NOT EXISTS (SELECT 1 FROM staged_vectors s WHERE s.node = n.rowid)"
        " ORDER BY n.rowid LIMIT ?",
        (repo, after, MAX_ROWID if upto is None else upto, limit),
    ).fetchall()
    return [Unstaged(int(rowid), node_id, NODE_TYPES[kind], text)
            for rowid, node_id, kind, text in rows]


def last_rowid(db: SqliteUtilsDatabase, repo: str) -> int:
    """The highest rowid of the repo's nodes, 0 when it has none."""
    (last,), = db.conn.execute("SELECT coalesce(max(rowid), 0) FROM nodes WHERE repo = ?",
                               (repo,)).fetchall()
    return int(last)


def stage(db: SqliteUtilsDatabase, nodes: Sequence[Unstaged], vectors: Vector) -> None:
    """Stages each node's vector, if the node is still there (one deleted meanwhile has none,
    and its rowid may be another node's by now)."""
    with db.atomic():
        db.conn.executemany(
            "INSERT OR REPLACE INTO staged_vectors (node, vec)"
            " SELECT rowid, ? FROM nodes WHERE rowid = ? AND id = ?",
            [(half_blob(vector), node.rowid, node.id)
             for node, vector in zip(nodes, vectors, strict=True)],
        )


def unstage_changed(db: SqliteUtilsDatabase, repo: str) -> None:
    """Drops the staged vectors of the nodes whose text changed since the re-embedding last
    looked at the node log (they are embedded again), or every staged vector of the repo
    when the log no longer reaches back that far; the re-embedding then looks from here."""
    with db.atomic():
        conn = db.conn
        found = conn.execute("SELECT seq FROM reembeds WHERE repo = ?", (repo,)).fetchall()
        if not found:
            raise StorageError("unavailable", f"repo {repo!r} is not being re-embedded")
        seen = int(found[0][0])
        seq, horizon = _log_state(db, repo)
        try:
            changed = vector_log.moved(seen, seq, horizon)
        except vector_log.Reload:
            conn.execute(f"DELETE FROM staged_vectors WHERE node IN ({_OF_REPO})", (repo,))
            changed = False
        if changed:
            conn.execute(
                "DELETE FROM staged_vectors WHERE node IN (SELECT node FROM lexical_log"
                " WHERE repo = ? AND seq > ? AND seq <= ?)",
                (repo, seen, seq),
            )
        conn.execute("UPDATE reembeds SET seq = ? WHERE repo = ?", (seq, repo))


def switch(db: SqliteUtilsDatabase, repo: str) -> tuple[int, int]:
    """Puts the staged vectors in place of the repo's, records the re-embedding's embedder
    and dimension with the next generation, and ends the re-embedding, in one transaction.
    Returns (generation, vectors put in place).

    Raises:
        StorageError: "unavailable" when no re-embedding is under way, or a node of the repo
            has no staged vector (nothing is written).
    """
    with db.atomic():
        conn = db.conn
        found = conn.execute(
            "SELECT embedder, dim FROM reembeds WHERE repo = ?", (repo,)
        ).fetchall()
        if not found:
            raise StorageError("unavailable", f"repo {repo!r} is not being re-embedded")
        embedder, dim = found[0]
        (missing,), = conn.execute(
            "SELECT count(*) FROM nodes n WHERE n.repo = ?"
            " AND NOT EXISTS (SELECT 1 FROM staged_vectors s WHERE s.node = n.rowid)",
            (repo,),
        )
        if missing:
            raise StorageError(
                "unavailable", f"{missing} nodes of repo {repo!r} have no new vector yet"
            )
        conn.execute(f"DELETE FROM vectors WHERE node IN ({_OF_REPO})", (repo,))
        moved = conn.execute(
            f"INSERT INTO vectors (node, vec) SELECT node, vec FROM staged_vectors"
            f" WHERE node IN ({_OF_REPO})",
            (repo,),
        ).rowcount
        conn.execute(f"DELETE FROM staged_vectors WHERE node IN ({_OF_REPO})", (repo,))
        recorded = conn.execute(
            "UPDATE repos SET embedder = ?, dim = ?,"
            " vectors_generation = vectors_generation + 1 WHERE name = ?"
            " RETURNING vectors_generation",
            (embedder, dim, repo),
        ).fetchall()
        if not recorded:
            raise StorageError("unavailable", f"repo {repo!r} has no record")
        conn.execute("DELETE FROM reembeds WHERE repo = ?", (repo,))
    return int(recorded[0][0]), int(moved)
