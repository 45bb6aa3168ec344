"""The SQL of forgetting a source and reverting a commit on PostgreSQL (as `sqlite/deletes.py`),
under the repo's lock: the read before embedding the new wordings, the delete after."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from psycopg.types.json import Jsonb

from mnemo.graph.erasure import Inherited, Plan, Scope, Shared
from mnemo.graph.ports import SideWrite
from mnemo.graph.shares import Contribution, Owners
from mnemo.ports import JSONObject
from mnemo.storage.graph_rows import KNOWLEDGE, ROUTES, scope_of, scope_query
from mnemo.storage.postgres import history
from mnemo.storage.postgres.connection import Connection
from mnemo.storage.postgres.sessions import side_writes
from mnemo.storage.postgres.vectors import as_array


async def _scope(conn: Connection, repo: str, key: str, *, one: bool) -> Scope:
    statement, params = scope_query(repo, key, one=one)
    cur = await conn.execute(statement.replace("?", "%s"), params)
    return scope_of(await cur.fetchall(), list)


async def inherited(
    conn: Connection, repo: str, key: str, *, one: bool = False
) -> Inherited:
    """As `mnemo.storage.sqlite.deletes.inherited`."""
    scope = await _scope(conn, repo, key, one=one)
    cur = await conn.execute(
        "SELECT id FROM nodes WHERE repo = %s AND type = 'intent'"
        " AND (source_id = %s OR id = ANY(%s))",
        (repo, key, sorted(scope.added)),
    )
    intents = sorted({str(i) for (i,) in await cur.fetchall()} | scope.reworded)
    cur = await conn.execute(
        "SELECT l.src, n.id, n.data, n.source_id FROM links l JOIN nodes n ON n.id = l.dst"
        " WHERE l.src = ANY(%s) AND l.type = 'hierarchical' AND n.type = 'procedural'"
        " ORDER BY n.created_at, n.rowid",
        (intents,),
    )
    procedures = [(str(i), str(node_id), data, None if owner is None else str(owner))
                  for i, node_id, data, owner in await cur.fetchall()]
    cur = await conn.execute(
        "SELECT id, text, data, source_id, owners FROM nodes WHERE repo = %s"
        " AND type = ANY(%s) AND (source_id = %s OR id = ANY(%s)) ORDER BY id",
        (repo, KNOWLEDGE, key, sorted(scope.added | scope.joined)),
    )
    shared: list[Shared] = [
        (str(i), Contribution(str(text), cast(JSONObject, data),
                              None if source is None else str(source)),
         cast(Owners | None, owners), str(i) in scope.added or source == key)
        for i, text, data, source, owners in await cur.fetchall()
    ]
    return Inherited(intents, procedures, shared, frozenset(scope.commits))


async def _withdraw(
    conn: Connection, repo: str, key: str, scope: Scope, plan: Plan
) -> list[str]:
    """As `mnemo.storage.sqlite.deletes._withdraw`."""
    cur = await conn.execute(
        "SELECT id, type FROM nodes WHERE repo = %s AND (source_id = %s OR id = ANY(%s))",
        (repo, key, sorted(scope.added)),
    )
    mine = {str(i): str(kind) for i, kind in await cur.fetchall()}
    own = sorted(i for i, kind in mine.items() if kind not in (*ROUTES, *KNOWLEDGE))
    own += sorted(i for i, (left, _) in plan.shared.items() if left is None) + plan.dropped
    routes = {i for i, kind in mine.items() if kind in ROUTES} | set(plan.intents)
    if scope.links:
        ends = [list(column) for column in zip(*scope.links, strict=True)]
        await conn.execute(
            "UPDATE links l SET refs = l.refs - x.n FROM (SELECT s, d, t, count(*) AS n"
            " FROM unnest(%s::text[], %s::text[], %s::text[]) AS u(s, d, t) GROUP BY s, d, t)"
            " x WHERE l.src = x.s AND l.dst = x.d AND l.type = x.t", ends)
        await conn.execute(
            "DELETE FROM links WHERE refs <= 0 AND (src = ANY(%s) OR dst = ANY(%s))",
            (ends[0], ends[1]))
        cur = await conn.execute("SELECT id FROM nodes WHERE id = ANY(%s) AND type = ANY(%s)",
                                 (ends[0] + ends[1], ROUTES))
        routes.update(str(i) for (i,) in await cur.fetchall())
    cur = await conn.execute(
        "SELECT DISTINCT n.id FROM links l JOIN nodes n ON n.id IN (l.src, l.dst)"
        " WHERE (l.dst = ANY(%s) OR l.src = ANY(%s)) AND n.type = ANY(%s)",
        (own, own, ROUTES),
    )
    routes.update(str(i) for (i,) in await cur.fetchall())
    await conn.execute("DELETE FROM nodes WHERE id = ANY(%s)", (own,))
    for intent_id, (heir, vector) in plan.heirs.items():
        await conn.execute(
            "UPDATE nodes SET text = %s, data = jsonb_set(data, '{intent}', to_jsonb(%s::text)),"
            " source_id = %s WHERE repo = %s AND id = %s",
            (heir.text, heir.text, heir.source_id, repo, intent_id),
        )
        await conn.execute(
            "UPDATE vectors SET vec = %s WHERE node_id = %s", (as_array(vector), intent_id)
        )
    for node_id, (left, made) in plan.shared.items():
        if left is not None:
            await conn.execute(
                "UPDATE nodes SET text = %s, data = %s, source_id = %s, owners = %s"
                " WHERE id = %s", (left.heir.text, Jsonb(left.heir.data), left.heir.source_id,
                                   None if left.owners is None else Jsonb(left.owners),
                                   node_id))
            if made is not None:
                await conn.execute("UPDATE vectors SET vec = %s WHERE node_id = %s",
                                   (as_array(made), node_id))
    cur = await conn.execute(
        "DELETE FROM nodes n WHERE n.id = ANY(%s) AND NOT EXISTS"
        " (SELECT 1 FROM links l WHERE l.src = n.id OR l.dst = n.id) RETURNING id",
        (sorted(routes - set(own)),),
    )
    orphans = [str(i) for (i,) in await cur.fetchall()]
    await history.unretire(conn, repo, scope.retired)
    return own + orphans


async def withdraw(
    conn: Connection,
    repo: str,
    key: str,
    also: Sequence[SideWrite],
    plan: Plan,
    revert_id: str | None,
) -> list[str]:
    """As `sqlite.deletes.withdraw`, in the caller's transaction."""
    scope = await _scope(conn, repo, key, one=revert_id is not None)
    gone = await _withdraw(conn, repo, key, scope, plan)
    if revert_id is not None:
        await history.reverted(conn, repo, key, revert_id)
        return gone
    # A node still used elsewhere stays, but no longer names the source.
    await conn.execute(
        "UPDATE nodes SET source_id = NULL WHERE repo = %s AND source_id = %s", (repo, key))
    await history.forget_commits(conn, repo, scope.records)
    await _erase_steps(conn, key, scope.records)
    await side_writes(conn, also)
    if gone or plan.heirs or plan.shared or scope.records:
        await new_epoch(conn)
    return gone


