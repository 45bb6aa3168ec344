"""The commit history's rows in PostgreSQL (`graph.history`), written in a commit's
transaction; a record holds ids only."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import cast

from psycopg.types.json import Jsonb

from mnemo.graph import shares
from mnemo.graph.commit import CommitPlan
from mnemo.graph.model import Link
from mnemo.ports import JSONObject
from mnemo.storage.graph_rows import COMMIT_COLUMNS
from mnemo.storage.postgres.connection import Connection
from mnemo.storage.row import Row

_INSERT = (
    f"INSERT INTO commits ({COMMIT_COLUMNS})"
    " SELECT %s, %s, COALESCE(MAX(seq), 0) + 1, %s, %s, %s, %s, %s, %s, %s, %s, NULL, %s"
    " FROM commits WHERE repo = %s"
)


async def add_links(conn: Connection, repo: str, links: Sequence[Link]) -> None:
    """Inserts the commit's links; one already there counts one more commit (`refs`)."""
    if links:
        await conn.execute(
            "INSERT INTO links (repo, src, dst, type)"
            " SELECT %s, s, d, t FROM unnest(%s::text[], %s::text[], %s::text[]) AS x(s, d, t)"
            " ON CONFLICT (src, dst, type) DO UPDATE SET refs = links.refs + 1",
            (repo, [k.src for k in links], [k.dst for k in links],
             [k.type.value for k in links]),
        )


async def joined(conn: Connection, plan: CommitPlan) -> None:
    """Adds the commit's contribution to each node it joined (`graph.shares`); runs before
    the rewordings."""
    for node_id, brought in plan.joined.items():
        cur = await conn.execute(
            "SELECT text, data, source_id, owners FROM nodes WHERE id = %s", (node_id,))
        text, data, source, owners = cast(Row, await cur.fetchone())
        now = shares.Contribution(str(text), cast(JSONObject, data),
                                  None if source is None else str(source))
        await conn.execute("UPDATE nodes SET owners = %s WHERE id = %s", (Jsonb(shares.joined(
            cast(shares.Owners | None, owners), now, plan.changeset_id, brought)), node_id))


async def record(conn: Connection, plan: CommitPlan) -> None:
    """Writes the commit's record (the caller holds the repo's lock: `seq` is max + 1)."""
    at = datetime.fromisoformat(plan.created_at)
    await conn.execute(_INSERT, (
        plan.changeset_id, plan.repo, at, plan.session_id, plan.source_id,
        Jsonb([n.id for n, _, _ in plan.nodes]),
        Jsonb([[k.src, k.dst, k.type.value] for k in plan.links]),
        Jsonb([node_id for node_id, _ in plan.retired]),
        Jsonb(sorted(plan.rewordings)), Jsonb(sorted(plan.joined)), None, plan.repo,
    ))
    for node_id, until in plan.retired:
        await conn.execute(
            "UPDATE nodes SET retired_at = %s, valid_to = %s WHERE repo = %s AND id = %s",
            (at, at if until is None else datetime.fromisoformat(until), plan.repo, node_id),
        )


async def reverted(conn: Connection, repo: str, commit_id: str, revert_id: str) -> None:
    """Records the revert of a withdrawn commit (an ingested source's id is free again)."""
    empty = Jsonb([])
    await conn.execute(_INSERT, (revert_id, repo, datetime.now(UTC), None, None, empty, empty,
                                 empty, empty, empty, commit_id, repo))
    await conn.execute("UPDATE commits SET reverted_by = %s WHERE id = %s",
                       (revert_id, commit_id))
    await conn.execute("DELETE FROM ingests WHERE repo = %s AND changeset_id = %s",
                       (repo, commit_id))


async def unretire(conn: Connection, repo: str, node_ids: Sequence[str]) -> None:
    if node_ids:
        await conn.execute(
            "UPDATE nodes SET retired_at = NULL, valid_to = NULL"
            " WHERE repo = %s AND id = ANY(%s)",
            (repo, list(node_ids)),
        )


async def forget_commits(conn: Connection, repo: str, commit_ids: Sequence[str]) -> None:
    """Removes the records of a forgotten source's commits and of their reverts."""
    await conn.execute(
        "DELETE FROM commits WHERE repo = %s AND (id = ANY(%s) OR reverts = ANY(%s))",
        (repo, list(commit_ids), list(commit_ids)),
    )
