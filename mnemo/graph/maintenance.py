"""Graph maintenance: merge semantic duplicates, let worthless memories decay, and check (and
repair) episodic integrity. Each operation holds the repo's write lock from its first read to its
last write and writes in one transaction, so a commit runs wholly before or after it; only access
counts, which recall writes without the lock, are read inside the transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import anyio.to_thread
import numpy as np
import numpy.typing as npt

from mnemo.config import Config
from mnemo.graph.dedup import differ_in_specifics
from mnemo.graph.model import NodeType, Vector, now_utc
from mnemo.graph.ports import GraphMaintenance
from mnemo.graph.scope import same
from mnemo.ports import COSINE_TOLERANCE, JSONObject

# Routing nodes (and SOURCE, provenance only): never valued, deleted once nothing links them.
ROUTES = (NodeType.TAG, NodeType.INTENT, NodeType.SUBGOAL, NodeType.SOURCE)
VALUED = (NodeType.EPISODIC, NodeType.SEMANTIC, NodeType.PROCEDURAL)

# Similarity scores held at once while consolidating (block rows x all rows): 128 MB.
_BLOCK_CELLS = 32_000_000


@dataclass(frozen=True, slots=True)
class ConsolidationReport:
    """What `consolidate` did: semantic nodes `examined`, `merged` into a survivor, links
    re-pointed (`links_moved`) and unlinked tags deleted (`tags_pruned`)."""

    examined: int
    merged: int
    links_moved: int
    tags_pruned: int


@dataclass(frozen=True, slots=True)
class DecayReport:
    """What `decay` did: memories `examined`, `deleted` below the threshold, and routing and
    source nodes left unlinked and `pruned`."""

    examined: int
    deleted: int
    pruned: int


@dataclass(frozen=True, slots=True)
class ValidationReport:
    """What `validate_episodic` found and repaired: EPISODIC nodes without a SUBGOAL / SOURCE
    link (`missing_subgoal` / `missing_source`), those re-created (`links_restored`), dangling
    links deleted, nodes without a vector or with one of the wrong size (reported only), and
    whether the full-text index was rebuilt (`fts_rebuilt`)."""

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
            or self.missing_vectors or self.bad_vectors or self.fts_rebuilt)


async def consolidate(
    graph: GraphMaintenance, repo: str, config: Config, *, full: bool = False
) -> ConsolidationReport:
    """`Memory.consolidate`: a survivor (highest confidence, then oldest) takes the others'
    links, concepts, confidence, access counts and ids (`data["merged_from"]`). One transaction
    (StorageError: nothing changed); nodes of two sources or two scopes never merge."""
    threshold = config.consolidate_threshold
    async with graph.lock(repo):
        ids, matrix = await graph.vectors_of_type(repo, NodeType.SEMANTIC)
        fresh = set(ids) if full else await graph.unconsolidated(repo)
        new_rows = np.array([i for i, node_id in enumerate(ids) if node_id in fresh], np.int64)
        pairs = await anyio.to_thread.run_sync(_similar_pairs, matrix, new_rows, threshold)
        named = [(ids[i], ids[j]) for i, j in pairs]
        if named:  # never across scopes (`scope.same`)
            scopes = {str(n.id): n.metadata for n in await graph.get_nodes(
                repo, list({i for pair in named for i in pair}))}
            named = [(a, b) for a, b in named if a in scopes and b in scopes
                     and same(scopes[a], scopes[b])]
        return await graph.merge_duplicates(repo, named, [ids[i] for i in new_rows.tolist()])


def _similar_pairs(
    matrix: Vector, new_rows: npt.NDArray[np.int64], threshold: float
) -> list[tuple[int, int]]:
    """Pairs (i, j) of rows with a dot product >= threshold where i is new, each pair once,
    in blocks of at most `_BLOCK_CELLS` scores."""
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
        scores[(columns[None, :] <= rows[:, None]) & is_new[None, :]] = -np.inf
        r, c = np.nonzero(scores >= threshold - COSINE_TOLERANCE)
        found.extend(zip(rows[r].tolist(), c.tolist(), strict=True))
    return found


def relinks(
    steps: list[tuple[str, str | None]], owners: Mapping[str, str], existing: set[str],
    prefix: str, *, to_step: bool,
) -> list[tuple[str, str]]:
    """The (src, dst) links `validate` restores: each unlinked step to the subgoal
    (`to_step`) or source of its group, the one another of its steps links (`owners`), else
    the node named `prefix` + its group if among `existing`."""
    found: list[tuple[str, str]] = []
    for step, group in steps:
        owner = None if group is None else owners.get(group) or (
            prefix + group if prefix + group in existing else None)
        if owner is not None:
            found.append((owner, step) if to_step else (step, owner))
    return found


def wanted(steps: list[tuple[str, str | None]], owners: Mapping[str, str], prefix: str
           ) -> list[str]:
    """The ids `relinks` looks for among the nodes: those of the groups without an owner."""
    return sorted({prefix + g for _, g in steps if g is not None and g not in owners})


# A node as `merge_groups` reads it: rowid, data, access count, source id, text.
MergeRow = tuple[int, JSONObject, int, str | None, str]


def merge_groups(pairs: list[tuple[str, str]], rows: Mapping[str, MergeRow]
                 ) -> dict[str, list[str]]:
    """Survivor -> the nodes merged into it, of `rows` by id. A node joins the best-ranked
    similar node still free, never a chain; only nodes of one `origin` merge, and never two
    that `differ_in_specifics` ("invoice 1042 was paid", "invoice 1043 was not paid")."""
    neighbours: dict[str, list[str]] = {}
    for a, b in pairs:
        if (a in rows and b in rows and origin(rows[a]) == origin(rows[b])
                and not differ_in_specifics(rows[a][4], rows[b][4])):
            neighbours.setdefault(a, []).append(b)
            neighbours.setdefault(b, []).append(a)

    def rank(node_id: str) -> tuple[float, int]:
        rowid, data, _, _, _ = rows[node_id]
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


def origin(row: MergeRow) -> str | None:
    """The source a node came from: its ingest's, else its trajectory's (a session commits
    facts without a source id; one trajectory is one session's)."""
    _, data, _, source, _ = row
    if source is not None:
        return source
    trajectory = data.get("trajectory_id")
    return trajectory if isinstance(trajectory, str) else None


def merged_data(survivor: JSONObject, member: JSONObject, member_id: str) -> JSONObject:
    data = dict(survivor)
    concepts = [*_strings(survivor.get("concepts")), *_strings(member.get("concepts"))]
    if concepts:
        data["concepts"] = list(dict.fromkeys(concepts))
    confidences = [
        c for c in (survivor.get("confidence"), member.get("confidence"))
        if isinstance(c, int | float)]
    if confidences:
        data["confidence"] = max(confidences)
    data["merged_from"] = list(
        dict.fromkeys(
            [*_strings(survivor.get("merged_from")), member_id,
             *_strings(member.get("merged_from"))]))
    return data


def _strings(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


async def decay(
    graph: GraphMaintenance, repo: str, config: Config, *, now: datetime | None = None
) -> DecayReport:
    """`GraphMaintenance.decay_sweep` at `now` (default: now) under the repo's lock
    (StorageError: nothing changed)."""
    async with graph.lock(repo):
        return await graph.decay_sweep(repo, config, now=now or now_utc())


async def validate_episodic(graph: GraphMaintenance, repo: str) -> ValidationReport:
    """`GraphMaintenance.validate` under the repo's lock (StorageError: nothing changed): an
    EPISODIC node without a SUBGOAL (SOURCE) link is linked as `relinks` finds it."""
    async with graph.lock(repo):
        return await graph.validate(repo, graph.dim(repo))