async def _erase_steps(conn: Connection, source_id: str, commits: Sequence[str]) -> None:
    """As `sqlite.deletes._erase_steps`."""
    cur = await conn.execute(
        "SELECT id, status FROM episodes WHERE session_id = %(id)s OR id = %(id)s",
        {"id": source_id},
    )
    episodes = await cur.fetchall()
    over = [str(e) for e, status in episodes if status != "open"]
    still_open = [str(e) for e, status in episodes if status == "open"]
    if over:
        for table in ("steps", "task_results"):
            await conn.execute(f"DELETE FROM {table} WHERE episode_id = ANY(%s)", (over,))
        await conn.execute("DELETE FROM episodes WHERE id = ANY(%s)", (over,))
    if still_open and commits:
        await conn.execute(
            "UPDATE steps SET observation = '', action = '', state_summary = '', subgoal = '',"
            " metadata = NULL, subgoal_vec = decode(repeat('00', length(subgoal_vec)), 'hex')"
            " WHERE episode_id = ANY(%s) AND committed_in = ANY(%s)",
            (still_open, list(commits)),
        )


async def new_epoch(conn: Connection) -> None:
    """Gives the store a new lexical epoch: each index slot wipes itself before answering."""
    await conn.execute(
        "UPDATE lexical_epoch SET epoch = md5(random()::text || clock_timestamp()::text)")
