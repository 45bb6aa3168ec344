"""The SQL of graph maintenance (`mnemo.graph.maintenance` decides, this writes): each
function is one transaction, run by `SqliteGraph` under the repo's lock."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.config import Config
from mnemo.graph import maintenance
from mnemo.graph.maintenance import MergeResult, SweepResult, ValidationReport
from mnemo.graph.model import NodeType, node_value
from mnemo.ports import JSONObject
from mnemo.storage.sqlite.database import chunks

_SQL_CHUNK = 400


def unconsolidated(db: SqliteUtilsDatabase, repo: str) -> set[str]:
    return {
        row[0]
        for row in db.conn.execute(
            "SELECT id FROM nodes WHERE repo = ? AND type = 'semantic' AND consolidated = 0",
            (repo,),
        )
    }



def merge_duplicates(
    db: SqliteUtilsDatabase, repo: str, pairs: list[tuple[str, str]], examined: list[str]
) -> MergeResult:
    conn = db.conn
    with db.atomic():
        involved = sorted({node_id for pair in pairs for node_id in pair})
        rows: dict[str, tuple[int, JSONObject, int, str | None]] = {}
        sources: dict[str, str | None] = {}
        for chunk in chunks(involved, _SQL_CHUNK):
            marks = ",".join("?" * len(chunk))
            for node_id, rowid, data, count, last, source in conn.execute(
                f"SELECT id, rowid, data, access_count, last_access, source_id FROM nodes"
                f" WHERE repo = ? AND id IN ({marks})",
                [repo, *chunk],
            ):
                rows[node_id] = (rowid, json.loads(data), count, last)
                sources[node_id] = source
        groups = maintenance.merge_groups(pairs, rows, sources)
        moved = 0
        merged: list[str] = []
        for survivor, members in groups.items():
            rowid, data, count, last = rows[survivor]
            for member in members:
                member_row, other, other_count, other_last = rows[member]
                moved += _move_links(conn, member_row, rowid)
                data = maintenance.merged_data(data, other, member)
                count += other_count
                last = max(filter(None, (last, other_last)), default=None)
                merged.append(member)
            conn.execute(
                "UPDATE nodes SET data = ?, access_count = ?, last_access = ? WHERE id = ?",
                (json.dumps(data, sort_keys=True), count, last, survivor),
            )
        _delete(conn, merged)
        tags = _orphans(conn, repo, (NodeType.TAG,))
        _delete(conn, tags)
        for chunk in chunks(examined, _SQL_CHUNK):
            marks = ",".join("?" * len(chunk))
            conn.execute(f"UPDATE nodes SET consolidated = 1 WHERE id IN ({marks})", chunk)
    return MergeResult(merged + tags, len(merged), moved, len(tags))



def _move_links(conn: sqlite3.Connection, member: int, survivor: int) -> int:
    """Re-points the member's links to the survivor (both by rowid); returns how many links
    were added. A link the survivor already has (in either direction) or one between the two
    is dropped, with the member's own links when it is deleted."""
    moved = conn.execute(
        "INSERT OR IGNORE INTO links(src, dst, type)"
        " SELECT ?1, l.dst, l.type FROM links l WHERE l.src = ?2 AND l.dst != ?1"
        " AND NOT EXISTS (SELECT 1 FROM links r"
        "  WHERE r.src = l.dst AND r.dst = ?1 AND r.type = l.type)",
        (survivor, member),
    ).rowcount
    moved += conn.execute(
        "INSERT OR IGNORE INTO links(src, dst, type)"
        " SELECT l.src, ?1, l.type FROM links l WHERE l.dst = ?2 AND l.src != ?1"
        " AND NOT EXISTS (SELECT 1 FROM links r"
        "  WHERE r.src = ?1 AND r.dst = l.src AND r.type = l.type)",
        (survivor, member),
    ).rowcount
    return max(moved, 0)



