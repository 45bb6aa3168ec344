"""`VectorIndex`: exact cosine search over one repo's unit node vectors, in memory, built from
the stored rows on a repo's first search and kept in step after each commit or delete. Searches
may run in a worker thread while the event loop appends: an append writes only past the row
count a search read, and a delete marks rows dead in place (compacted once they are a quarter).
An `Accelerator` (`mnemo.graph.ann`) answers a search when it can.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from mnemo.errors import EmbeddingError
from mnemo.graph.model import NodeType, Vector
from mnemo.ports import Embedder, embed

TYPE_CODES: dict[NodeType, int] = {t: i for i, t in enumerate(NodeType)}
DEAD = -1  # the type code of a removed row, until the next compaction


def unit(vectors: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """Rows scaled to length 1 (zero rows stay zero)."""
    matrix = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    result: npt.NDArray[np.float32] = np.divide(
        matrix, norms, out=np.zeros_like(matrix), where=norms > 0)
    return result


def of_codes(codes: npt.NDArray[np.int8], wanted: Iterable[int]) -> npt.NDArray[np.bool_]:
    """Which of `codes` are among `wanted` (`DEAD` never is), each code read once."""
    table = np.zeros(256, dtype=np.bool_)
    table[[code for code in wanted if code != DEAD]] = True
    mask: npt.NDArray[np.bool_] = table[codes.view(np.uint8)]
    return mask


async def embed_within(embedder: Embedder, texts: Sequence[str], seconds: float) -> Vector:
    """`embed` within `seconds` (a wait for a turn not counted), else EmbeddingError."""
    from mnemo.calls.retry import fail_after

    try:
        with fail_after(seconds):
            return await embed(embedder, texts)
    except EmbeddingError:
        raise  # the embedder's own, an `EmbeddingTimeout` too
    except TimeoutError as exc:
        raise EmbeddingError(
            f"the embedder took more than {seconds:g} s for {len(texts)} texts") from exc


class Snapshot(NamedTuple):
    """What a search reads: rows below `size` of `matrix` and `codes`, live or `DEAD`; `rows`
    maps each live id to its row (it may also hold ids added later, at rows >= `size`)."""

    size: int
    matrix: Vector
    codes: npt.NDArray[np.int8]
    ids: list[str]
    rows: dict[str, int]
    dead: int = 0  # rows marked dead when it was taken (0: no row below `size` is dead)


class Accelerator(Protocol):
    """An approximate index kept in step with a `VectorIndex` (see `mnemo.graph.ann`)."""

    def added(self, ids: Sequence[str]) -> None:
        """The rows of `ids` were added or replaced (called after they are searchable)."""

    def removed(self, ids: Collection[str]) -> None:
        """The rows of `ids` are gone."""

    def search(
        self, queries: Vector, k: int, codes: Collection[int] | None
    ) -> list[list[tuple[str, float]] | None] | None:
        """For each unit row of `queries`, the `k` best rows (of these type codes), or None
        for a row the exact scan must answer; None for all of them."""


class VectorIndex:
    def __init__(self, dim: int, *, generation: int = 0) -> None:
        self.dim = dim
        # Which set of the repo's vectors these are (`Memory.reembed` makes a new one).
        self.generation = generation
        self.accelerator: Accelerator | None = None
        self._matrix = np.zeros((0, dim), dtype=np.float32)
        self._types = np.zeros(0, dtype=np.int8)
        self._ids: list[str] = []
        self._rows: dict[str, int] = {}
        self._count = 0
        self._dead = 0
        # What a search reads, published as one tuple (attributes read one by one from a
        # worker thread could pair a new matrix with old ids).
        self._view = Snapshot(0, self._matrix, self._types, self._ids, self._rows)
        # `of_type`'s rows, kept until the next change.
        self._version = 0
        self._by_type: dict[NodeType, tuple[int, list[str], Vector]] = {}

    def __len__(self) -> int:
        return self._count - self._dead

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._rows

    def add(self, ids: Sequence[str], types: Sequence[NodeType], vectors: npt.ArrayLike) -> None:
        """Adds (or replaces) rows; `vectors` has one row per id."""
        if not ids:
            return
        rows = unit(vectors)
        if rows.shape != (len(ids), self.dim):
            raise ValueError(f"expected {len(ids)} vectors of dim {self.dim}, got {rows.shape}")
        # `_version` moves only once the change is published (`of_type` reads it first).
        fresh: list[int] = []
        for i, node_id in enumerate(ids):
            row = self._rows.get(node_id)
            if row is None:
                fresh.append(i)
            else:
                self._matrix[row] = rows[i]
                self._types[row] = TYPE_CODES[types[i]]
        if not fresh:
            # Rows replaced in place are a change too: whoever kept the old view sees it.
            self._view = self._view._replace()
        else:
            need = self._count + len(fresh)
            if need > len(self._matrix):
                capacity = max(need, 2 * len(self._matrix), 1024)
                matrix = np.zeros((capacity, self.dim), dtype=np.float32)
                matrix[: self._count] = self._matrix[: self._count]
                codes = np.zeros(capacity, dtype=np.int8)
                codes[: self._count] = self._types[: self._count]
                self._matrix, self._types = matrix, codes
            start = self._count
            self._matrix[start:need] = rows[fresh]
            self._types[start:need] = [TYPE_CODES[types[i]] for i in fresh]
            for offset, i in enumerate(fresh):
                self._rows[ids[i]] = start + offset
                self._ids.append(ids[i])
            self._count = need
            self._view = Snapshot(
                self._count, self._matrix, self._types, self._ids, self._rows, self._dead)
        self._version += 1
        if self.accelerator is not None:
            self.accelerator.added(ids)

    def remove(self, ids: Iterable[str]) -> None:
        """Drops rows: marks them dead, and compacts the arrays (into new ones, so running
        searches keep theirs) once a quarter are dead."""
        gone = {i for i in ids if i in self._rows}
        if not gone:
            return
        for node_id in gone:
            self._types[self._rows.pop(node_id)] = DEAD
        self._dead += len(gone)
        self._view = self._view._replace(dead=self._dead)
        if self._dead > max(1024, self._count // 4):
            keep = np.flatnonzero(self._types[: self._count] != DEAD)
            self._matrix = self._matrix[keep]
            self._types = self._types[keep]
            self._ids = [self._ids[row] for row in keep.tolist()]
            self._rows = {node_id: row for row, node_id in enumerate(self._ids)}
            self._count, self._dead = len(self._ids), 0
            self._view = Snapshot(self._count, self._matrix, self._types, self._ids, self._rows)
        self._version += 1  # after the change, as in `add`
        if self.accelerator is not None:
            self.accelerator.removed(gone)

    def snapshot(self) -> Snapshot:
        """The rows as they are now (later adds do not show; a later remove marks rows dead)."""
        return self._view

    def of_type(self, kind: NodeType) -> tuple[list[str], Vector]:
        """The ids and unit vectors of every row of one type (a shared snapshot until the next
        change: do not change it)."""
        version = self._version
        cached = self._by_type.get(kind)
        if cached is not None and cached[0] == version:
            return cached[1], cached[2]
        count, matrix, codes, ids, _, _ = self._view
        rows = np.flatnonzero(codes[:count] == TYPE_CODES[kind])
        found = [ids[i] for i in rows], matrix[rows]
        self._by_type[kind] = (version, *found)
        return found

    def has_of_type(self, kind: NodeType) -> bool:
        """Whether `of_type(kind)` answers from its copy, without gathering the rows."""
        cached = self._by_type.get(kind)
        return cached is not None and cached[0] == self._version

    def get(self, node_id: str) -> Vector | None:
        row = self._rows.get(node_id)
        return None if row is None else self._matrix[row]

    def similarities(self, node_ids: Iterable[str], vector: npt.ArrayLike) -> dict[str, float]:
        """The cosine to `vector` of each of these ids that has a row, in one product."""
        size, matrix, _, _, rows, _ = self._view
        found = [i for i in dict.fromkeys(node_ids) if rows.get(i, size) < size]
        at = np.fromiter((rows[i] for i in found), dtype=np.intp, count=len(found))
        scores = matrix[at] @ unit(vector)[0]
        return dict(zip(found, scores.tolist(), strict=True))

    def search(
        self, query: npt.ArrayLike, k: int, types: Iterable[NodeType] | None = None
    ) -> list[tuple[str, float]]:
        """The `k` nearest rows by cosine, best first, optionally of the given types only."""
        return self.search_rows(query, k, types)[0]

    def search_rows(
        self, queries: npt.ArrayLike, k: int, types: Iterable[NodeType] | None = None
    ) -> list[list[tuple[str, float]]]:
        """`search` for each row of `queries` at once (one walk of the HNSW graphs for all)."""
        probes = unit(queries)
        count, matrix, codes, ids, _, dead = self._view
        if count == 0 or k <= 0:
            return [[] for _ in range(len(probes))]
        wanted = None if types is None else sorted({TYPE_CODES[t] for t in types})
        found = None if self.accelerator is None else self.accelerator.search(probes, k, wanted)
        if found is None:
            found = [None] * len(probes)
        if all(rows is not None for rows in found):
            return [rows for rows in found if rows is not None]
        allowed = None
        if wanted is not None:
            allowed = of_codes(codes[:count], wanted)
        elif dead:
            allowed = codes[:count] != DEAD
        result = []
        for probe, approximate in zip(probes, found, strict=True):
            if approximate is not None:
                result.append(approximate)
                continue
            scores = matrix[:count] @ probe
            if allowed is not None:
                scores = np.where(allowed, scores, -np.inf)
            result.append(top_per_row(scores[None, :], ids, k)[0])
        return result


def top_per_row(
    scores: npt.NDArray[np.float32], ids: Sequence[str], k: int
) -> list[list[tuple[str, float]]]:
    """For each row of `scores` (column i: `ids[i]`), the `k` best ids with their scores,
    best first (ties in id order), non-finite ones left out."""
    n = scores.shape[1]
    k = min(k, n)
    result = []
    for row in scores:
        top = np.argpartition(-row, k - 1)[:k] if k < n else np.arange(n)
        top = top[np.argsort(-row[top], kind="stable")]
        kept = np.isfinite(row[top]).tolist()
        result.append([(ids[i], score) for i, score, ok
                       in zip(top.tolist(), row[top].tolist(), kept, strict=True) if ok])
    return result
