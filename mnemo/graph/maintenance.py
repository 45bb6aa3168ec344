"""Graph maintenance: merge semantic duplicates, let worthless memories decay, and check (and
repair) episodic integrity.

Each operation holds the repo's write lock (`SqliteGraph.lock`) from its first read to its last
write, and writes in one transaction. A commit therefore runs wholly before or after it: a
commit resolves its tags and intents against the graph before writing, so a tag deleted in
between would leave it linking to a node that is gone. Only what is read inside the transaction
(access counts, which recall updates without the lock) is taken as current there.

The value function, `node_value`, is in `graph/value.py`, for `decay` and recall alike.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anyio.to_thread
import numpy as np
import numpy.typing as npt
from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.config import Config
from mnemo.graph.model import NodeType, Vector, now_utc
from mnemo.graph.store import SqliteGraph
from mnemo.graph.value import node_value

# Accesses at which the frequency factor reaches 1.
# Nodes that route a search to memories; never valued, deleted only once nothing links them.
# SOURCE nodes exist only as provenance for episodic steps, so they go the same way.
_ROUTES = (NodeType.TAG, NodeType.INTENT, NodeType.SUBGOAL, NodeType.SOURCE)
_VALUED = (NodeType.EPISODIC, NodeType.SEMANTIC, NodeType.PROCEDURAL)
# Similarity scores held at once while consolidating (block rows x all rows): 128 MB.
_BLOCK_CELLS = 32_000_000
_SQL_CHUNK = 400


# ---- reports --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsolidationReport:
    """What `consolidate` did: `examined` semantic nodes were compared with the rest, `merged`
    of them were folded into a survivor and deleted, `links_moved` links were re-pointed to a
    survivor, and `tags_pruned` tags left with no links were deleted."""

    examined: int
    merged: int
    links_moved: int
    tags_pruned: int


@dataclass(frozen=True, slots=True)
class DecayReport:
    """What `decay` did: `examined` memories (episodic, semantic, procedural) were valued,
    `deleted` of them fell below the threshold, and `pruned` routing and source nodes were left
    with no links and deleted."""

    examined: int
    deleted: int
    pruned: int


@dataclass(frozen=True, slots=True)
class ValidationReport:
    """What `validate_episodic` found and repaired.

    `missing_subgoal` / `missing_source`: EPISODIC nodes without a link to a SUBGOAL / SOURCE;
    `links_restored`: those links re-created (from the step's trajectory or episode siblings);
    `dangling_links`: links to a node that does not exist, all deleted; `missing_vectors` /
    `bad_vectors`: nodes without a vector / vectors of the wrong size (reported only: mnemo
    cannot re-embed here); `fts_rebuilt`: the full-text index disagreed with the nodes and was
    rebuilt.
    """

    episodic: int
    missing_subgoal: int
    missing_source: int
    links_restored: int
    dangling_links: int
    missing_vectors: int
    bad_vectors: int
    fts_rebuilt: bool

    @property
    def ok(self) -> bool:
        """Whether nothing was wrong."""
        return not (
            self.missing_subgoal or self.missing_source or self.dangling_links
            or self.missing_vectors or self.bad_vectors or self.fts_rebuilt
        )


# ---- consolidate ----------------------------------------------------------------------------


async def consolidate(
    graph: SqliteGraph, repo: str, config: Config, *, full: bool = False
) -> ConsolidationReport:
    """Merges the repo's SEMANTIC near-duplicates (raw cosine >= `config.consolidate_threshold`).

    Each node not compared before (every node with `full=True`, e.g. after lowering the
    threshold) is compared with every other SEMANTIC node by blockwise matrix products. Each
    group is a survivor, the node of highest confidence (the oldest among equals), and the
    nodes similar to it: the survivor takes their links (no duplicates, none to itself), the
    union of their concepts, the highest confidence, the sum of access counts, the latest
    access, and their ids in `data["merged_from"]`; they are deleted with their vectors and
    search entries. Tags left with no links are deleted too.

    Raises:
        sqlite3.Error: the transaction failed; nothing was changed.
    """
    threshold = config.consolidate_threshold
    async with graph.lock(repo):
        index = await graph.vector_index(repo)
        ids, matrix = index.of_type(NodeType.SEMANTIC)
        if full:
            fresh = set(ids)
        else:
            fresh = await graph.database.run(lambda db: _unconsolidated(db, repo))
        new_rows = np.array([i for i, node_id in enumerate(ids) if node_id in fresh], np.int64)
        pairs = await anyio.to_thread.run_sync(_similar_pairs, matrix, new_rows, threshold)
        named = [(ids[i], ids[j]) for i, j in pairs]
        result = await graph.database.run(
            lambda db: _merge(db, repo, named, [ids[i] for i in new_rows.tolist()])
        )
        index.remove(result.deleted)
        return ConsolidationReport(
            examined=len(new_rows),
            merged=result.merged,
            links_moved=result.links_moved,
            tags_pruned=result.tags_pruned,
        )


def _similar_pairs(
    matrix: Vector, new_rows: npt.NDArray[np.int64], threshold: float
) -> list[tuple[int, int]]:
    """Pairs (i, j) of rows with a dot product >= threshold where i is new, each pair once.

    Blocks of new rows against all rows bound the score matrix to `_BLOCK_CELLS` cells.
    """
    n = len(matrix)
    if n < 2 or len(new_rows) == 0:
        return []
    is_new = np.zeros(n, dtype=bool)
    is_new[new_rows] = True
    block = max(1, _BLOCK_CELLS // n)
    found: list[tuple[int, int]] = []
    columns = np.arange(n)
    for start in range(0, len(new_rows), block):
        rows = new_rows[start : start + block]
        scores = matrix[rows] @ matrix.T
        # A pair of two new rows is seen from both ends: keep it from its lower row only.
        hide = (columns[None, :] <= rows[:, None]) & is_new[None, :]
        scores[hide] = -np.inf
        r, c = np.nonzero(scores >= threshold)
        found.extend(zip(rows[r].tolist(), c.tolist(), strict=True))
    return found


def _unconsolidated(db: SqliteUtilsDatabase, repo: str) -> set[str]:
    return {
        row[0]
        for row in db.conn.execute(
            "SELECT id FROM nodes WHERE repo = ? AND type = 'semantic' AND consolidated = 0",
            (repo,),
        )
    }


@dataclass(frozen=True, slots=True)
class _Merged:
    deleted: list[str]
    merged: int
    links_moved: int
    tags_pruned: int


def _merge(
    db: SqliteUtilsDatabase, repo: str, pairs: list[tuple[str, str]], examined: list[str]
) -> _Merged:
    conn = db.conn
    with db.atomic():
        involved = sorted({node_id for pair in pairs for node_id in pair})
        rows: dict[str, tuple[int, dict[str, Any], int, str | None]] = {}
        for chunk in _chunks(involved):
            marks = ",".join("?" * len(chunk))
            for node_id, rowid, data, count, last in conn.execute(
                f"SELECT id, rowid, data, access_count, last_access FROM nodes"
                f" WHERE repo = ? AND id IN ({marks})",
                [repo, *chunk],
            ):
                rows[node_id] = (rowid, json.loads(data), count, last)
        groups = _groups(pairs, rows)
        moved = 0
        merged: list[str] = []
        for survivor, members in groups.items():
            rowid, data, count, last = rows[survivor]
            for member in members:
                moved += _move_links(conn, member, survivor)
                _, other, other_count, other_last = rows[member]
                data = _merged_data(data, other, member)
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
        for chunk in _chunks(examined):
            marks = ",".join("?" * len(chunk))
            conn.execute(f"UPDATE nodes SET consolidated = 1 WHERE id IN ({marks})", chunk)
    return _Merged(merged + tags, len(merged), moved, len(tags))


def _groups(
    pairs: list[tuple[str, str]], rows: Mapping[str, tuple[int, dict[str, Any], int, str | None]]
) -> dict[str, list[str]]:
    """Survivor -> the nodes merged into it. A node joins the best-ranked similar node still
    free, never a chain: everything merged into a survivor is itself similar to it."""
    neighbours: dict[str, list[str]] = {}
    for a, b in pairs:
        if a in rows and b in rows:
            neighbours.setdefault(a, []).append(b)
            neighbours.setdefault(b, []).append(a)

    def rank(node_id: str) -> tuple[float, int]:
        rowid, data, _, _ = rows[node_id]
        confidence = data.get("confidence")
        value = float(confidence) if isinstance(confidence, int | float) else 0.0
        return (-value, rowid)

    order = sorted(neighbours, key=rank)
    position = {node_id: i for i, node_id in enumerate(order)}
    taken: set[str] = set()
    groups: dict[str, list[str]] = {}
    for node_id in order:
        if node_id in taken:
            continue
        taken.add(node_id)
        members = sorted(
            (n for n in neighbours[node_id] if n not in taken and position[n] > position[node_id]),
            key=position.__getitem__,
        )
        if members:
            taken.update(members)
            groups[node_id] = members
    return groups


def _merged_data(
    survivor: dict[str, Any], member: dict[str, Any], member_id: str
) -> dict[str, Any]:
    data = dict(survivor)
    concepts = [*_strings(survivor.get("concepts")), *_strings(member.get("concepts"))]
    if concepts:
        data["concepts"] = list(dict.fromkeys(concepts))
    confidences = [
        c for c in (survivor.get("confidence"), member.get("confidence"))
        if isinstance(c, int | float)
    ]
    if confidences:
        data["confidence"] = max(confidences)
    data["merged_from"] = list(
        dict.fromkeys(
            [*_strings(survivor.get("merged_from")), member_id,
             *_strings(member.get("merged_from"))]
        )
    )
    return data


def _strings(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _move_links(conn: sqlite3.Connection, member: str, survivor: str) -> int:
    """Re-points the member's links to the survivor; returns how many links were added. A link
    the survivor already has (in either direction) or one between the two is dropped, with the
    member's own links when it is deleted."""
    moved = conn.execute(
        "INSERT OR IGNORE INTO links(repo, src, dst, type)"
        " SELECT l.repo, ?1, l.dst, l.type FROM links l WHERE l.src = ?2 AND l.dst != ?1"
        " AND NOT EXISTS (SELECT 1 FROM links r"
        "  WHERE r.src = l.dst AND r.dst = ?1 AND r.type = l.type)",
        (survivor, member),
    ).rowcount
    moved += conn.execute(
        "INSERT OR IGNORE INTO links(repo, src, dst, type)"
        " SELECT l.repo, l.src, ?1, l.type FROM links l WHERE l.dst = ?2 AND l.src != ?1"
        " AND NOT EXISTS (SELECT 1 FROM links r"
        "  WHERE r.src = ?1 AND r.dst = l.src AND r.type = l.type)",
        (survivor, member),
    ).rowcount
    return max(moved, 0)


# ---- decay ----------------------------------------------------------------------------------


async def decay(
    graph: SqliteGraph, repo: str, config: Config, *, now: datetime | None = None
) -> DecayReport:
    """Deletes the repo's memories (EPISODIC, SEMANTIC, PROCEDURAL) whose `node_value` at `now`
    (default: the current time) is below `config.decay_threshold`, with their links, vectors
    and search entries; then the TAG, INTENT, SUBGOAL and SOURCE nodes left with no links.
    Routing nodes are never valued or deleted for themselves.

    Raises:
        sqlite3.Error: the transaction failed; nothing was changed.
    """
    moment = now or now_utc()
    async with graph.lock(repo):
        index = await graph.vector_index(repo)
        examined, doomed, pruned = await graph.database.run(
            lambda db: _decay(db, repo, config, moment)
        )
        index.remove([*doomed, *pruned])
        return DecayReport(examined=examined, deleted=len(doomed), pruned=len(pruned))


def _decay(
    db: SqliteUtilsDatabase, repo: str, config: Config, now: datetime
) -> tuple[int, list[str], list[str]]:
    conn = db.conn
    kinds = [kind.value for kind in _VALUED]
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
        pruned = _orphans(conn, repo, _ROUTES)
        _delete(conn, pruned)
    return examined, doomed, pruned


# ---- validate -------------------------------------------------------------------------------


async def validate_episodic(graph: SqliteGraph, repo: str) -> ValidationReport:
    """Checks the repo's episodic integrity and repairs what can be repaired.

    An EPISODIC node without a SUBGOAL (or SOURCE) link is linked again to the subgoal (source)
    of another step of its trajectory (episode), or to the node `subgoal_<trajectory_id>`
    (`source_<episode_id>`) if it exists. Links to missing nodes are deleted (foreign keys
    should make them impossible). Nodes without a vector and vectors of the wrong size are
    counted. The full-text index is checked against the nodes (FTS5 'integrity-check', which
    covers every repo of the file) and rebuilt when it disagrees.

    Raises:
        sqlite3.Error: the transaction failed; nothing was changed.
    """
    dim = graph.dim(repo)
    async with graph.lock(repo):
        return await graph.database.run(lambda db: _validate(db, repo, dim))


def _validate(db: SqliteUtilsDatabase, repo: str, dim: int) -> ValidationReport:
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
        dangling = count("SELECT count(*) FROM links WHERE repo = ? AND " + _DANGLING, repo)
        if dangling:
            conn.execute("DELETE FROM links WHERE repo = ? AND " + _DANGLING, (repo,))
        missing_vectors = count(
            "SELECT count(*) FROM nodes n WHERE n.repo = ?"
            " AND NOT EXISTS (SELECT 1 FROM vectors v WHERE v.node_id = n.id)",
            repo,
        )
        bad_vectors = count(
            "SELECT count(*) FROM vectors WHERE repo = ? AND length(vec) != ?", repo, 4 * dim
        )
        try:
            # rank = 1: also compare the index with its content table (the nodes).
            conn.execute("INSERT INTO nodes_fts(nodes_fts, rank) VALUES ('integrity-check', 1)")
            rebuilt = False
        except sqlite3.DatabaseError:
            conn.execute("INSERT INTO nodes_fts(nodes_fts) VALUES ('rebuild')")
            rebuilt = True
    return ValidationReport(
        episodic=episodic,
        missing_subgoal=len(no_subgoal),
        missing_source=len(no_source),
        links_restored=restored,
        dangling_links=dangling,
        missing_vectors=missing_vectors,
        bad_vectors=bad_vectors,
        fts_rebuilt=rebuilt,
    )


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
        " JOIN links l ON (l.dst = e.id OR l.src = e.id) AND l.type = ?"
        " JOIN nodes o ON o.id = (CASE WHEN l.dst = e.id THEN l.src ELSE l.dst END)"
        " WHERE e.repo = ? AND e.type = 'episodic' AND o.type = ?",
        (key, link, repo, kind),
    ):
        if group is not None:
            owners.setdefault(str(group), owner)
    return owners


