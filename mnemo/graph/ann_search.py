"""The search side of the HNSW graphs (`mnemo.graph.ann`): which graphs a search walks, and
the exact re-rank of what the walks found."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mnemo.graph.model import Vector
from mnemo.graph.vectors import DEAD, Snapshot, of_codes

# The key of the graph holding every row (type codes are >= 0).
ALL = -1


@dataclass(slots=True)
class Graph:
    """One node type's HNSW graph (or `ALL`'s): faiss label i is the node `labels[i]`."""

    index: Any
    labels: list[str] = field(default_factory=list)
    dead: int = 0

    @property
    def live(self) -> int:
        """Labels of rows still there."""
        return len(self.labels) - self.dead


def walks(graphs: dict[int, Graph], codes: Collection[int] | None) -> tuple[list[int], float]:
    """Which graphs a search of these type codes walks, and the share of their rows it wants:
    `ALL` for every type or types holding half the live rows, else one graph per type."""
    if ALL not in graphs:
        return list(graphs) if codes is None else list(codes), 1.0
    if codes is None:
        return [ALL], 1.0
    live = {code: graph.live for code, graph in graphs.items() if code != ALL}
    total = sum(live.values())
    wanted = sum(live.get(code, 0) for code in codes)
    if total > 0 and 2 * wanted >= total:
        return [ALL], wanted / total
    return list(codes), 1.0


def rerank(
    snap: Snapshot,
    query: Vector,
    k: int,
    candidates: list[str],
    codes: Collection[int] | None,
) -> list[tuple[str, float]] | None:
    """The exact top `k` of the candidates still in the snapshot, or None when they are too
    few although the snapshot holds more rows of the wanted types."""
    rows_of = snap.rows
    rows = np.fromiter(
        (row for node_id in dict.fromkeys(candidates)
         if (row := rows_of.get(node_id)) is not None and row < snap.size),
        dtype=np.int64,
    )
    if codes is not None:
        rows = rows[of_codes(snap.codes[rows], codes)]
    scores = snap.matrix[rows] @ query
    order = np.argsort(-scores, kind="stable")[:k]
    if len(order) < k and codes_present(snap, codes) > len(order):
        return None
    return [(snap.ids[rows[i]], float(scores[i])) for i in order.tolist()]


def codes_present(snap: Snapshot, wanted: Collection[int] | None) -> int:
    """How many rows of the snapshot have one of the wanted type codes (all when None)."""
    if wanted is None:
        return int(np.count_nonzero(snap.codes[: snap.size] != DEAD))
    return int(np.count_nonzero(of_codes(snap.codes[: snap.size], wanted)))
