"""The SQL of forgetting a source on PostgreSQL (as `mnemo/storage/sqlite/deletes.py`): run by
`PgGraph` under the repo's lock, the read before the embedding of the intents' new wordings,
the delete in one transaction after it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from mnemo.graph.erasure import Inherited, Plan, Scope
from mnemo.graph.ports import SideWrite
from mnemo.storage.postgres import history
from mnemo.storage.postgres.connection import Connection
from mnemo.storage.postgres.sessions import side_writes
from mnemo.storage.postgres.vectors import as_array

# What a source committed (`mnemo.graph.erasure.Scope`): the commits of an ingested
# source, of a session, or of an episode (those its steps were committed in).
_SCOPE = (
    "SELECT id, nodes, reworded FROM commits WHERE repo = %(repo)s AND (source_id = %(id)s"
    " OR session_id = %(id)s OR id IN (SELECT committed_in FROM steps"
    " WHERE episode_id = %(id)s AND committed_in IS NOT NULL))"
)


async def _scope(conn: Connection, repo: str, source_id: str) -> Scope:
    commits: list[str] = []
    added: set[str] = set()
    reworded: set[str] = set()
    cur = await conn.execute(_SCOPE, {"repo": repo, "id": source_id})
    for commit_id, nodes, words in await cur.fetchall():
        commits.append(str(commit_id))
        added.update(str(i) for i in cast(list[object], nodes))
        reworded.update(str(i) for i in cast(list[object], words))
    return Scope(commits, added, reworded)


async def inherited(
    conn: Connection, repo: str, source_id: str
) -> Inherited:
    """The intents the source created or re-worded, and (intent, data, source) of each
    procedure of another source linked to them, oldest first (`mnemo.graph.erasure.heirs`).
    The source is an ingested source, a session or an episode (`Scope`)."""
    scope = await _scope(conn, repo, source_id)
    cur = await conn.execute(
        "SELECT id FROM nodes WHERE repo = %s AND type = 'intent'"
        " AND (source_id = %s OR id = ANY(%s))",
        (repo, source_id, sorted(scope.added)),
    )
    intents = sorted({str(i) for (i,) in await cur.fetchall()} | scope.reworded)
    if not intents:
        return [], []
    cur = await conn.execute(
        "SELECT l.src, n.id, n.data, n.source_id FROM links l JOIN nodes n ON n.id = l.dst"
        " WHERE l.src = ANY(%s) AND l.type = 'hierarchical' AND n.type = 'procedural'"
        " AND n.source_id IS DISTINCT FROM %s ORDER BY n.created_at, n.rowid",
        (intents, source_id),
    )
    procedures = [(str(i), data, None if owner is None else str(owner))
                  for i, node_id, data, owner in await cur.fetchall()
                  if str(node_id) not in scope.added]
    return intents, procedures


async def delete_source(
    conn: Connection,
    repo: str,
    source_id: str,
    also: Sequence[SideWrite],
    plan: Plan,
) -> list[str]:
    """See `GraphStore.delete_source`: returns the ids of the nodes that went. `plan` says
    what becomes of the intents the source created or re-worded (`inherited`). The source is
    an ingested source, a session or an episode (`Scope`): a session's or an episode's
    stored steps go too (`_erase_steps`), and the lexical index's stores are told to start
    again (`lexical_epoch`). The caller holds the transaction."""
    scope = await _scope(conn, repo, source_id)
    cur = await conn.execute(
        "SELECT id, type IN ('tag', 'intent') FROM nodes WHERE repo = %s"
        " AND (source_id = %s OR id = ANY(%s))",
        (repo, source_id, sorted(scope.added)),
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
        (sorted(routes - set(own)),),
    )
    orphans = [str(i) for (i,) in await cur.fetchall()]
    # A tag or intent the source created that another still uses stays, but no longer names
    # the source (its id is the user's text: erasure).
    await conn.execute(
        "UPDATE nodes SET source_id = NULL WHERE repo = %s AND source_id = %s",
        (repo, source_id),
    )
    await history.forget_commits(conn, repo, scope.commits)
    await _erase_steps(conn, source_id, scope.commits)
    await side_writes(conn, also)
    if own or orphans or plan.heirs or scope.commits:
        await new_epoch(conn)
    return own + orphans


async def _erase_steps(conn: Connection, source_id: str, commits: Sequence[str]) -> None:
    """As `mnemo.storage.sqlite.deletes._erase_steps`: an episode of the forgotten session
    (or the forgotten episode) that is over goes with its steps; of one still open, the
    steps it committed keep their place but none of their words."""
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
    """Gives the lexical index's stores a new epoch: each wipes its documents (which may
    hold erased words) before it answers again (`mnemo.storage.lexical`)."""
    await conn.execute(
        "UPDATE lexical_epoch SET epoch = md5(random()::text || clock_timestamp()::text)")
