"""An optional approximate index (faiss HNSW, extra `pymnemo[faiss]`) riding on a repo's
`VectorIndex` past `threshold` rows: one graph per node type and one of every row; a walk's
`oversample` x k candidates are re-ranked exactly, and too few survivors send the search to the
exact scan (None). Rows added later wait in `pending`, scanned exactly; a quarter dead labels
trigger a rebuild; graphs saved in a folder are a cache (`ann_files`), never a truth.

Threads: `added`/`removed` run on the event loop, `search` on any thread, the builder
(`_ann_builder`) in its own: only it changes a graph. `_faiss_lock` covers every call into a
published graph, `_lock` only the bookkeeping dicts (order: `_faiss_lock`, then `_lock`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
import numpy as np

from mnemo.cpu import import_kept
from mnemo.graph._ann_builder import HnswBuilder
from mnemo.graph.ann_files import GraphFolder
from mnemo.graph.ann_search import Graph, rerank, walks
from mnemo.graph.model import NodeType, Vector
from mnemo.graph.vectors import TYPE_CODES, VectorIndex, top_per_row, unit

# Above this many vectors a repo's searches go through the HNSW graphs (BENCHMARKS.md).
DEFAULT_THRESHOLD = 20_000
# Searches of fewer rows run on the calling thread (a thread hop costs more), bigger in one.
IN_THREAD_FROM = 20_000
# A probe of a type with fewer rows is a product with its rows, not a walk of its graph.
WALK_FROM = 5_000


@dataclass(frozen=True, slots=True)
class HnswParams:
    """The HNSW settings and the upkeep policy."""

    m: int = 32
    ef_construction: int = 200
    # The broadest walk (hop 0's candidates).
    ef_search: int = 128
    # The narrowest walk (a route probe's).
    ef_min: int = 64
    # Candidates fetched per result wanted, re-ranked exactly; at most `ef_search` (or k).
    oversample: int = 8
    # Dead labels (removed or replaced rows) past this fraction of all labels: rebuild.
    rebuild_fraction: float = 0.25
    # More rows than this waiting for insertion: searches are exact until the worker catches up.
    max_pending: int = 4096
    # Inserts per lock hold (searches wait for it).
    insert_batch: int = 32
    # Rows added to a graph being built between two checks of the stop flag.
    build_chunk: int = 20_000
    # Graphs saved again once this fraction of labels is new since the last save.
    save_fraction: float = 0.1

    def saved_settings(self) -> dict[str, int]:
        """What a saved graph depends on (`ann_files.GraphFolder`)."""
        return {"m": self.m, "ef_construction": self.ef_construction}


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
    # The generation too (0 left out): old graphs would pass the row check on new vectors.
    generation = {"generation": index.generation} if index.generation else {}
    files = None if folder is None else GraphFolder(
        folder, {**params.saved_settings(), "dim": index.dim, **generation})
    accelerator = HnswAccelerator(index, faiss, threshold=threshold, params=params, files=files)
    index.accelerator = accelerator
    accelerator.start_if_due()
    return accelerator


class HnswAccelerator(HnswBuilder):
    """Per-type faiss HNSW graphs kept in step with a `VectorIndex`; made by `attach`."""

    def __init__(
        self,
        index: VectorIndex,
        faiss: Any,
        *,
        threshold: int = DEFAULT_THRESHOLD,
        params: HnswParams | None = None,
        files: GraphFolder | None = None,
    ) -> None:
        self.threshold = threshold
        self.files = files
        # Whether the saved graphs were tried (once), and labels inserted since the last save.
        self._tried_files = files is None
        self._unsaved = 0
        self._read = False  # whether the graphs searched were read from the files
        self.params = params or HnswParams()
        self._index = index
        self._faiss = faiss
        self._lock = threading.Lock()
        self._faiss_lock = threading.Lock()
        self._graphs: dict[int, Graph] = {}
        # node id -> (type code, label in its type's graph, label in `ALL`), live labels only.
        self._labels: dict[str, tuple[int, int, int]] = {}
        self._dead = 0
        self._ready = False
        self._started = False
        self._seq = 0
        # node id -> sequence number of its latest add, for rows not in a graph yet.
        self._pending: dict[str, int] = {}
        # Ids removed while a build runs (None otherwise), marked dead in the new graphs.
        self._removed_in_build: set[str] | None = None
        self._rebuild_due = False
        self._stop = False
        self._worker: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self.failure: BaseException | None = None

    # ---- what the VectorIndex tells it (event loop thread) ---------------------------------

    def start_if_due(self) -> None:
        """Starts the first build once the index holds more than `threshold` rows."""
        with self._lock:
            if not self._started and len(self._index) > self.threshold:
                self._started = True
                self._rebuild_due = True
                self._kick()

    def added(self, ids: Sequence[str]) -> None:
        """Queues new or replaced rows for insertion (a replaced row's old label dies)."""
        if not self._started:
            self.start_if_due()
            return
        if self._stop or self.failure is not None:
            return  # never searched again: nothing to keep up to date
        with self._lock:
            for node_id in ids:
                self._seq += 1
                self._pending.pop(node_id, None)
                self._pending[node_id] = self._seq
                self._kill(self._graphs, self._labels, node_id)
            self._kick()

    def removed(self, ids: Collection[str]) -> None:
        """Marks the rows' labels dead; schedules a rebuild when too many are."""
        if not self._started or self._stop or self.failure is not None:
            return
        with self._lock:
            for node_id in ids:
                self._pending.pop(node_id, None)
                self._kill(self._graphs, self._labels, node_id)
            if self._removed_in_build is not None:
                self._removed_in_build.update(ids)
            elif self._dead > self.params.rebuild_fraction * max(self._label_count(), 1):
                self._rebuild_due = True
                self._kick()

    # ---- searching (any thread) ------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether searches can use the graphs (built, not failed, not too far behind)."""
        return (
            self._ready
            and self.failure is None
            and len(self._pending) <= self.params.max_pending
            and len(self._index) > self.threshold
        )

    def search(
        self, queries: Vector, k: int, codes: Collection[int] | None
    ) -> list[list[tuple[str, float]] | None] | None:
        """For each unit row of `queries`, the `k` best rows among these type codes, re-ranked
        exactly, or None for a row the exact scan must answer; None for all when the graphs
        cannot answer now."""
        if not self.ready or k <= 0:
            return None
        snap = self._index.snapshot()
        q = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        # Pending rows are read before the graphs: a row leaves `pending` only once its label
        # is in its graph, so a row inserted in between is found in one or the other.
        with self._lock:
            if len(self._pending) > self.params.max_pending:
                return None
            pending = list(self._pending)
        candidates = [list(pending) for _ in range(len(q))]
        with self._faiss_lock:
            graphs = self._graphs
            wanted, share = walks(graphs, codes)
            # More candidates than efSearch cost a wider walk for nothing the re-rank needs.
            params = self.params
            wanted_rows = min(params.oversample * k, max(params.ef_search, k))
            want = math.ceil(wanted_rows / share)
            # As broad as the candidates need (faiss widens a walk to k by itself).
            breadth = self._faiss.SearchParametersHNSW(
                efSearch=min(params.ef_search, max(params.ef_min, wanted_rows)))
            for code in wanted:
                graph = graphs.get(code)
                if graph is None or graph.index.ntotal == 0:
                    continue
                fetch = min(graph.index.ntotal, want)
                _, found = graph.index.search(q, fetch, params=breadth)
                labels = graph.labels
                for row, hits in zip(candidates, found.tolist(), strict=True):
                    row.extend(labels[label] for label in hits if label >= 0)
        # Each row as alone: one too few survivors sends only that row to the exact scan.
        pairs = zip(q, candidates, strict=True)
        return [rerank(snap, query, k, pool, codes) for query, pool in pairs]

    # ---- the worker ------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the worker has nothing left to do; False if `timeout` ran out first."""
        return self._idle.wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Stops the worker (a build stops at its next chunk) and waits for it to exit."""
        with self._lock:
            self._stop = True
            worker = self._worker
        if worker is not None:
            worker.join(timeout)

    def rows_of(self, code: int) -> int:
        """How many live rows of one type its graph holds (rows still pending are not)."""
        graph = self._graphs.get(code)
        return 0 if graph is None else graph.live

    def stats(self) -> dict[str, int]:
        """Labels, dead labels, pending rows, readiness, and whether the graphs were read from
        saved files (1) or built (0)."""
        with self._lock:
            return {
                "labels": self._label_count(),
                "dead": self._dead,
                "pending": len(self._pending),
                "ready": int(self._ready),
                "read": int(self._read),
            }


T = TypeVar("T")


async def nearest_of_type(
    index: VectorIndex, probes: Vector, kind: NodeType, k: int
) -> list[list[tuple[str, float]]]:
    """For each probe row, the `k` rows of one type nearest by cosine: one walk of the
    type's graph when ready and the type has `WALK_FROM` rows, else a matrix product."""
    if k <= 0:
        return [[] for _ in range(len(probes))]
    accelerator = index.accelerator
    if (
        isinstance(accelerator, HnswAccelerator)
        and accelerator.ready
        and accelerator.rows_of(TYPE_CODES[kind]) >= WALK_FROM
    ):
        return await anyio.to_thread.run_sync(lambda: index.search_rows(probes, k, [kind]))
    ids, matrix = await of_type(index, kind)
    if not ids:
        return [[] for _ in range(len(probes))]
    return await by_size(len(ids), lambda: top_per_row(unit(probes) @ matrix.T, ids, k))


async def of_type(index: VectorIndex, kind: NodeType) -> tuple[list[str], Vector]:
    """`index.of_type(kind)`, in a worker thread when it must copy a big index's rows."""
    if index.has_of_type(kind):
        return index.of_type(kind)
    return await by_size(len(index), lambda: index.of_type(kind))


# Below this many rows a recall runs its vector searches in turn on the event loop.
IN_TURN_BELOW = 5_000


def on_loop(index: VectorIndex) -> bool:
    """Whether `by_size` and `nearest_of_type` do quick work on the event loop for `index`."""
    return len(index) < IN_TURN_BELOW


async def by_size(rows: int, work: Callable[[], T]) -> T:
    """`work()` over `rows` rows: on the event loop below `IN_THREAD_FROM`, else in a thread."""
    if rows < IN_THREAD_FROM:
        return work()
    return await anyio.to_thread.run_sync(work)


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
