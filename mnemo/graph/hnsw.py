"""faiss HNSW graphs kept in step with a `VectorIndex` (`mnemo.graph.ann` attaches them): one
graph per node type and one of every row (`ALL`); a walk's `oversample` x k candidates are
re-ranked exactly, and too few survivors send the search to the exact scan (None). Rows added
later wait in `pending`, scanned exactly; a quarter dead labels trigger a rebuild.

Threads: what the `VectorIndex` tells it (`start_if_due`, `added`, `removed`) runs on the event
loop, `search` on any thread, the worker in its own: only it changes a graph's faiss index.
`_faiss_lock` covers every call into a published graph, `_lock` the bookkeeping (labels'
liveness, pending rows; order: `_faiss_lock`, then `_lock`). A search and an insert call faiss
with one OpenMP thread (`one_openmp_thread`); a build uses faiss's team.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from typing import Any

import filelock
import numpy as np
import numpy.typing as npt

from mnemo.graph import ann_files
from mnemo.graph.ann_files import ALL, Graph, GraphFolder
from mnemo.graph.model import Vector
from mnemo.graph.vectors import DEAD, Snapshot, VectorIndex, of_codes

log = logging.getLogger("mnemo")


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


class HnswAccelerator:
    """Per-type faiss HNSW graphs kept in step with a `VectorIndex`; made by `attach`."""

    def __init__(
        self,
        index: VectorIndex,
        faiss: Any,
        *,
        threshold: int,
        params: HnswParams | None = None,
        files: GraphFolder | None = None,
    ) -> None:
        self.threshold = threshold
        self.params = params or HnswParams()
        self.files = files
        self.failure: BaseException | None = None
        self._index = index
        self._faiss = faiss
        self._lock = threading.Lock()
        self._faiss_lock = threading.Lock()
        self._graphs: dict[int, Graph] = {}
        # node id -> sequence number of its latest add, for rows not in a graph yet.
        self._pending: dict[str, int] = {}
        self._seq = 0
        # Ids removed while a build runs (None otherwise), marked dead in the new graphs.
        self._removed_in_build: set[str] | None = None
        self._started = self._ready = self._rebuild_due = self._stop = False
        # Whether the saved graphs are still to be tried (once), whether the graphs searched
        # were read from them, and labels inserted since the last save.
        self._try_files = files is not None
        self._read = False
        self._unsaved = 0
        self._worker: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()

    def start_if_due(self) -> None:
        """Starts the first build once the index holds more than `threshold` rows."""
        with self._lock:
            if not self._started and len(self._index) > self.threshold:
                self._started = self._rebuild_due = True
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
            _kill(self._graphs, ids)
            self._kick()

    def removed(self, ids: Collection[str]) -> None:
        """Marks the rows' labels dead; schedules a rebuild when too many are."""
        if not self._started or self._stop or self.failure is not None:
            return
        with self._lock:
            for node_id in ids:
                self._pending.pop(node_id, None)
            _kill(self._graphs, ids)
            labels, live = self._counts()
            if self._removed_in_build is not None:
                self._removed_in_build.update(ids)
            elif labels - live > self.params.rebuild_fraction * max(labels, 1):
                self._rebuild_due = True
                self._kick()

    @property
    def ready(self) -> bool:
        """Whether searches can use the graphs (built, not failed, not too far behind)."""
        return (
            self._ready
            and self.failure is None
            and len(self._pending) <= self.params.max_pending
            and len(self._index) > self.threshold)

    def search(
        self, queries: Vector, k: int, codes: Collection[int] | None
    ) -> list[list[tuple[str, float]] | None] | None:
        """`Accelerator.search`, the candidates re-ranked exactly; None for all when not `ready`."""
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
        faiss = self._faiss
        with one_openmp_thread(faiss), self._faiss_lock:
            graphs = self._graphs
            wanted, share = walks(graphs, codes)
            # More candidates than efSearch cost a wider walk for nothing the re-rank needs.
            params = self.params
            wanted_rows = min(params.oversample * k, max(params.ef_search, k))
            want = math.ceil(wanted_rows / share)
            # As broad as the candidates need (faiss widens a walk to k by itself).
            breadth = faiss.SearchParametersHNSW(
                efSearch=min(params.ef_search, max(params.ef_min, wanted_rows)))
            for code in wanted:
                graph = graphs.get(code)
                if graph is None or graph.index.ntotal == 0:
                    continue
                _, found = graph.index.search(q, min(graph.index.ntotal, want), params=breadth)
                labels = graph.labels
                for row, hits in zip(candidates, found.tolist(), strict=True):
                    row.extend(labels[label] for label in hits if label >= 0)
        # Each row as alone: one too few survivors sends only that row to the exact scan.
        pairs = zip(q, candidates, strict=True)
        return [rerank(snap, query, k, pool, codes) for query, pool in pairs]

    def rows_of(self, code: int) -> int:
        """How many live rows of one type its graph holds (rows still pending are not)."""
        graph = self._graphs.get(code)
        return 0 if graph is None else len(graph.live)

    def stats(self) -> dict[str, int]:
        """Labels, dead labels, pending rows, readiness, and whether the graphs were read from
        saved files (1) or built (0)."""
        with self._lock:
            labels, live = self._counts()
            return {"labels": labels, "dead": labels - live, "pending": len(self._pending),
                    "ready": int(self._ready), "read": int(self._read)}

    def _counts(self) -> tuple[int, int]:
        """Labels and live labels in the type graphs (`ALL` holds the same rows again)."""
        graphs = [graph for code, graph in self._graphs.items() if code != ALL]
        return sum(len(g.labels) for g in graphs), sum(len(g.live) for g in graphs)

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

    def _kick(self) -> None:
        # Caller holds the lock.
        if self._worker is None and not self._stop:
            self._idle.clear()
            self._worker = threading.Thread(target=self._work, name="mnemo-hnsw", daemon=True)
            self._worker.start()

    def _work(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._stop or not (self._rebuild_due or self._pending):
                        self._worker = None
                        self._idle.set()
                        return
                    build, self._rebuild_due = self._rebuild_due, False
                    batch = list(islice(self._pending.items(), self.params.insert_batch))
                if build:
                    if self._try_files:
                        self._try_files = False
                        if self._load():
                            continue
                    if self._build():
                        self._save()
                else:
                    self._insert(batch)
                    with self._lock:
                        due = not self._pending and (
                            self._unsaved > self.params.save_fraction * self._counts()[0])
                    if due:
                        self._save()
        except Exception as exc:  # the exact scan keeps answering; nothing is lost
            log.exception("mnemo: the HNSW index failed; searches stay exact")
            with self._lock:
                self.failure = exc
                self._worker = None
                self._idle.set()

    def _new_graph(self) -> Graph:
        graph = self._faiss.IndexHNSWFlat(
            self._index.dim, self.params.m, self._faiss.METRIC_INNER_PRODUCT)
        graph.hnsw.efConstruction = self.params.ef_construction
        graph.hnsw.efSearch = self.params.ef_search
        return Graph(graph)

    def _begin(self) -> int:
        """Starts collecting the rows removed from now on; the sequence number of the last add
        (read before the caller's snapshot: a row added in between is both in the snapshot and
        pending, harmless, never in neither)."""
        with self._lock:
            self._removed_in_build = set()
            return self._seq

    def _build(self) -> bool:
        """Builds every graph from the index's rows and publishes them; False if stopped."""
        seq = self._begin()
        snap = self._index.snapshot()
        # A copy: a remove marks the snapshot's codes dead in place, and every graph must be
        # built from the same rows.
        codes = snap.codes[: snap.size].copy()
        graphs: dict[int, Graph] = {}
        for code in [*(c for c in np.unique(codes).tolist() if c != DEAD), ALL]:
            graph = self._graph_of(snap, np.flatnonzero(codes != DEAD if code == ALL
                                                        else codes == code))
            if graph is None:
                return False  # stopped: nothing reads `_removed_in_build` again
            if code != ALL:
                graph.live = {node_id: label for label, node_id in enumerate(graph.labels)}
            graphs[int(code)] = graph
        self._publish(graphs, seq, [], read=False)
        return True

    def _publish(
        self, graphs: dict[int, Graph], seq: int, missing: list[str], *, read: bool
    ) -> None:
        """Makes new graphs the searched ones: rows removed since their snapshot die in them,
        rows added since (and `missing`) wait for insertion; `read`: from the saved files."""
        # The missing rows' entries are made outside the locks: under them, one dict merge. A
        # later add of one gives it a higher number.
        fresh = dict.fromkeys(missing, seq)
        with self._faiss_lock, self._lock:
            removed, self._removed_in_build = self._removed_in_build or set(), None
            since = {node_id: s for node_id, s in self._pending.items() if s > seq}
            pending = fresh | since
            for node_id in removed:
                pending.pop(node_id, None)
            _kill(graphs, removed | since.keys())
            self._graphs, self._pending = graphs, pending
            self._ready, self._read, self._unsaved = True, read, 0

    def _load(self) -> bool:
        """Publishes the saved graphs, checked against the index's rows; False (build them) if
        none, too much changed, or reading them failed (logged: the files are a cache)."""
        try:
            assert self.files is not None
            saved = self.files.load(self._faiss)
            if saved is None or ALL not in saved:
                return False
            seq = self._begin()
            snap = self._index.snapshot()
            adopted = ann_files.adopt(saved, snap)
            labels = max(sum(len(g.labels) for key, g in saved.items() if key != ALL), 1)
            dead = labels - sum(len(live) for live in adopted.live.values())
            # Dead labels past half the rebuild fraction would soon set a rebuild off.
            fraction = self.params.rebuild_fraction
            if dead > fraction / 2 * labels or len(adopted.missing) > fraction * labels:
                log.info("mnemo: saved HNSW graphs too far behind the store (%d dead, %d missing, "
                         "%d saved); rebuilding", dead, len(adopted.missing), labels)
                return False
            graphs = {}
            for key, graph in saved.items():
                ann_files.restore(graph, adopted.rows[key], snap, self._faiss)
                graph.index.hnsw.efSearch = self.params.ef_search
                graphs[key] = Graph(graph.index, graph.labels, adopted.live.get(key, {}))
            self._publish(graphs, seq, adopted.missing, read=True)
            log.info("mnemo: HNSW graphs read from %s (%d rows to insert)", self.files.folder,
                     len(adopted.missing))
            return True
        except Exception:
            log.exception("mnemo: reading the saved HNSW graphs failed; building them")
            return False
        finally:
            with self._lock:
                self._removed_in_build = None

    def _save(self) -> None:
        """Saves the graphs (in the builder's thread, the only one that changes them)."""
        if self.files is None or self._stop:
            return
        try:
            self.files.save(self._graphs, self._faiss)
        except (OSError, RuntimeError, filelock.Timeout) as exc:
            # A cache: the next try comes after as many inserts again (not at every commit).
            log.warning("mnemo: saving the HNSW graphs in %s failed: %s", self.files.folder, exc)
        with self._lock:
            self._unsaved = 0

    def _graph_of(self, snap: Snapshot, rows: npt.NDArray[np.intp]) -> Graph | None:
        """A new graph of these rows of the snapshot, built chunk by chunk; None if stopped."""
        graph = self._new_graph()
        for start in range(0, len(rows), self.params.build_chunk):
            if self._stop:
                return None
            chunk = rows[start : start + self.params.build_chunk]
            graph.index.add(np.ascontiguousarray(snap.matrix[chunk]))
        graph.labels = [snap.ids[row] for row in rows.tolist()]
        return graph

    def _insert(self, batch: list[tuple[str, int]]) -> None:
        snap = self._index.snapshot()
        by_code: dict[int, list[tuple[str, int, int]]] = {}
        for node_id, s in batch:
            row = snap.rows.get(node_id)
            # A row gone from the snapshot was removed meanwhile; its removal handled it.
            if row is not None and row < snap.size and snap.codes[row] != DEAD:
                by_code.setdefault(int(snap.codes[row]), []).append((node_id, s, row))
        inserted: list[tuple[str, int, Graph, int]] = []
        with one_openmp_thread(self._faiss), self._faiss_lock:
            every = self._graphs.get(ALL)
            if every is None:
                every = self._graphs[ALL] = self._new_graph()
            for code, members in by_code.items():
                graph = self._graphs.get(code)
                if graph is None:
                    graph = self._graphs[code] = self._new_graph()
                first = len(graph.labels)
                vectors = np.ascontiguousarray(snap.matrix[[r for _, _, r in members]])
                for target in (graph, every):
                    target.index.add(vectors)
                    target.labels.extend(node_id for node_id, _, _ in members)
                inserted += [(i, s, graph, first + n) for n, (i, s, _) in enumerate(members)]
        with self._lock:
            for node_id, s, graph, label in inserted:
                # Replaced or removed while it was being inserted: its labels stay dead.
                if self._pending.get(node_id) == s:
                    graph.live[node_id] = label
            for node_id, s in batch:
                if self._pending.get(node_id) == s:
                    del self._pending[node_id]
            self._unsaved += len(inserted)


@contextmanager
def one_openmp_thread(faiss: Any) -> Iterator[None]:
    """Limits this thread's faiss calls to one OpenMP thread inside the block and restores its
    setting after. A team's idle worker spins on a core for milliseconds after a walk or a small
    insert (BENCHMARKS.md); builds keep the team."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(threads)


def _kill(graphs: dict[int, Graph], ids: Iterable[str]) -> None:
    """Marks the rows' labels dead in the type graphs (the caller holds the lock)."""
    for graph in graphs.values():
        if graph.live:
            for node_id in ids:
                graph.live.pop(node_id, None)


def walks(graphs: dict[int, Graph], codes: Collection[int] | None) -> tuple[list[int], float]:
    """Which graphs a search of these type codes walks, and the share of their rows it wants:
    `ALL` for every type or types holding half the live rows, else one graph per type."""
    if ALL not in graphs:
        return list(graphs) if codes is None else list(codes), 1.0
    if codes is None:
        return [ALL], 1.0
    live = {code: len(graph.live) for code, graph in graphs.items() if code != ALL}
    total = sum(live.values())
    wanted = sum(live.get(code, 0) for code in codes)
    if total > 0 and 2 * wanted >= total:
        return [ALL], wanted / total
    return list(codes), 1.0


def rerank(
    snap: Snapshot, query: Vector, k: int, candidates: list[str], codes: Collection[int] | None
) -> list[tuple[str, float]] | None:
    """The exact top `k` of the candidates still in the snapshot, or None when they are too
    few although the snapshot holds more rows of the wanted types."""
    rows_of = snap.rows
    rows = np.fromiter(
        (row for node_id in dict.fromkeys(candidates)
         if (row := rows_of.get(node_id)) is not None and row < snap.size),
        dtype=np.int64,
    )
    present = snap.codes[: snap.size]
    if codes is not None:
        rows = rows[of_codes(snap.codes[rows], codes)]
    scores = snap.matrix[rows] @ query
    order = np.argsort(-scores, kind="stable")[:k]
    if len(order) < k and len(order) < int(np.count_nonzero(
            present != DEAD if codes is None else of_codes(present, codes))):
        return None
    return [(snap.ids[rows[i]], float(scores[i])) for i in order.tolist()]
