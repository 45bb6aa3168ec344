"""The SQL of forgetting a source on PostgreSQL (as `mnemo/storage/sqlite/deletes.py`): run by
`PgGraph` under the repo's lock, the read before the embedding of the intents' new wordings,
the delete in one transaction after it."""

from __future__ import annotations

from collections.abc import Sequence

from mnemo.graph.erasure import Inherited, Plan
from mnemo.graph.ports import SideWrite
from mnemo.storage.postgres import history
from mnemo.storage.postgres.connection import Connection
from mnemo.storage.postgres.sessions import side_writes
from mnemo.storage.postgres.vectors import as_array


async def inherited(
    conn: Connection, repo: str, source_id: str
) -> Inherited:
    """The intents the source created or re-worded, and (intent, data, source) of each
    procedure of another source linked to them, oldest first (`mnemo.graph.erasure.heirs`)."""
    cur = await conn.execute(
        "SELECT id FROM nodes WHERE repo = %s AND source_id = %s AND type = 'intent'"
        " UNION SELECT jsonb_array_elements_text(reworded) FROM commits"
        " WHERE repo = %s AND source_id = %s",
        (repo, source_id, repo, source_id),
    )
    intents = sorted(str(i) for (i,) in await cur.fetchall())
    if not intents:
        return [], []
    cur = await conn.execute(
        "SELECT l.src, n.data, n.source_id FROM links l JOIN nodes n ON n.id = l.dst"
        " WHERE l.src = ANY(%s) AND l.type = 'hierarchical' AND n.type = 'procedural'"
        " AND n.source_id IS DISTINCT FROM %s ORDER BY n.created_at, n.rowid",
        (intents, source_id),
    )
    procedures = [(str(i), data, None if owner is None else str(owner))
                  for i, data, owner in await cur.fetchall()]
    return intents, procedures


async def delete_source(
    conn: Connection,
    repo: str,
    source_id: str,
    also: Sequence[SideWrite],
    plan: Plan,
) -> list[str]:
    """See `GraphStore.delete_source`: returns the ids of the nodes that went. `plan` says
    what becomes of the intents the source created or re-worded (`inherited`). The caller
    holds the transaction."""
    cur = await conn.execute(
        "SELECT id, type IN ('tag', 'intent') FROM nodes WHERE repo = %s AND source_id = %s",
        (repo, source_id),
    )
    rows = await cur.fetchall()
    own = [str(i) for i, route in rows if not route] + plan.dropped
    routes = {str(i) for i, route in rows if route} | set(plan.intents)
    cur = await conn.execute(
        "SELECT DISTINCT n.id FROM links l JOIN nodes n ON n.id = l.src"
        " WHERE l.dst = ANY(%s) AND n.type IN ('tag', 'intent')",
        (own,),
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
    cur = await conn.execute(
        "DELETE FROM nodes n WHERE n.id = ANY(%s) AND NOT EXISTS"
        " (SELECT 1 FROM links l WHERE l.src = n.id OR l.dst = n.id) RETURNING id",
        (sorted(routes),),
    )
    orphans = [str(i) for (i,) in await cur.fetchall()]
    # A tag or intent the source created that another still uses stays, but no longer names
    # the source (its id is the user's text: erasure).
    await conn.execute(
        "UPDATE nodes SET source_id = NULL WHERE repo = %s AND source_id = %s",
        (repo, source_id),
    )
    await history.forget_source(conn, repo, source_id)
    await side_writes(conn, also)
    return own + orphans
