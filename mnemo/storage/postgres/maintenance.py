"""The SQL of graph maintenance on PostgreSQL (`mnemo.graph.maintenance` decides, this writes):
each function runs inside the caller's transaction, `async with pg.transaction() as conn:`,
under the repo's lock, and leaves the same rows as its SQLite twin
(`mnemo/storage/sqlite/maintenance.py`).

Deleting a node deletes its links and vector by ON DELETE CASCADE, and its search entry with it:
the `search` tsvector is a generated column of the row itself. Id lists go over the wire as one
array (`= ANY(%s)`), never in chunks. Lists of ids come back in insertion (rowid) order.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from psycopg.types.json import Jsonb

from mnemo.config import Config
from mnemo.graph import maintenance
from mnemo.graph.maintenance import MergeResult, SweepResult, ValidationReport
from mnemo.graph.model import NodeType, node_value
from mnemo.ports import JSONObject
from mnemo.storage.postgres.connection import Connection
from mnemo.storage.postgres.migrations import SEARCH_VECTOR


async def unconsolidated(conn: Connection, repo: str) -> set[str]:
    """The repo's SEMANTIC nodes never compared by a consolidation."""
    cur = await conn.execute(
        "SELECT id FROM nodes WHERE repo = %s AND type = 'semantic' AND NOT consolidated",
        (repo,),
    )
    return {str(node_id) for (node_id,) in await cur.fetchall()}


async def merge_duplicates(
    conn: Connection, repo: str, pairs: list[tuple[str, str]], examined: list[str]
) -> MergeResult:
    """Folds each group of `merge_groups(pairs)` into its survivor (links, data, access counts,
    latest access), deletes the members and the tags left with no link, and marks `examined`
    as consolidated."""
    involved = sorted({node_id for pair in pairs for node_id in pair})
    rows: dict[str, tuple[int, JSONObject, int, str | None]] = {}
    # The survivor keeps the latest access as a time, not as text: compared as datetimes.
    lasts: dict[str, datetime | None] = {}
    sources: dict[str, str | None] = {}
    if involved:
        # FOR UPDATE: SQLite's transaction holds the write lock from its first read; here a
        # recall that counts an access of a member between this read and its deletion would
        # be lost from the survivor's sum, so it waits for this transaction instead.
        cur = await conn.execute(
            "SELECT id, rowid, data, access_count, last_access, source_id FROM nodes"
            " WHERE repo = %s AND id = ANY(%s) ORDER BY rowid FOR UPDATE",
            (repo, involved),
        )
        for node_id, rowid, data, count, last, source in await cur.fetchall():
            assert isinstance(rowid, int)
            assert isinstance(count, int)
            assert isinstance(last, datetime | None)
            rows[str(node_id)] = (
                rowid, _mapping(data), count, None if last is None else last.isoformat()
            )
            lasts[str(node_id)] = last
            sources[str(node_id)] = None if source is None else str(source)
    groups = maintenance.merge_groups(pairs, rows, sources)
    moved = 0
    merged: list[str] = []
    for survivor, members in groups.items():
        _, data, count, _ = rows[survivor]
        last = lasts[survivor]
        for member in members:
            moved += await _move_links(conn, member, survivor)
            _, other, other_count, _ = rows[member]
            data = maintenance.merged_data(data, other, member)
            count += other_count
            last = max(filter(None, (last, lasts[member])), default=None)
            merged.append(member)
        await conn.execute(
            "UPDATE nodes SET data = %s, access_count = %s, last_access = %s WHERE id = %s",
            (Jsonb(data), count, last, survivor),
        )
    await _delete(conn, merged)
    tags = await _orphans(conn, repo, (NodeType.TAG,))
    await _delete(conn, tags)
    if examined:
        await conn.execute(
            "UPDATE nodes SET consolidated = true WHERE repo = %s AND id = ANY(%s)",
            (repo, list(examined)),
        )
    return MergeResult(merged + tags, len(merged), moved, len(tags))


async def _move_links(conn: Connection, member: str, survivor: str) -> int:
    """Re-points the member's links to the survivor; returns how many links were added. A link
    the survivor already has (in either direction) or one between the two is dropped, with the
    member's own links when it is deleted."""
    cur = await conn.execute(
        "INSERT INTO links (repo, src, dst, type)"
        " SELECT l.repo, %(survivor)s, l.dst, l.type FROM links l"
        " WHERE l.src = %(member)s AND l.dst <> %(survivor)s"
        " AND NOT EXISTS (SELECT 1 FROM links r"
        "  WHERE r.src = l.dst AND r.dst = %(survivor)s AND r.type = l.type)"
        " ON CONFLICT DO NOTHING",
        {"survivor": survivor, "member": member},
    )
    moved = max(cur.rowcount, 0)
    cur = await conn.execute(
        "INSERT INTO links (repo, src, dst, type)"
        " SELECT l.repo, l.src, %(survivor)s, l.type FROM links l"
        " WHERE l.dst = %(member)s AND l.src <> %(survivor)s"
        " AND NOT EXISTS (SELECT 1 FROM links r"
        "  WHERE r.src = %(survivor)s AND r.dst = l.src AND r.type = l.type)"
        " ON CONFLICT DO NOTHING",
        {"survivor": survivor, "member": member},
    )
    return moved + max(cur.rowcount, 0)