def decay_sweep(
    db: SqliteUtilsDatabase, repo: str, config: Config, now: datetime
) -> SweepResult:
    conn = db.conn
    kinds = [kind.value for kind in maintenance.VALUED]
    examined = 0
    doomed: list[str] = []
    with db.atomic():
        # json_extract keeps the scan in C: only the fields the rewards read are decoded.
        for node_id, kind, created, last, count, step_reward, score, confidence in conn.execute(
            "SELECT id, type, created_at, last_access, access_count,"
            " json_extract(data, '$.reward'), json_extract(data, '$.return_score'),"
            " json_extract(data, '$.confidence')"
            f" FROM nodes WHERE repo = ? AND type IN ({','.join('?' * len(kinds))})",
            [repo, *kinds],
        ):
            examined += 1
            value = node_value(
                NodeType(kind),
                {"reward": step_reward, "return_score": score, "confidence": confidence},
                created_at=datetime.fromisoformat(created),
                last_access=None if last is None else datetime.fromisoformat(last),
                access_count=int(count or 0),
                now=now,
                config=config,
            )
            if value < config.decay_threshold:
                doomed.append(node_id)
        _delete(conn, doomed)
        pruned = _orphans(conn, repo, maintenance.ROUTES)
        _delete(conn, pruned)
    return SweepResult(examined, doomed, pruned)



def validate(db: SqliteUtilsDatabase, repo: str, dim: int) -> ValidationReport:
    conn = db.conn

    def count(sql: str, *params: object) -> int:
        return int(conn.execute(sql, params).fetchone()[0])

    with db.atomic():
        episodic = count(
            "SELECT count(*) FROM nodes WHERE repo = ? AND type = 'episodic'", repo
        )
        no_subgoal = _unlinked(conn, repo, "subgoal", "hierarchical", "$.trajectory_id")
        no_source = _unlinked(conn, repo, "source", "provenance", "$.episode_id")
        restored = 0
        if no_subgoal:
            owners = _owners(conn, repo, "subgoal", "hierarchical", "$.trajectory_id")
            restored += _relink(conn, repo, no_subgoal, owners, "subgoal_", to_step=True)
        if no_source:
            owners = _owners(conn, repo, "source", "provenance", "$.episode_id")
            restored += _relink(conn, repo, no_source, owners, "source_", to_step=False)
        dangling = count("SELECT count(*) FROM links WHERE " + _DANGLING, repo)
        if dangling:
            conn.execute("DELETE FROM links WHERE " + _DANGLING, (repo,))
        missing_vectors = count(
            "SELECT count(*) FROM nodes n WHERE n.repo = ?"
            " AND NOT EXISTS (SELECT 1 FROM vectors v WHERE v.node = n.rowid)",
            repo,
        )
        bad_vectors = count(
            "SELECT count(*) FROM nodes n JOIN vectors v ON v.node = n.rowid"
            " WHERE n.repo = ? AND length(v.vec) != ?", repo, 2 * dim
        )
        try:
            # rank = 1: also compare the index with its content table (the nodes).
            conn.execute("INSERT INTO nodes_fts(nodes_fts, rank) VALUES ('integrity-check', 1)")
            rebuilt = False
        except sqlite3.DatabaseError:
            conn.execute("INSERT INTO nodes_fts(nodes_fts) VALUES ('rebuild')")
            rebuilt = True
    return ValidationReport(episodic, len(no_subgoal), len(no_source), restored, dangling,
                            missing_vectors, bad_vectors, rebuilt)



# A link with an end gone, neither end in another repo (links name their ends by rowid: the
# repo is the ends').
_DANGLING = (
    "(NOT EXISTS (SELECT 1 FROM nodes n WHERE n.rowid = links.src)"
    " OR NOT EXISTS (SELECT 1 FROM nodes n WHERE n.rowid = links.dst))"
    " AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.rowid IN (links.src, links.dst)"
    " AND n.repo != ?)"
)


