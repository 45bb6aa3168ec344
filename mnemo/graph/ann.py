"""An optional approximate index (faiss HNSW) riding on a repo's `VectorIndex`, for big repos.

Why: the exact numpy scan, on the one BLAS thread a Memory leaves numpy (`mnemo.graph.blas`),
grows with the rows, while faiss `IndexHNSWFlat` with M = 32, efConstruction = 200 and
efSearch = 256 answers in a time nearly flat in the rows with recall@10 0.95 at 1M
(BENCHMARKS.md; mnemo walks at efSearch 64-128, see `HnswParams`). faiss-cpu is an optional
extra (`pymnemo[faiss]`): without it `attach` returns None and every search stays exact.

How it stays correct:

- One HNSW graph per node type, so a search restricted to a few types (recall's routes ask
  for tags or intents) never has to filter the candidates of a much larger type away; and one
  graph of every row, which answers a search over every type, or over types holding at least
  half of the rows (recall's hop 0), in one walk instead of one per type: at 100k rows, seven
  walks cost 7x one. Its candidates of
  other types are dropped at the re-rank, and it fetches more of them to make up for it. The
  cost: the rows are in two graphs, so the build takes about twice as long and the graphs
  twice the memory.
- Each walk returns `oversample` x k candidates (at most efSearch, the walk's breadth, unless
  k is more), and is only as broad as they need: efSearch is `oversample` x k, at least
  `ef_min` and at most `ef_search` (hop 0's 50 candidates walk at 128, a route's 3 at 64);
  they are re-ranked exactly with the `VectorIndex`'s float32 rows (the rows
  SQLite holds), and any candidate that is no longer a row is dropped there. When fewer than
  k survive although the index holds more rows of the wanted types, the search answers None
  and the exact scan answers instead.
- The graphs are built in a worker thread from a snapshot of the index, first when the repo
  holds more than `threshold` vectors (until then, and until the build is done, searches are
  exact). Rows added afterwards wait in `pending`, scanned exactly by every search, until the
  worker inserts them in small batches; a removed row only marks its label dead, and the graphs
  are rebuilt once a quarter of the labels are dead.
- With a folder (a SQLite store's "<file>.hnsw"), the graphs are saved after each build and
  once a tenth of their labels are new, and a repo's first build reads them back instead,
  checked row by row against the index (`ann_files`): they are a cache, never a truth.

Threads: `added` and `removed` run on the event loop thread (where the `VectorIndex` changes),
`search` in whichever thread searches, and the builder (`_ann_builder`) in its own thread, which
exits when it has nothing left to do (a save runs there too: only that thread changes a graph).
Two locks: `_faiss_lock` covers every call into a published graph (a faiss graph may not be
searched while it is added to), for a search or a batch of `insert_batch` inserts; `_lock`
covers the bookkeeping (pending rows, labels, counts) and is only ever held for dictionary
updates, so the event loop never waits on faiss. Builds run outside both, on graphs nobody
searches yet. Lock order: `_faiss_lock`, then `_lock`.

Below the index: what the stores call on a repo's vector index beside its own search (probes of
one type for recall's routes, on the event loop or in a thread by size), and waiting for or
stopping the HNSW builder.
"""

from __future__ import annotations

import importlib
import math
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
import numpy as np

from mnemo.graph._ann_builder import HnswBuilder
from mnemo.graph.ann_files import GraphFolder
from mnemo.graph.ann_search import Graph, rerank, walks
from mnemo.graph.model import NodeType, Vector
from mnemo.graph.vectors import TYPE_CODES, VectorIndex, top_per_row, unit

# Above this many vectors a repo's searches go through the HNSW graphs: the exact scan of
# 20k rows on one BLAS thread takes about what a walk and its re-rank take, and grows
# linearly (BENCHMARKS.md, "Figures behind the code").
DEFAULT_THRESHOLD = 20_000
# Searches of fewer rows than this run on the calling thread, the event loop's (a worker
# thread's round trip would cost more than the product); bigger ones in a worker thread.
IN_THREAD_FROM = 20_000
# A probe of a type with fewer rows than this is a product with its rows, not a walk of its
# graph. A product reads every row of the type, a walk at efSearch 64 (a route's k of 3) a few
# thousand: past this many rows the walk is the shorter (BENCHMARKS.md, "Figures behind the
# code").
WALK_FROM = 5_000


