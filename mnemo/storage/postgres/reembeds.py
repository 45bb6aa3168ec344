"""The SQL of a repo's re-embedding (`mnemo.graph.reembed`) on PostgreSQL: new vectors staged
beside the old ones in `staged_vectors`, keyed by node id as `vectors` is, then put in place in
one transaction. SQLite's `mnemo/storage/sqlite/reembeds.py`, statement for statement."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from psycopg import sql

from mnemo.errors import StorageError
from mnemo.graph.model import NODE_TYPES, Vector
from mnemo.graph.reembed import Staging, Unstaged
from mnemo.storage import vector_log
from mnemo.storage.lexical.source import STATE, state_of
from mnemo.storage.postgres.connection import Connection
from mnemo.storage.postgres.schema import vector_index_name
from mnemo.storage.postgres.vectors import as_array


async def _one(conn: Connection, statement: str, params: Sequence[object]) -> tuple[object, ...]:
    cur = await conn.execute(statement, params)
    row = await cur.fetchone()
    if row is None:
        raise StorageError("unavailable", f"no row for {statement.split()[0]}")
    return row


def _whole(value: object) -> int:
    return int(value) if isinstance(value, int) else 0


async def _log_state(conn: Connection, repo: str) -> tuple[int, int]:
    cur = await conn.execute(STATE.replace("?", "%s"), (repo,))
    return state_of(await cur.fetchall())


async def begin(conn: Connection, repo: str, embedder: str, dim: int) -> Staging:
    """`sqlite.reembeds.begin`, in the caller's transaction."""
    cur = await conn.execute("SELECT embedder, dim FROM reembeds WHERE repo = %s FOR UPDATE",
                             (repo,))
    found = await cur.fetchone()
    resumed = found is not None and (found[0], found[1]) == (embedder, dim)
    if not resumed:
        await conn.execute("DELETE FROM staged_vectors WHERE repo = %s", (repo,))
        await conn.execute(
            "INSERT INTO reembeds (repo, embedder, dim, seq, started_at)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (repo) DO UPDATE SET"
            " embedder = excluded.embedder, dim = excluded.dim, seq = excluded.seq,"
            " started_at = excluded.started_at",
            (repo, embedder, dim, (await _log_state(conn, repo))[0], datetime.now(UTC)),
        )
    total = _whole((await _one(conn, "SELECT count(*) FROM nodes WHERE repo = %s", (repo,)))[0])
    staged = _whole((await _one(
        conn, "SELECT count(*) FROM staged_vectors WHERE repo = %s", (repo,)))[0])
    return Staging(embedder, dim, staged, total, resumed)


async def unstaged(
    conn: Connection, repo: str, after: int, limit: int, upto: int | None
) -> list[Unstaged]:
    """`sqlite.reembeds.unstaged`."""
    cur = await conn.execute(
        "SELECT n.rowid, n.id, n.type, n.text FROM nodes n WHERE n.repo = %s AND n.rowid > %s"
        " AND (%s::bigint IS NULL OR n.rowid <= %s::bigint)"
        " AND NOT EXISTS (SELECT 1 FROM staged_vectors s WHERE s.node_id = n.id)"
        " ORDER BY n.rowid LIMIT %s",
        (repo, after, upto, upto, limit),
    )
    return [Unstaged(_whole(rowid), str(node_id), NODE_TYPES[str(kind)], str(text))
            for rowid, node_id, kind, text in await cur.fetchall()]


async def last_rowid(conn: Connection, repo: str) -> int:
    """`sqlite.reembeds.last_rowid`."""
    cur = await conn.execute("SELECT coalesce(max(rowid), 0) FROM nodes WHERE repo = %s",
                             (repo,))
    row = await cur.fetchone()
    return 0 if row is None else _whole(row[0])


async def stage(conn: Connection, nodes: Sequence[Unstaged], vectors: Vector) -> None:
    """`sqlite.reembeds.stage`, in the caller's transaction."""
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO staged_vectors (node_id, repo, vec)"
            " SELECT id, repo, %s FROM nodes WHERE id = %s AND rowid = %s"
            " ON CONFLICT (node_id) DO UPDATE SET vec = excluded.vec",
            [(as_array(vector), node.id, node.rowid)
             for node, vector in zip(nodes, vectors, strict=True)],
        )


async def unstage_changed(conn: Connection, repo: str) -> None:
    """`sqlite.reembeds.unstage_changed`, in the caller's transaction."""
    cur = await conn.execute("SELECT seq FROM reembeds WHERE repo = %s FOR UPDATE", (repo,))
    found = await cur.fetchone()
    if found is None:
        raise StorageError("unavailable", f"repo {repo!r} is not being re-embedded")
    seen = _whole(found[0])
    seq, horizon = await _log_state(conn, repo)
    try:
        changed = vector_log.moved(seen, seq, horizon)
    except vector_log.Reload:
        await conn.execute("DELETE FROM staged_vectors WHERE repo = %s", (repo,))
        changed = False
    if changed:
        await conn.execute(
            "DELETE FROM staged_vectors s USING nodes n WHERE s.node_id = n.id AND n.rowid IN"
            " (SELECT node FROM lexical_log WHERE repo = %s AND seq > %s AND seq <= %s)",
            (repo, seen, seq),
        )
    await conn.execute("UPDATE reembeds SET seq = %s WHERE repo = %s", (seq, repo))


async def drop_vector_index(conn: Connection, repo: str) -> None:
    """Drops the repo's HNSW index, in a transaction of its own before the switch: its cast
    to the old dimension would refuse the new vectors, and keeping it would insert each of
    them into its graph, one at a time, inside the switch (it is built again after). Its
    lock on `vectors` is held only for the drop, not for the switch's writes."""
    await conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(
        sql.Identifier(vector_index_name(repo))))


async def switch(conn: Connection, repo: str) -> tuple[int, int]:
    """`sqlite.reembeds.switch`, in the caller's transaction.

    Raises:
        StorageError: as `sqlite.reembeds.switch`.
    """
    cur = await conn.execute("SELECT embedder, dim FROM reembeds WHERE repo = %s FOR UPDATE",
                             (repo,))
    found = await cur.fetchone()
    if found is None:
        raise StorageError("unavailable", f"repo {repo!r} is not being re-embedded")
    embedder, dim = found
    missing = _whole((await _one(
        conn,
        "SELECT count(*) FROM nodes n WHERE n.repo = %s"
        " AND NOT EXISTS (SELECT 1 FROM staged_vectors s WHERE s.node_id = n.id)",
        (repo,),
    ))[0])
    if missing:
        raise StorageError(
            "unavailable", f"{missing} nodes of repo {repo!r} have no new vector yet"
        )
    await conn.execute("DELETE FROM vectors WHERE repo = %s", (repo,))
    cur = await conn.execute(
        "INSERT INTO vectors (node_id, repo, vec)"
        " SELECT node_id, repo, vec FROM staged_vectors WHERE repo = %s",
        (repo,),
    )
    moved = cur.rowcount
    await conn.execute("DELETE FROM staged_vectors WHERE repo = %s", (repo,))
    cur = await conn.execute(
        "UPDATE repos SET embedder = %s, dim = %s, vectors_generation = vectors_generation + 1"
        " WHERE name = %s RETURNING vectors_generation",
        (embedder, dim, repo),
    )
    recorded = await cur.fetchone()
    if recorded is None:
        raise StorageError("unavailable", f"repo {repo!r} has no record")
    await conn.execute("DELETE FROM reembeds WHERE repo = %s", (repo,))
    return _whole(recorded[0]), max(moved, 0)