def _linked_to(kind: str, link: str) -> str:
    # Either direction: the pipeline links subgoal -> step and step -> source, but a link is
    # a link whichever way it was written.
    return (
        f"(EXISTS (SELECT 1 FROM links l JOIN nodes o ON o.rowid = l.src"
        f" WHERE l.dst = e.rowid AND l.type = '{link}' AND o.type = '{kind}')"
        f" OR EXISTS (SELECT 1 FROM links l JOIN nodes o ON o.rowid = l.dst"
        f" WHERE l.src = e.rowid AND l.type = '{link}' AND o.type = '{kind}'))"
    )


def _unlinked(
    conn: sqlite3.Connection, repo: str, kind: str, link: str, key: str
) -> list[tuple[str, str | None]]:
    """(id, the data field naming its trajectory or episode) of each EPISODIC node with no
    `link` to a node of type `kind`."""
    return [
        (row[0], None if row[1] is None else str(row[1]))
        for row in conn.execute(
            f"SELECT e.id, json_extract(e.data, ?) FROM nodes e"
            f" WHERE e.repo = ? AND e.type = 'episodic' AND NOT {_linked_to(kind, link)}",
            (key, repo),
        )
    ]


def _owners(conn: sqlite3.Connection, repo: str, kind: str, link: str, key: str) -> dict[str, str]:
    """Trajectory (episode) id -> the subgoal (source) another of its steps is linked to."""
    owners: dict[str, str] = {}
    for group, owner in conn.execute(
        "SELECT json_extract(e.data, ?), o.id FROM nodes e"
        " JOIN links l ON (l.dst = e.rowid OR l.src = e.rowid) AND l.type = ?"
        " JOIN nodes o ON o.rowid = (CASE WHEN l.dst = e.rowid THEN l.src ELSE l.dst END)"
        " WHERE e.repo = ? AND e.type = 'episodic' AND o.type = ?",
        (key, link, repo, kind),
    ):
        if group is not None:
            owners.setdefault(str(group), owner)
    return owners


def _relink(
    conn: sqlite3.Connection, repo: str, steps: list[tuple[str, str | None]],
    owners: dict[str, str], prefix: str, *, to_step: bool,
) -> int:
    kind, link = ("subgoal", "hierarchical") if to_step else ("source", "provenance")
    existing: set[str] = set()
    for chunk in chunks(maintenance.wanted(steps, owners, prefix), _SQL_CHUNK):
        existing |= {row[0] for row in conn.execute(
            f"SELECT id FROM nodes WHERE repo = ? AND type = ? AND id IN"
            f" ({','.join('?' * len(chunk))})", [repo, kind, *chunk])}
    return sum(conn.execute(
        "INSERT OR IGNORE INTO links(src, dst, type) SELECT a.rowid, b.rowid, ? FROM nodes a,"
        " nodes b WHERE a.repo = ? AND a.id = ? AND b.repo = ? AND b.id = ?",
        (link, repo, src, repo, dst)).rowcount
        for src, dst in maintenance.relinks(steps, owners, existing, prefix, to_step=to_step))


# ---- shared ---------------------------------------------------------------------------------


def _orphans(conn: sqlite3.Connection, repo: str, kinds: Sequence[NodeType]) -> list[str]:
    """Nodes of these types with no link at all."""
    values = [kind.value for kind in kinds]
    return [
        row[0]
        for row in conn.execute(
            f"SELECT n.id FROM nodes n WHERE n.repo = ?"
            f" AND n.type IN ({','.join('?' * len(values))})"
            " AND NOT EXISTS (SELECT 1 FROM links l WHERE l.src = n.rowid)"
            " AND NOT EXISTS (SELECT 1 FROM links l WHERE l.dst = n.rowid)",
            [repo, *values],
        )
    ]


def _delete(conn: sqlite3.Connection, node_ids: list[str]) -> None:
    # Links and vectors go by ON DELETE CASCADE, search entries by the nodes_fts trigger.
    for chunk in chunks(node_ids, _SQL_CHUNK):
        conn.execute(f"DELETE FROM nodes WHERE id IN ({','.join('?' * len(chunk))})", chunk)