async def decay_sweep(conn: Connection, repo: str, config: Config, now: datetime) -> SweepResult:
    """Deletes the repo's memories whose `node_value` at `now` is below
    `config.decay_threshold`, then the routing and source nodes left with no link."""
    examined, candidates = await _below_threshold(
        conn, "repo = %s AND type = ANY(%s)", (repo, [kind.value for kind in maintenance.VALUED]),
        config, now,
    )
    # The scan took no locks (locking every memory of the repo would write every row). SQLite
    # holds the write lock from its first read, so a recall's access counted meanwhile is
    # seen; here the candidates are locked and valued again with what is now current, and a
    # recall that comes later waits for this transaction.
    doomed: list[str] = []
    if candidates:
        _, doomed = await _below_threshold(
            conn, "id = ANY(%s)", (candidates,), config, now, lock=True
        )
    await _delete(conn, doomed)
    pruned = await _orphans(conn, repo, maintenance.ROUTES)
    await _delete(conn, pruned)
    return SweepResult(examined, doomed, pruned)


async def _below_threshold(
    conn: Connection,
    where: str,
    params: tuple[object, ...],
    config: Config,
    now: datetime,
    *,
    lock: bool = False,
) -> tuple[int, list[str]]:
    """How many nodes `where` selects, and the ids (in rowid order) of those whose
    `node_value` at `now` is below `config.decay_threshold`."""
    # `->` hands back only the fields the rewards read, already parsed from jsonb.
    cur = await conn.execute(
        "SELECT id, type, created_at, last_access, access_count,"
        " data -> 'reward', data -> 'return_score', data -> 'confidence'"
        f" FROM nodes WHERE {where} ORDER BY rowid" + (" FOR UPDATE" if lock else ""),
        params,
    )
    examined = 0
    below: list[str] = []
    for node_id, kind, created, last, count, step_reward, score, confidence in (
        await cur.fetchall()
    ):
        assert isinstance(created, datetime)
        assert isinstance(last, datetime | None)
        assert isinstance(count, int)
        examined += 1
        value = node_value(
            NodeType(str(kind)),
            {"reward": step_reward, "return_score": score, "confidence": confidence},
            created_at=created,
            last_access=last,
            access_count=count,
            now=now,
            config=config,
        )
        if value < config.decay_threshold:
            below.append(str(node_id))
    return examined, below


async def validate(conn: Connection, repo: str, dim: int) -> ValidationReport:
    """Counts and repairs what `mnemo.graph.maintenance.validate_episodic` describes; the
    search check compares each of the repo's stored tsvectors with a fresh one."""
    episodic = await _count(
        conn, "SELECT count(*) FROM nodes WHERE repo = %s AND type = 'episodic'", repo
    )
    no_subgoal = await _unlinked(conn, repo, "subgoal", "hierarchical", "trajectory_id")
    no_source = await _unlinked(conn, repo, "source", "provenance", "episode_id")
    restored = 0
    if no_subgoal:
        owners = await _owners(conn, repo, "subgoal", "hierarchical", "trajectory_id")
        restored += await _relink(conn, repo, no_subgoal, owners, "subgoal_", to_step=True)
    if no_source:
        owners = await _owners(conn, repo, "source", "provenance", "episode_id")
        restored += await _relink(conn, repo, no_source, owners, "source_", to_step=False)
    # Foreign keys make these impossible unless a trigger or a restore bypassed them; counted
    # anyway, as on SQLite.
    dangling = await _count(
        conn, "SELECT count(*) FROM links WHERE repo = %s AND " + _DANGLING, repo
    )
    if dangling:
        await conn.execute("DELETE FROM links WHERE repo = %s AND " + _DANGLING, (repo,))
    missing_vectors = await _count(
        conn,
        "SELECT count(*) FROM nodes n WHERE n.repo = %s"
        " AND NOT EXISTS (SELECT 1 FROM vectors v WHERE v.node_id = n.id)",
        repo,
    )
    bad_vectors = await _count(
        conn, "SELECT count(*) FROM vectors WHERE repo = %s AND vector_dims(vec) <> %s",
        repo, dim,
    )
    # A generated column is computed when its row is written, so it can only disagree with
    # its text after the text search configuration changed; an UPDATE of the row computes
    # it again (docs/DECISIONS.md).
    stale = f"repo = %s AND search IS DISTINCT FROM {SEARCH_VECTOR}"
    cur = await conn.execute("UPDATE nodes SET text = text WHERE " + stale, (repo,))
    rebuilt = cur.rowcount > 0
    return ValidationReport(episodic, len(no_subgoal), len(no_source), restored, dangling,
                            missing_vectors, bad_vectors, rebuilt)


