"""What the stores call on a repo's vector index beside its own search: probes of one type
(recall's routes), and waiting for or stopping the HNSW builder (`mnemo.graph.ann`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import anyio.to_thread

from mnemo.graph import ann
from mnemo.graph.ann import HnswAccelerator
from mnemo.graph.model import NodeType, Vector
from mnemo.graph.vectors import TYPE_CODES, VectorIndex, top_per_row, unit

T = TypeVar("T")


async def nearest_of_type(
    index: VectorIndex, probes: Vector, kind: NodeType, k: int
) -> list[list[tuple[str, float]]]:
    """For each probe row, the `k` rows of one type nearest by cosine (recall probes the tags
    with the query and each search tag at once): one walk of the type's HNSW graph for all
    probes when the index has one ready (gathering every row of a big type costs far more),
    else, and for a type of fewer than `WALK_FROM` rows, one
    matrix product for all probes. In a worker thread unless the rows are few."""
    if k <= 0:
        return [[] for _ in range(len(probes))]
    accelerator = index.accelerator
    if (
        isinstance(accelerator, HnswAccelerator)
        and accelerator.ready
        and accelerator.rows_of(TYPE_CODES[kind]) >= ann.WALK_FROM
    ):
        return await anyio.to_thread.run_sync(lambda: index.search_rows(probes, k, [kind]))
    ids, matrix = await of_type(index, kind)
    if not ids:
        return [[] for _ in range(len(probes))]
    return await by_size(len(ids), lambda: top_per_row(unit(probes) @ matrix.T, ids, k))


async def of_type(index: VectorIndex, kind: NodeType) -> tuple[list[str], Vector]:
    """`index.of_type(kind)`, in a worker thread when it must gather the rows of a big index:
    the first gather after a change copies every row of the type (113 MB for 74,000 intents
    at 1M nodes, a wait the event loop must not take)."""
    if index.has_of_type(kind):
        return index.of_type(kind)
    return await by_size(len(index), lambda: index.of_type(kind))


# Below this many rows a repo's vector searches are numpy on the event loop taking less than
# an anyio task group costs: a recall runs them in turn, with nothing beside them. From
# 10,000 rows a scan takes long enough to hide the words' search in its thread
# (BENCHMARKS.md, "Figures behind the code").
IN_TURN_BELOW = 5_000


def on_loop(index: VectorIndex) -> bool:
    """Whether `by_size` and `nearest_of_type` do quick work for `index` on the event loop:
    fewer rows than `IN_TURN_BELOW` (no thread, no HNSW walk of a type)."""
    return len(index) < IN_TURN_BELOW


async def by_size(rows: int, work: Callable[[], T]) -> T:
    """`work()` over `rows` rows: on the event loop below `ann.IN_THREAD_FROM` of them (a
    thread hop costs more than the work), else in a worker thread (a product or a copy of
    tens of thousands of rows takes milliseconds the loop would wait)."""
    if rows < ann.IN_THREAD_FROM:
        return work()
    return await anyio.to_thread.run_sync(work)


async def settle(index: VectorIndex | None) -> None:
    """Waits until the index's HNSW graphs (if any) have caught up with its rows (built, no
    insert pending); bound it with `anyio.fail_after`. For tests and benchmarks."""
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
