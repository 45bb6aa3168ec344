"""An optional approximate index (faiss HNSW, extra `pymnemo[faiss]`, `mnemo.graph.hnsw`)
riding on a repo's `VectorIndex` past `threshold` rows, and the vector searches that go through
it when it is ready (a thread for big work, the event loop for quick). Graphs saved in a folder
are a cache (`ann_files`), never a truth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
import numpy as np

from mnemo.cpu import import_kept
from mnemo.graph.ann_files import GraphFolder
from mnemo.graph.hnsw import HnswAccelerator as HnswAccelerator, HnswParams as HnswParams
from mnemo.graph.model import NodeType, Vector
from mnemo.graph.vectors import TYPE_CODES, VectorIndex, top_per_row, unit

# Above this many vectors a repo's searches go through the HNSW graphs (BENCHMARKS.md).
DEFAULT_THRESHOLD = 20_000
# Searches of fewer rows run on the calling thread (a thread hop costs more), bigger in one.
IN_THREAD_FROM = 20_000
# A probe of a type with fewer rows is a product with its rows, not a walk of its graph.
WALK_FROM = 5_000
# Below this many rows a recall runs its vector searches in turn on the event loop.
IN_TURN_BELOW = 5_000


def load_faiss() -> Any | None:
    """The faiss module, or None when faiss-cpu is not installed."""
    try:
        return import_kept("faiss")
    except ImportError:
        return None


def attach(
    index: VectorIndex,
    *,
    threshold: int = DEFAULT_THRESHOLD,
    params: HnswParams | None = None,
    folder: str | Path | None = None,
) -> HnswAccelerator | None:
    """Puts an `HnswAccelerator` on `index` (building at once when past `threshold`);
    returns it, or None without faiss. With a `folder`, graphs are saved there and read
    back instead of built."""
    faiss = load_faiss()
    if faiss is None:
        return None
    params = params or HnswParams()
    # What a saved graph depends on; the generation too (0 left out): old graphs would pass
    # the row check on new vectors.
    settings = {"m": params.m, "ef_construction": params.ef_construction, "dim": index.dim}
    if index.generation:
        settings["generation"] = index.generation
    files = None if folder is None else GraphFolder(folder, settings)
    accelerator = HnswAccelerator(index, faiss, threshold=threshold, params=params, files=files)
    index.accelerator = accelerator
    accelerator.start_if_due()
    return accelerator


T = TypeVar("T")


async def nearest_of_type(
    index: VectorIndex, probes: Vector, kind: NodeType, k: int,
    among: Sequence[str] | None = None,
) -> list[list[tuple[str, float]]]:
    """For each probe row, the `k` rows of one type nearest by cosine: one walk of the
    type's graph when ready and the type has `WALK_FROM` rows, else a matrix product; with
    `among` (ids of that type), the nearest of those only."""
    if k <= 0:
        return [[] for _ in range(len(probes))]
    if among is not None:
        return await nearest_among(
            {i: v for i in among if (v := index.get(i)) is not None}, probes, k)
    accelerator = index.accelerator
    if (isinstance(accelerator, HnswAccelerator) and accelerator.ready
            and accelerator.rows_of(TYPE_CODES[kind]) >= WALK_FROM):
        return await anyio.to_thread.run_sync(lambda: index.search_rows(probes, k, [kind]))
    ids, matrix = await of_type(index, kind)
    return await _nearest_rows(ids, lambda: matrix, probes, k)


async def nearest_among(
    vectors: Mapping[str, Vector], probes: Vector, k: int
) -> list[list[tuple[str, float]]]:
    """For each probe row, the `k` of these unit `vectors` nearest by cosine."""
    ids = list(vectors)
    return await _nearest_rows(ids, lambda: np.stack([vectors[i] for i in ids]), probes, k)


async def _nearest_rows(
    ids: list[str], rows: Callable[[], Vector], probes: Vector, k: int
) -> list[list[tuple[str, float]]]:
    """For each probe row, the `k` of `ids` nearest by cosine (`rows()`: their unit vectors,
    built where the product runs)."""
    if not ids:
        return [[] for _ in range(len(probes))]
    return await by_size(len(ids), lambda: top_per_row(unit(probes) @ rows().T, ids, k))


async def of_type(index: VectorIndex, kind: NodeType) -> tuple[list[str], Vector]:
    """`index.of_type(kind)`, in a worker thread when it must copy a big index's rows."""
    if index.has_of_type(kind):
        return index.of_type(kind)
    return await by_size(len(index), lambda: index.of_type(kind))


def on_loop(index: VectorIndex) -> bool:
    """Whether `by_size` and `nearest_of_type` do quick work on the event loop for `index`."""
    return len(index) < IN_TURN_BELOW


async def by_size(rows: int, work: Callable[[], T]) -> T:
    """`work()` over `rows` rows: on the event loop below `IN_THREAD_FROM`, else in a thread."""
    return work() if rows < IN_THREAD_FROM else await anyio.to_thread.run_sync(work)


async def settle(index: VectorIndex | None) -> None:
    """Waits until the index's HNSW graphs (if any) have caught up with its rows; bound it
    with `anyio.fail_after`."""
    accelerator = None if index is None else index.accelerator
    if isinstance(accelerator, HnswAccelerator):
        # Short waits in a thread, so a cancelled wait leaves no thread behind for long.
        while not await anyio.to_thread.run_sync(accelerator.wait, 0.1):
            pass


async def close(indexes: Iterable[VectorIndex]) -> None:
    """Stops the indexes' HNSW builders (a build in progress stops at its next chunk)."""
    for index in indexes:
        if isinstance(index.accelerator, HnswAccelerator):
            await anyio.to_thread.run_sync(index.accelerator.close, 10.0)