_DANGLING = (
    "(NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = links.src)"
    " OR NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = links.dst))"
)


def _linked_to(kind: str, link: str) -> str:
    # Either direction: the pipeline links subgoal -> step and step -> source, but a link is
    # a link whichever way it was written.
    return (
        f"(EXISTS (SELECT 1 FROM links l JOIN nodes o ON o.id = l.src"
        f" WHERE l.dst = e.id AND l.type = '{link}' AND o.type = '{kind}')"
        f" OR EXISTS (SELECT 1 FROM links l JOIN nodes o ON o.id = l.dst"
        f" WHERE l.src = e.id AND l.type = '{link}' AND o.type = '{kind}'))"
    )


async def _unlinked(
    conn: Connection, repo: str, kind: str, link: str, key: str
) -> list[tuple[str, str | None]]:
    """(id, the data field naming its trajectory or episode) of each EPISODIC node with no
    `link` to a node of type `kind`."""
    cur = await conn.execute(
        f"SELECT e.id, e.data -> %s FROM nodes e"
        f" WHERE e.repo = %s AND e.type = 'episodic' AND NOT {_linked_to(kind, link)}"
        " ORDER BY e.rowid",
        (key, repo),
    )
    return [(str(node_id), _group(group)) for node_id, group in await cur.fetchall()]


async def _owners(conn: Connection, repo: str, kind: str, link: str, key: str) -> dict[str, str]:
    """Trajectory (episode) id -> the subgoal (source) another of its steps is linked to."""
    cur = await conn.execute(
        "SELECT e.data -> %s, o.id FROM nodes e"
        " JOIN links l ON (l.dst = e.id OR l.src = e.id) AND l.type = %s"
        " JOIN nodes o ON o.id = (CASE WHEN l.dst = e.id THEN l.src ELSE l.dst END)"
        " WHERE e.repo = %s AND e.type = 'episodic' AND o.type = %s"
        " ORDER BY e.rowid, o.rowid",
        (key, link, repo, kind),
    )
    owners: dict[str, str] = {}
    for group, owner in await cur.fetchall():
        name = _group(group)
        if name is not None:
            owners.setdefault(name, str(owner))
    return owners


def _group(value: object) -> str | None:
    """A trajectory or episode id read from jsonb, as SQLite's json_extract names it: a string
    as it is, a number as `str` of it, JSON null or a missing field as None."""
    if value is None:
        return None
    if isinstance(value, bool):
        # json_extract returns JSON true/false as the integers 1/0.
        return str(int(value))
    return str(value)


async def _relink(
    conn: Connection, repo: str, steps: list[tuple[str, str | None]],
    owners: dict[str, str], prefix: str, *, to_step: bool,
) -> int:
    kind, link = ("subgoal", "hierarchical") if to_step else ("source", "provenance")
    cur = await conn.execute("SELECT id FROM nodes WHERE repo = %s AND type = %s AND id = ANY(%s)",
                             (repo, kind, maintenance.wanted(steps, owners, prefix)))
    existing = {str(i) for (i,) in await cur.fetchall()}
    restored = 0
    for src, dst in maintenance.relinks(steps, owners, existing, prefix, to_step=to_step):
        cur = await conn.execute("INSERT INTO links (repo, src, dst, type) VALUES (%s, %s, %s, %s)"
                                 " ON CONFLICT DO NOTHING", (repo, src, dst, link))
        restored += max(cur.rowcount, 0)
    return restored


# ---- shared ---------------------------------------------------------------------------------


async def _count(conn: Connection, query: str, *params: object) -> int:
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    assert row is not None
    assert isinstance(row[0], int)
    return row[0]


async def _orphans(conn: Connection, repo: str, kinds: Sequence[NodeType]) -> list[str]:
    """Nodes of these types with no link at all."""
    cur = await conn.execute(
        "SELECT n.id FROM nodes n WHERE n.repo = %s AND n.type = ANY(%s)"
        " AND NOT EXISTS (SELECT 1 FROM links l WHERE l.src = n.id)"
        " AND NOT EXISTS (SELECT 1 FROM links l WHERE l.dst = n.id)"
        " ORDER BY n.rowid",
        (repo, [kind.value for kind in kinds]),
    )
    return [str(node_id) for (node_id,) in await cur.fetchall()]


async def _delete(conn: Connection, node_ids: list[str]) -> None:
    # Links and vectors go by ON DELETE CASCADE, the search entry with its row.
    if node_ids:
        await conn.execute("DELETE FROM nodes WHERE id = ANY(%s)", (node_ids,))


def _mapping(value: object) -> JSONObject:
    if not isinstance(value, dict):
        raise TypeError(f"nodes.data must be a JSON object, got {type(value).__name__}")
    return value
