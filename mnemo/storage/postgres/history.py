"""The commit history's rows in PostgreSQL (`mnemo.graph.history`): written in a commit's own
transaction, read back, and undone. A record holds ids only (jsonb lists)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import cast

from psycopg.types.json import Jsonb

from mnemo.graph.commit import CommitPlan
from mnemo.graph.history import CommitRecord
from mnemo.graph.model import Link, LinkType
from mnemo.storage.postgres.connection import Connection
from mnemo.storage.row import Column, Row

_COLUMNS = "id, repo, seq, committed_at, session_id, source_id, nodes, links, retired, reworded"


async def insert_links(conn: Connection, repo: str, links: Sequence[Link]) -> list[Link]:
    """Inserts the links not there yet; returns those it inserted (what the commit added)."""
    if not links:
        return []
    cur = await conn.execute(
        "INSERT INTO links (repo, src, dst, type)"
        " SELECT %s, s, d, t FROM unnest(%s::text[], %s::text[], %s::text[]) AS x(s, d, t)"
        " ON CONFLICT DO NOTHING RETURNING src, dst, type",
        (repo, [k.src for k in links], [k.dst for k in links], [k.type.value for k in links]),
    )
    inserted = {(str(s), str(d), str(t)) for s, d, t in await cur.fetchall()}
    return [k for k in dict.fromkeys(links) if (k.src, k.dst, k.type.value) in inserted]


async def record(conn: Connection, plan: CommitPlan, links: Sequence[Link]) -> None:
    """Writes the commit's record (the caller holds the repo's lock: `seq` is max + 1)."""
    at = datetime.fromisoformat(plan.created_at)
    await conn.execute(
        f"INSERT INTO commits ({_COLUMNS})"
        " SELECT %s, %s, COALESCE(MAX(seq), 0) + 1, %s, %s, %s, %s, %s, %s, %s"
        " FROM commits WHERE repo = %s",
        (
            plan.changeset_id, plan.repo, at, plan.session_id, plan.source_id,
            Jsonb([n.id for n, _, _ in plan.nodes]),
            Jsonb([[k.src, k.dst, k.type.value] for k in links]),
            Jsonb([node_id for node_id, _ in plan.retired]),
            Jsonb(sorted(plan.rewordings)),
            plan.repo,
        ),
    )
    for node_id, until in plan.retired:
        await conn.execute(
            "UPDATE nodes SET retired_at = %s, valid_to = %s WHERE repo = %s AND id = %s",
            (at, at if until is None else datetime.fromisoformat(until), plan.repo, node_id),
        )


async def log(
    conn: Connection, repo: str, *, limit: int | None, after_seq: int | None
) -> list[CommitRecord]:
    """The repo's commits, newest first: the `limit` newest, or every one after `after_seq`."""
    if after_seq is not None:
        cur = await conn.execute(
            f"SELECT {_COLUMNS} FROM commits WHERE repo = %s AND seq > %s ORDER BY seq DESC",
            (repo, after_seq),
        )
    else:
        cur = await conn.execute(
            f"SELECT {_COLUMNS} FROM commits WHERE repo = %s ORDER BY seq DESC LIMIT %s",
            (repo, limit),
        )
    return [_record(row) for row in await cur.fetchall()]


async def one(conn: Connection, repo: str, commit_id: str) -> CommitRecord | None:
    cur = await conn.execute(
        f"SELECT {_COLUMNS} FROM commits WHERE repo = %s AND id = %s", (repo, commit_id)
    )
    row = await cur.fetchone()
    return None if row is None else _record(row)


async def undo(conn: Connection, commit: CommitRecord) -> list[str]:
    """Deletes the commit's nodes (their links and vectors with them) and links, brings back
    the facts it retired, and forgets that it was applied; returns the ids of the nodes
    deleted. The caller holds the repo's lock and the transaction."""
    cur = await conn.execute(
        "DELETE FROM nodes WHERE repo = %s AND id = ANY(%s) RETURNING id",
        (commit.repo, list(commit.node_ids)),
    )
    gone = {str(i) for (i,) in await cur.fetchall()}
    if commit.links:
        await conn.execute(
            "DELETE FROM links l USING unnest(%s::text[], %s::text[], %s::text[]) AS x(s, d, t)"
            " WHERE l.repo = %s AND l.src = x.s AND l.dst = x.d AND l.type = x.t",
            ([k.src for k in commit.links], [k.dst for k in commit.links],
             [k.type.value for k in commit.links], commit.repo),
        )
    await unretire(conn, commit.repo, commit.retired)
    await conn.execute("DELETE FROM commits WHERE id = %s", (commit.id,))
    await conn.execute("DELETE FROM applied_changesets WHERE id = %s", (commit.id,))
    await conn.execute(
        "DELETE FROM ingests WHERE repo = %s AND changeset_id = %s", (commit.repo, commit.id)
    )
    return [i for i in commit.node_ids if i in gone]


async def unretire(conn: Connection, repo: str, node_ids: Sequence[str]) -> None:
    if node_ids:
        await conn.execute(
            "UPDATE nodes SET retired_at = NULL, valid_to = NULL"
            " WHERE repo = %s AND id = ANY(%s)",
            (repo, list(node_ids)),
        )


async def forget_commits(conn: Connection, repo: str, commit_ids: Sequence[str]) -> None:
    """Removes the records of a forgotten source's commits (a source id is the user's text,
    a record names the nodes that held the source's words) and brings back the facts they
    retired (their successors are gone)."""
    cur = await conn.execute(
        "DELETE FROM commits WHERE repo = %s AND id = ANY(%s) RETURNING retired",
        (repo, list(commit_ids)),
    )
    for row in await cur.fetchall():
        retired = cast(list[Column], row[0])
        await unretire(conn, repo, [str(i) for i in retired])


def _record(row: Row) -> CommitRecord:
    commit_id, repo, seq, at, session_id, source_id, nodes, links, retired, reworded = row
    return CommitRecord(
        id=str(commit_id),
        repo=str(repo),
        seq=int(seq),
        committed_at=at,
        session_id=session_id,
        source_id=source_id,
        node_ids=tuple(str(i) for i in nodes),
        links=tuple(Link(str(s), str(d), LinkType(t)) for s, d, t in links),
        retired=tuple(str(i) for i in retired),
        reworded=tuple(str(i) for i in reworded),
    )