def _relink(
    conn: sqlite3.Connection,
    repo: str,
    steps: list[tuple[str, str | None]],
    owners: dict[str, str],
    prefix: str,
    *,
    to_step: bool,
) -> int:
    kind, link = ("subgoal", "hierarchical") if to_step else ("source", "provenance")
    restored = 0
    for step, group in steps:
        if group is None:
            continue
        owner = owners.get(group)
        if owner is None:
            found = conn.execute(
                "SELECT id FROM nodes WHERE id = ? AND repo = ? AND type = ?",
                (prefix + group, repo, kind),
            ).fetchone()
            owner = None if found is None else found[0]
        if owner is None:
            continue
        src, dst = (owner, step) if to_step else (step, owner)
        restored += conn.execute(
            "INSERT OR IGNORE INTO links(repo, src, dst, type) VALUES (?, ?, ?, ?)",
            (repo, src, dst, link),
        ).rowcount
    return restored


# ---- shared ---------------------------------------------------------------------------------


def _orphans(conn: sqlite3.Connection, repo: str, kinds: Sequence[NodeType]) -> list[str]:
    """Nodes of these types with no link at all."""
    values = [kind.value for kind in kinds]
    return [
        row[0]
        for row in conn.execute(
            f"SELECT n.id FROM nodes n WHERE n.repo = ?"
            f" AND n.type IN ({','.join('?' * len(values))})"
            " AND NOT EXISTS (SELECT 1 FROM links l WHERE l.src = n.id)"
            " AND NOT EXISTS (SELECT 1 FROM links l WHERE l.dst = n.id)",
            [repo, *values],
        )
    ]


def _delete(conn: sqlite3.Connection, node_ids: list[str]) -> None:
    # Links and vectors go by ON DELETE CASCADE, search entries by the nodes_fts trigger.
    for chunk in _chunks(node_ids):
        conn.execute(f"DELETE FROM nodes WHERE id IN ({','.join('?' * len(chunk))})", chunk)


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), _SQL_CHUNK):
        yield items[start : start + _SQL_CHUNK]