@dataclass(frozen=True, slots=True)
class HnswParams:
    """The HNSW settings (M 32, efConstruction 200, as measured at 1M), and the upkeep policy."""

    m: int = 32
    ef_construction: int = 200
    # The broadest walk, hop 0's (50 candidates): at 1M nodes its recall@50 against the exact
    # scan was 0.992 at 128 and 0.998 at 256, in less time.
    ef_search: int = 128
    # The narrowest walk: a route probe asks for 3 rows, and at efSearch 64 its recall@3
    # against the exact scan was 1.000 (tags) and 0.997 (intents) at 1M nodes, in less time
    # than efSearch 256.
    ef_min: int = 64
    # Candidates fetched per result wanted, then re-ranked exactly (4-10x is the usual range),
    # at most `ef_search` (or k) of them per walk.
    oversample: int = 8
    # Dead labels (removed or replaced rows) past this fraction of all labels: rebuild.
    rebuild_fraction: float = 0.25
    # More rows than this waiting for insertion: searches are exact until the worker catches
    # up (scanning a long pending list for every search would cost more than the exact scan).
    max_pending: int = 4096
    # Inserts per lock hold: an insert into a big graph is slow, and searches wait for it.
    insert_batch: int = 32
    # Rows added to a graph being built between two checks of the stop flag.
    build_chunk: int = 20_000
    # With a folder to save the graphs in: saved again once this fraction of the labels was
    # inserted since the last save (and after every build).
    save_fraction: float = 0.1

    def saved_settings(self) -> dict[str, int]:
        """What a saved graph depends on (`ann_files.GraphFolder`)."""
        return {"m": self.m, "ef_construction": self.ef_construction}


def load_faiss() -> Any | None:
    """The faiss module, or None when faiss-cpu is not installed."""
    try:
        return importlib.import_module("faiss")
    except ImportError:
        return None


def attach(
    index: VectorIndex,
    *,
    threshold: int = DEFAULT_THRESHOLD,
    params: HnswParams | None = None,
    folder: str | Path | None = None,
) -> HnswAccelerator | None:
    """Puts an `HnswAccelerator` on `index` (starting its build at once when the index is
    already past `threshold`); returns it, or None when faiss is not installed. With a
    `folder`, the graphs are saved there and read back instead of built (`ann_files`)."""
    faiss = load_faiss()
    if faiss is None:
        return None
    params = params or HnswParams()
    # The generation of the vectors too (from the first re-embedding on; graphs saved before
    # generations were counted are of generation 0): graphs built on a repo's vectors before
    # it was re-embedded (at the same dimension, over the same rows) would pass the check of
    # the rows, and walk the new vectors along the old ones' neighbours.
    generation = {"generation": index.generation} if index.generation else {}
    files = None if folder is None else GraphFolder(
        folder, {**params.saved_settings(), "dim": index.dim, **generation})
    accelerator = HnswAccelerator(index, faiss, threshold=threshold, params=params, files=files)
    index.accelerator = accelerator
    accelerator.start_if_due()
    return accelerator


class HnswAccelerator(HnswBuilder):
    """Per-type faiss HNSW graphs over a `VectorIndex`, kept in step with it (an
    `Accelerator`). Use `attach` to create one."""

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
        # Whether the saved graphs were tried (once, instead of the first build), and how
        # many labels were inserted since the graphs were last saved.
        self._tried_files = files is None
        self._unsaved = 0
        self._read = False  # whether the graphs searched were read from the files
        self.params = params or HnswParams()
        self._index = index
        self._faiss = faiss
        self._lock = threading.Lock()
        self._faiss_lock = threading.Lock()
        self._graphs: dict[int, Graph] = {}
        # node id -> (type code, label in its type's graph, label in the `ALL` graph), for
        # live labels only.
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
        exactly, or None for a row the exact scan must answer (see the module docstring);
        None for all when the graphs cannot answer now. The rows walk each graph in one call,
        quicker than one walk a row."""
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
            # The walk's breadth is efSearch: more candidates than that cost a wider walk for
            # nothing the re-rank needs.
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
        """Labels in the graphs, dead labels, rows waiting for insertion, whether the graphs
        are ready, and whether they were read from saved files (1) or built (0)."""
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
        and accelerator.rows_of(TYPE_CODES[kind]) >= WALK_FROM
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
    """`work()` over `rows` rows: on the event loop below `IN_THREAD_FROM` of them (a
    thread hop costs more than the work), else in a worker thread (a product or a copy of
    tens of thousands of rows takes milliseconds the loop would wait)."""
    if rows < IN_THREAD_FROM:
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
