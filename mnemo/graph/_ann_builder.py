"""The builder side of `HnswAccelerator` (`mnemo.graph.ann`): the worker thread that builds,
reads back, inserts into and saves the graphs, and the label bookkeeping it shares."""

from __future__ import annotations

import logging
import threading
from itertools import islice
from typing import TYPE_CHECKING, Any

import filelock
import numpy as np
import numpy.typing as npt

from mnemo.graph import ann_files
from mnemo.graph.ann_files import GraphFolder
from mnemo.graph.ann_search import ALL, Graph
from mnemo.graph.vectors import DEAD, Snapshot, VectorIndex

if TYPE_CHECKING:
    from mnemo.graph.ann import HnswParams

log = logging.getLogger("mnemo")


class HnswBuilder:
    """The worker of an `HnswAccelerator`, and the bookkeeping of its labels."""

    params: HnswParams
    files: GraphFolder | None
    failure: BaseException | None
    _tried_files: bool
    _unsaved: int
    _read: bool
    _index: VectorIndex
    _faiss: Any
    _lock: threading.Lock
    _faiss_lock: threading.Lock
    _graphs: dict[int, Graph]
    _labels: dict[str, tuple[int, int, int]]
    _dead: int
    _ready: bool
    _seq: int
    _pending: dict[str, int]
    _removed_in_build: set[str] | None
    _rebuild_due: bool
    _stop: bool
    _worker: threading.Thread | None
    _idle: threading.Event

    def _kick(self) -> None:
        # Caller holds the lock.
        if self._worker is None and not self._stop:
            self._idle.clear()
            self._worker = threading.Thread(
                target=self._work, name="mnemo-hnsw", daemon=True
            )
            self._worker.start()

    def _work(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._stop or not (self._rebuild_due or self._pending):
                        self._worker = None
                        self._idle.set()
                        return
                    build = self._rebuild_due
                    self._rebuild_due = False
                    batch = list(islice(self._pending.items(), self.params.insert_batch))
                if build:
                    if not self._tried_files:
                        self._tried_files = True
                        if self._load_or_log():
                            continue
                    if self._build():
                        self._save()
                else:
                    self._insert(batch)
                    if self._save_due():
                        self._save()
        except Exception as exc:  # the exact scan keeps answering; nothing is lost
            log.exception("mnemo: the HNSW index failed; searches stay exact")
            with self._lock:
                self.failure = exc
                self._worker = None
                self._idle.set()

    def _new_graph(self) -> Graph:
        graph = self._faiss.IndexHNSWFlat(
            self._index.dim, self.params.m, self._faiss.METRIC_INNER_PRODUCT
        )
        graph.hnsw.efConstruction = self.params.ef_construction
        graph.hnsw.efSearch = self.params.ef_search
        return Graph(graph)

    def _build(self) -> bool:
        """Builds every graph from the index's rows and publishes them; False if stopped."""
        # The sequence number is read before the snapshot: a row added in between is both in
        # the snapshot and pending (harmless), never in neither.
        with self._lock:
            seq = self._seq
            self._removed_in_build = set()
        snap = self._index.snapshot()
        # A copy: a remove marks the snapshot's codes dead in place, and every graph must be
        # built from the same rows.
        codes = snap.codes[: snap.size].copy()
        graphs: dict[int, Graph] = {}
        for code in [*(c for c in np.unique(codes).tolist() if c != DEAD), ALL]:
            members = codes != DEAD if code == ALL else codes == code
            graph = self._graph_of(snap, np.flatnonzero(members))
            if graph is None:
                with self._lock:
                    self._removed_in_build = None
                return False
            graphs[int(code)] = graph
        every = graphs[ALL]
        in_all = {node_id: label for label, node_id in enumerate(every.labels)}
        labels = {
            node_id: (code, label, in_all[node_id])
            for code, graph in graphs.items() if code != ALL
            for label, node_id in enumerate(graph.labels)
        }
        self._publish(graphs, labels, seq, [], read=False)
        return True

    def _publish(
        self,
        graphs: dict[int, Graph],
        labels: dict[str, tuple[int, int, int]],
        seq: int,
        missing: list[str],
        *,
        read: bool,
    ) -> None:
        """Makes new graphs the searched ones: rows removed since their snapshot die in them,
        rows added since (and `missing`) wait for insertion; `read`: from the saved files."""
        # The missing rows' entries are made outside the locks: under them, one dict merge.
        with self._lock:
            first = self._seq + 1
            self._seq += len(missing)
        fresh = dict(zip(missing, range(first, first + len(missing)), strict=True))
        with self._faiss_lock, self._lock:
            removed, self._removed_in_build = self._removed_in_build or set(), None
            since = {node_id: s for node_id, s in self._pending.items() if s > seq}
            pending = fresh | since
            for node_id in removed:
                pending.pop(node_id, None)
            # A missing row is in no graph: nothing of it to kill.
            for node_id in removed | since.keys():
                self._kill(graphs, labels, node_id)
            self._graphs, self._labels, self._pending = graphs, labels, pending
            self._dead = sum(graph.dead for code, graph in graphs.items() if code != ALL)
            self._ready = True
            self._read = read
            self._unsaved = 0

    def _load_or_log(self) -> bool:
        """`_load`, with any failure logged and answered by a build (the files are a cache)."""
        try:
            return self._load()
        except Exception:
            log.exception("mnemo: reading the saved HNSW graphs failed; building them")
            with self._lock:
                self._removed_in_build = None
            return False

    def _load(self) -> bool:
        """Publishes the saved graphs, checked against the index's rows; False (build them) if
        none or too much changed."""
        assert self.files is not None
        saved = self.files.load(self._faiss)
        if saved is None or ALL not in saved:
            return False
        with self._lock:
            seq = self._seq
            self._removed_in_build = set()
        snap = self._index.snapshot()
        adopted = ann_files.adopt(saved, snap, ALL)
        labels_total = sum(len(g.labels) for key, g in saved.items() if key != ALL)
        # Dead labels past half the rebuild fraction would soon set a rebuild off.
        fraction = self.params.rebuild_fraction
        if (adopted.dead_total > fraction / 2 * max(labels_total, 1)
                or len(adopted.missing) > fraction * max(labels_total, 1)):
            log.info("mnemo: saved HNSW graphs too far behind the store (%d dead, %d missing, "
                     "%d saved); rebuilding", adopted.dead_total, len(adopted.missing),
                     labels_total)
            with self._lock:
                self._removed_in_build = None
            return False
        graphs = {}
        for key, graph in saved.items():
            ann_files.restore(graph, adopted.rows[key], snap, self._faiss)
            graph.index.hnsw.efSearch = self.params.ef_search
            graphs[key] = Graph(graph.index, graph.labels, adopted.dead.get(key, 0))
        self._publish(graphs, dict(adopted.labels), seq, adopted.missing, read=True)
        log.info("mnemo: HNSW graphs read from %s (%d rows to insert)", self.files.folder,
                 len(adopted.missing))
        return True

    def _save_due(self) -> bool:
        with self._lock:
            return (self.files is not None and not self._pending
                    and self._unsaved > self.params.save_fraction * self._label_count())

    def _save(self) -> None:
        """Saves the graphs (in the builder's thread, the only one that changes them)."""
        if self.files is None or self._stop:
            return
        graphs = {key: ann_files.Saved(graph.index, graph.labels)
                  for key, graph in self._graphs.items()}
        try:
            self.files.save(graphs, self._faiss)
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
        rows = [(node_id, s, snap.rows.get(node_id)) for node_id, s in batch]
        by_code: dict[int, list[tuple[str, int, int]]] = {}
        for node_id, s, row in rows:
            # A row gone from the snapshot was removed meanwhile; its removal handled it.
            if row is not None and row < snap.size and snap.codes[row] != DEAD:
                by_code.setdefault(int(snap.codes[row]), []).append((node_id, s, row))
        inserted: list[tuple[str, int, int, int, int]] = []
        with self._faiss_lock:
            every = self._graphs.get(ALL)
            if every is None:
                every = self._graphs[ALL] = self._new_graph()
            for code, members in by_code.items():
                graph = self._graphs.get(code)
                if graph is None:
                    graph = self._graphs[code] = self._new_graph()
                first, first_in_all = len(graph.labels), len(every.labels)
                vectors = np.ascontiguousarray(snap.matrix[[r for _, _, r in members]])
                graph.index.add(vectors)
                every.index.add(vectors)
                for offset, (node_id, s, _) in enumerate(members):
                    graph.labels.append(node_id)
                    every.labels.append(node_id)
                    inserted.append((node_id, s, code, first + offset, first_in_all + offset))
        with self._lock:
            for node_id, s, code, label, label_in_all in inserted:
                if self._pending.get(node_id) == s:
                    del self._pending[node_id]
                    self._labels[node_id] = (code, label, label_in_all)
                else:
                    # Replaced or removed while it was being inserted: its labels are stale.
                    self._graphs[code].dead += 1
                    self._graphs[ALL].dead += 1
                    self._dead += 1
            for node_id, s in batch:
                if self._pending.get(node_id) == s:
                    del self._pending[node_id]
            self._unsaved += len(inserted)

    def _kill(
        self, graphs: dict[int, Graph], labels: dict[str, tuple[int, int, int]], node_id: str
    ) -> None:
        entry = labels.pop(node_id, None)
        if entry is not None:
            graph = graphs.get(entry[0])
            if graph is not None:
                graph.dead += 1
                if graphs is self._graphs:
                    self._dead += 1
            every = graphs.get(ALL)
            if every is not None:
                every.dead += 1

    def _label_count(self) -> int:
        """Labels in the type graphs (the `ALL` graph holds the same rows again)."""
        return sum(len(graph.labels) for code, graph in self._graphs.items() if code != ALL)
