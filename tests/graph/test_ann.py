"""The optional HNSW index: recall against exact search, consistency with adds and deletes,
type filters, fallbacks, rebuilds, and exact search when faiss is absent."""

from __future__ import annotations

import shutil
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from mnemo.graph import ann, dedup
from mnemo.graph.ann import HnswAccelerator, HnswParams
from mnemo.graph.ann_files import ALL
from mnemo.graph.model import Changeset, NodeDraft, NodeType, Vector
from mnemo.graph.ports import GraphStore
from mnemo.graph.vectors import TYPE_CODES, VectorIndex
from mnemo.storage.sqlite.database import Database
from mnemo.storage.sqlite.graph import SqliteGraph
from tests.graph._support import REPO, Merger, draft, policy, searches_of

DIM = 32
THRESHOLD = 500
needs_faiss = pytest.mark.skipif(
    ann.load_faiss() is None, reason="faiss-cpu is not installed (pip install 'pymnemo[faiss]')"
)


def clustered(n: int, seed: int = 0, centres: int = 25) -> Vector:
    """Unit vectors around a few random centres, like embeddings of a few topics."""
    rng = np.random.default_rng(seed)
    middle = rng.normal(size=(centres, DIM))
    points = middle[rng.integers(0, centres, n)] + 0.6 * rng.normal(size=(n, DIM))
    unit: Vector = (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)
    return unit


def kinds(n: int) -> list[NodeType]:
    """Mostly episodic, a few semantic, one procedural in fifty."""
    return [
        NodeType.PROCEDURAL if i % 50 == 0 else NodeType.SEMANTIC if i % 5 == 0
        else NodeType.EPISODIC
        for i in range(n)
    ]


def exact(index: VectorIndex, query: Vector, k: int, only: list[NodeType] | None = None) -> Any:
    """The exact answer, with the accelerator out of the way."""
    accelerator, index.accelerator = index.accelerator, None
    try:
        return index.search(query, k, only)
    finally:
        index.accelerator = accelerator


def build(folder: Path | None = None) -> Iterator[tuple[VectorIndex, HnswAccelerator]]:
    """An index of 2,000 clustered rows with a ready HNSW accelerator (its graphs read from
    `folder` when saved there, else built)."""
    vectors = clustered(2000)
    index = VectorIndex(DIM)
    index.add([f"n{i}" for i in range(2000)], kinds(2000), vectors)
    accelerator = ann.attach(index, threshold=THRESHOLD, folder=folder)
    assert accelerator is not None
    assert accelerator.wait(30)
    yield index, accelerator
    accelerator.close(10)


@pytest.fixture(scope="module")
def built() -> Iterator[tuple[VectorIndex, HnswAccelerator]]:
    """`build()`'s accelerator, shared by the tests that only search."""
    yield from build()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of `build()`'s graphs, built and saved once a module."""
    folder = tmp_path_factory.mktemp("saved") / "graphs"
    for _ in build(folder):
        pass
    return folder


@pytest.fixture
def accelerated(saved: Path, tmp_path: Path) -> Iterator[tuple[VectorIndex, HnswAccelerator]]:
    """`build()`'s accelerator for one test, its graphs read from a copy of `saved`."""
    yield from build(Path(shutil.copytree(saved, tmp_path / "graphs")))


def recall_at(index: VectorIndex, queries: Vector, k: int, only: list[NodeType] | None) -> float:
    hits = total = 0
    for q in queries:
        truth = {node_id for node_id, _ in exact(index, q, k, only)}
        found = {node_id for node_id, _ in index.search(q, k, only)}
        hits += len(truth & found)
        total += len(truth)
    return hits / total


@needs_faiss
def test_recall_at_10_against_exact(built: tuple[VectorIndex, HnswAccelerator]) -> None:
    """Past the threshold the HNSW answers, and its top 10 matches the exact top 10 >= 90 %."""
    index, accelerator = built
    assert accelerator.ready
    queries = clustered(100, seed=7)
    assert recall_at(index, queries, 10, None) >= 0.9
    assert recall_at(index, queries, 10, [NodeType.SEMANTIC]) >= 0.9
    assert recall_at(index, queries, 10, [NodeType.PROCEDURAL, NodeType.SEMANTIC]) >= 0.9


@needs_faiss
@pytest.mark.parametrize("only", [None, [NodeType.SEMANTIC], [NodeType.PROCEDURAL]])
def test_rows_searched_at_once_answer_as_one_by_one(
    built: tuple[VectorIndex, HnswAccelerator], only: list[NodeType] | None
) -> None:
    """`search_rows` walks each graph once for every probe (recall's route probes), and
    answers each as `search` would alone, through the graphs and through the exact scan."""
    index, _ = built
    probes = clustered(5, seed=11)
    together = index.search_rows(probes, 7, only)
    assert together == [index.search(p, 7, only) for p in probes]
    assert all(len(found) == 7 for found in together)
    accelerator, index.accelerator = index.accelerator, None
    try:
        assert index.search_rows(probes, 7, only) == [index.search(p, 7, only) for p in probes]
    finally:
        index.accelerator = accelerator


@needs_faiss
def test_scores_are_exact_and_types_respected(
    built: tuple[VectorIndex, HnswAccelerator],
) -> None:
    """Scores are the exact cosines of the stored rows, and only the wanted types come back."""
    index, _ = built
    q = clustered(1, seed=3)[0]
    found = index.search(q, 10, [NodeType.PROCEDURAL])
    assert len(found) == 10
    truth = dict(exact(index, q, 40, [NodeType.PROCEDURAL]))
    for node_id, score in found:
        assert int(node_id[1:]) % 50 == 0
        assert score == pytest.approx(float(index.get(node_id) @ q), abs=1e-5)
        assert node_id in truth


@needs_faiss
def test_adds_are_found_at_once_and_after_insertion(
    accelerated: tuple[VectorIndex, HnswAccelerator],
) -> None:
    """A row added after the build is found while pending and once inserted in the graph."""
    index, accelerator = accelerated
    fresh = clustered(50, seed=11)
    ids = [f"new{i}" for i in range(50)]
    index.add(ids, [NodeType.SEMANTIC] * 50, fresh)
    for node_id, vector in zip(ids, fresh, strict=True):
        assert index.search(vector, 1, [NodeType.SEMANTIC])[0][0] == node_id
    assert accelerator.wait(30)
    assert accelerator.stats()["pending"] == 0
    for node_id, vector in zip(ids, fresh, strict=True):
        assert index.search(vector, 1)[0][0] == node_id


@needs_faiss
def test_replaced_vector_is_found_by_its_new_value(
    accelerated: tuple[VectorIndex, HnswAccelerator],
) -> None:
    """Re-adding an id with a new vector kills its old label; searches see the new vector."""
    index, accelerator = accelerated
    target = clustered(1, seed=99)[0]
    index.add(["n1"], [NodeType.EPISODIC], target[None, :])
    found_id, score = index.search(target, 1)[0]
    assert (found_id, score) == ("n1", pytest.approx(1.0, abs=1e-5))  # type: ignore[comparison-overlap]
    assert accelerator.wait(30)
    assert index.search(target, 1)[0][0] == "n1"
    assert accelerator.stats()["dead"] == 1


@needs_faiss
def test_deleted_rows_never_come_back_and_many_trigger_a_rebuild(
    accelerated: tuple[VectorIndex, HnswAccelerator],
) -> None:
    """Removed rows are never returned; past a quarter dead, the graphs are rebuilt smaller."""
    index, accelerator = accelerated
    queries = clustered(30, seed=5)
    gone = {node_id for q in queries for node_id, _ in index.search(q, 10)}
    index.remove(gone)
    for q in queries:
        assert not {node_id for node_id, _ in index.search(q, 10)} & gone
    assert accelerator.stats()["dead"] == len(gone)
    index.remove([f"n{i}" for i in range(0, 1400)])
    assert accelerator.wait(30)
    stats = accelerator.stats()
    assert stats["dead"] == 0
    assert stats["labels"] == len(index)
    assert recall_at(index, queries, 10, None) >= 0.9


class _Walks:
    """A graph's faiss index that counts the searches (walks) made of it."""

    def __init__(self, index: Any, walks: list[int], code: int) -> None:
        self._index, self._walks, self._code = index, walks, code

    @property
    def ntotal(self) -> int:
        return int(self._index.ntotal)

    def search(self, query: Vector, k: int, **kwargs: Any) -> Any:
        self._walks.append(self._code)
        return self._index.search(query, k, **kwargs)


@needs_faiss
def test_a_search_of_every_type_walks_one_graph(
    accelerated: tuple[VectorIndex, HnswAccelerator],
) -> None:
    """A search of every type, or of types holding at least half of the rows, walks the graph
    of every row once instead of one graph per type (seven walks cost seven times one); a
    rarer type walks its own graph. Each finds what the exact scan finds."""
    index, accelerator = accelerated
    walks: list[int] = []
    for code, graph in accelerator._graphs.items():
        graph.index = _Walks(graph.index, walks, code)
    queries = clustered(30, seed=8)
    semantic = TYPE_CODES[NodeType.SEMANTIC]
    for only, walked in [
        (None, [ALL]),
        ([NodeType.EPISODIC], [ALL]),  # 78 % of the rows
        ([NodeType.SEMANTIC], [semantic]),  # 20 %
        ([NodeType.SEMANTIC, NodeType.PROCEDURAL], [semantic, TYPE_CODES[NodeType.PROCEDURAL]]),
    ]:
        walks.clear()
        assert recall_at(index, queries, 10, only) >= 0.9
        assert set(walks) == set(walked)
        assert len(walks) == len(walked) * len(queries)


@needs_faiss
def test_too_few_results_of_a_type_fall_back_to_exact(
    built: tuple[VectorIndex, HnswAccelerator],
) -> None:
    """A type with fewer graph hits than asked is answered by the exact scan, so nothing is
    missed; a search past the threshold with nothing to find is empty."""
    index, _ = built
    q = clustered(1, seed=4)[0]
    assert index.search(q, 100, [NodeType.PROCEDURAL]) == exact(
        index, q, 100, [NodeType.PROCEDURAL]
    )
    assert index.search(q, 5, [NodeType.TAG]) == []


@needs_faiss
def test_below_the_threshold_and_before_the_build_search_is_exact() -> None:
    """No graph below the threshold; crossing it starts a build, exact until it is ready."""
    vectors = clustered(THRESHOLD + 100)
    index = VectorIndex(DIM)
    accelerator = ann.attach(index, threshold=THRESHOLD)
    assert accelerator is not None
    index.add([f"n{i}" for i in range(THRESHOLD)], kinds(THRESHOLD), vectors[:THRESHOLD])
    assert not accelerator.ready
    assert accelerator.wait(0)  # nothing started
    index.add(
        [f"m{i}" for i in range(100)], [NodeType.EPISODIC] * 100, vectors[THRESHOLD:]
    )
    assert accelerator.wait(30)
    assert accelerator.ready
    assert accelerator.stats()["labels"] == THRESHOLD + 100
    accelerator.close(10)


def test_without_faiss_every_search_is_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """With faiss not installed nothing is attached and searches are exact."""
    monkeypatch.setattr(ann, "load_faiss", lambda: None)
    index = VectorIndex(DIM)
    vectors = clustered(600)
    index.add([f"n{i}" for i in range(600)], kinds(600), vectors)
    assert ann.attach(index, threshold=10) is None
    assert index.accelerator is None
    assert index.search(vectors[0], 1)[0][0] == "n0"


def test_a_failing_build_leaves_searches_exact(caplog: pytest.LogCaptureFixture) -> None:
    """A build that raises is logged and turns the accelerator off; searches stay exact."""

    def broken(*args: object) -> object:
        raise RuntimeError("no memory for the graph")

    fake = types.SimpleNamespace(IndexHNSWFlat=broken, METRIC_INNER_PRODUCT=0)
    index = VectorIndex(DIM)
    vectors = clustered(600)
    index.add([f"n{i}" for i in range(600)], kinds(600), vectors)
    accelerator = HnswAccelerator(index, fake, threshold=100)
    index.accelerator = accelerator
    accelerator.start_if_due()
    assert accelerator.wait(10)
    assert isinstance(accelerator.failure, RuntimeError)
    assert "HNSW index failed" in caplog.text
    assert index.search(vectors[3], 1)[0][0] == "n3"


def changeset(name: str, vectors: Vector, start: int) -> Changeset:
    return Changeset(
        name,
        "r",
        [
            NodeDraft(f"v{start + i}", NodeType.EPISODIC, f"step {start + i}", {}, vector)
            for i, vector in enumerate(vectors)
        ],
    )


@needs_faiss
async def test_store_uses_it_and_rebuilds_it_on_open(tmp_path: Path) -> None:
    """Through SqliteGraph: commits and deletes stay consistent, and a store opened again on the
    file rebuilds the graph from the SQLite rows alone."""
    path = tmp_path / "ann.db"
    vectors = clustered(900, seed=2)
    database = Database(path)
    await database.open()
    graph = SqliteGraph(database, lambda repo: DIM, ann_threshold=THRESHOLD)
    try:
        await graph.apply(changeset("a", vectors[:600], 0), intents=policy())
        assert await graph.search_vectors("r", vectors[0], 1) == [  # type: ignore[comparison-overlap]
            ("v0", pytest.approx(1.0, abs=1e-5))
        ]
        with anyio.fail_after(30):
            await graph.settle("r")
        await graph.apply(changeset("b", vectors[600:], 600), intents=policy())
        assert (await graph.search_vectors("r", vectors[700], 1))[0][0] == "v700"
        await graph.delete_nodes("r", ["v700", "v1"])
        assert "v700" not in {n for n, _ in await graph.search_vectors("r", vectors[700], 20)}
        with anyio.fail_after(30):
            await graph.settle("r")
        index = await graph.vector_index("r")
        assert isinstance(index.accelerator, HnswAccelerator)
        assert index.accelerator.ready
    finally:
        await graph.aclose()
        await database.close()

    database = Database(path)
    await database.open()
    reopened = SqliteGraph(database, lambda repo: DIM, ann_threshold=THRESHOLD)
    try:
        assert (await reopened.search_vectors("r", vectors[5], 1))[0][0] == "v5"
        with anyio.fail_after(30):
            await reopened.settle("r")
        index = await reopened.vector_index("r")
        assert isinstance(index.accelerator, HnswAccelerator)
        assert index.accelerator.stats()["labels"] == 898
        assert (await reopened.search_vectors("r", vectors[800], 1))[0][0] == "v800"
        assert "v1" not in {n for n, _ in await reopened.search_vectors("r", vectors[1], 20)}
    finally:
        await reopened.aclose()
        await database.close()


@needs_faiss
def test_params_are_the_measured_ones(built: tuple[VectorIndex, HnswAccelerator]) -> None:
    """The graphs use M = 32 and efConstruction = 200 (as measured at 1M), and walk at efSearch
    128 at most."""
    _, accelerator = built
    assert accelerator.params == HnswParams()
    graph = next(iter(accelerator._graphs.values())).index
    assert (graph.hnsw.efConstruction, graph.hnsw.efSearch) == (200, 128)
    assert graph.hnsw.nb_neighbors(1) == 32


@pytest.mark.slow
@needs_faiss
def test_searches_in_a_thread_while_rows_change(
    accelerated: tuple[VectorIndex, HnswAccelerator],
) -> None:
    """Searches in a worker thread stay well-formed while the owning thread adds, replaces and
    removes rows and the builder inserts and rebuilds; afterwards every live row is found by
    its own vector and no removed row is ever returned."""
    index, accelerator = accelerated
    fresh = clustered(400, seed=21)
    queries = clustered(50, seed=22)
    errors: list[BaseException] = []
    stop = threading.Event()

    def search() -> None:
        try:
            while not stop.is_set():
                for q in queries:
                    found = index.search(q, 10, [NodeType.SEMANTIC, NodeType.EPISODIC])
                    scores = [score for _, score in found]
                    assert scores == sorted(scores, reverse=True)
                    assert len({node_id for node_id, _ in found}) == len(found)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    searcher = threading.Thread(target=search)
    searcher.start()
    try:
        for start in range(0, 400, 40):
            ids = [f"new{i}" for i in range(start, start + 40)]
            index.add(ids, [NodeType.SEMANTIC] * 40, fresh[start : start + 40])
            index.remove([f"n{i}" for i in range(start, start + 40)])
            index.add([f"n{1000 + start}"], [NodeType.EPISODIC], -fresh[start][None, :])
            time.sleep(0.01)
    finally:
        stop.set()
        searcher.join(10)
    assert not errors
    assert accelerator.wait(30)
    live = index.snapshot()
    gone = {f"n{i}" for i in range(400)}
    for row in range(0, live.size, 7):
        node_id = live.ids[row]
        if node_id in gone:
            continue
        assert index.search(live.matrix[row], 1)[0][0] == node_id
    for q in queries:
        assert not {node_id for node_id, _ in index.search(q, 20)} & gone


def test_removed_rows_are_marked_dead_then_compacted() -> None:
    """A remove marks rows dead in place (no copy of the matrix) and they are never found;
    past a quarter of the rows (and 1,024) the arrays are compacted; adds go on working."""
    vectors = clustered(3000, seed=8)
    index = VectorIndex(DIM)
    ids = [f"n{i}" for i in range(3000)]
    index.add(ids, kinds(3000), vectors)
    matrix = index.snapshot().matrix
    index.remove(ids[:500])
    snap = index.snapshot()
    assert (len(index), snap.size, snap.dead) == (2500, 3000, 500)
    assert snap.matrix is matrix
    assert {node_id for node_id, _ in index.search(vectors[0], 3000)} == set(ids[500:])
    assert index.get("n1") is None
    assert index.search(vectors[1], 1)[0][0] != "n1"
    index.remove(ids[500:1100])
    snap = index.snapshot()
    assert (len(index), snap.size, snap.dead) == (1900, 1900, 0)
    assert set(snap.ids) == set(ids[1100:])
    index.add(["n1"], [NodeType.TAG], vectors[1][None, :])
    assert index.search(vectors[1], 1, [NodeType.TAG])[0][0] == "n1"
    assert len(index) == 1901


@needs_faiss
async def test_nearest_of_type_below_the_threshold_is_one_product(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below the HNSW threshold (an accelerator attached, not ready) nearest_of_type answers
    every probe from one product over the type's rows, not with a scan of every row per
    probe (3 ms a probe at 1,000 memories), and agrees with the exact scan."""
    vectors = clustered(300, seed=3)
    database = Database(tmp_path / "below.db")
    await database.open()
    graph = SqliteGraph(database, lambda repo: DIM, ann_threshold=THRESHOLD)
    try:
        await graph.apply(changeset("a", vectors, 0), intents=policy())
        index = await graph.vector_index("r")
        assert isinstance(index.accelerator, HnswAccelerator)
        assert not index.accelerator.ready
        exact = index.search
        scans = searches_of(index, monkeypatch)
        probes = vectors[:4]
        found = await graph.nearest_of_type("r", probes, NodeType.EPISODIC, 3)
        assert scans == []
        assert [[i for i, _ in row] for row in found] == [
            [i for i, _ in exact(probe, 3, [NodeType.EPISODIC])] for probe in probes
        ]
    finally:
        await graph.aclose()
        await database.close()


@needs_faiss
async def test_a_ready_index_walks_only_for_a_big_type(
    accelerated: tuple[VectorIndex, HnswAccelerator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the graphs ready, a probe of a type of fewer than `WALK_FROM` rows is one product
    with its rows (a walk computes thousands of distances one by one: 4 walks of 3.8k tags
    took 4 ms at 100k nodes); a bigger type is walked. Both find what the exact scan finds."""
    index, accelerator = accelerated
    assert accelerator.ready
    walks = searches_of(index, monkeypatch)
    probes = clustered(4, seed=12)
    truth = [[i for i, _ in exact(index, p, 3, [NodeType.SEMANTIC])] for p in probes]
    walks.clear()
    found = await ann.nearest_of_type(index, probes, NodeType.SEMANTIC, 3)  # 400 rows
    assert (walks, [[i for i, _ in row] for row in found]) == ([], truth)
    monkeypatch.setattr(ann, "WALK_FROM", 100)
    found = await ann.nearest_of_type(index, probes, NodeType.SEMANTIC, 3)
    assert walks == [4]  # one walk of the graph for the four probes
    assert [[i for i, _ in row] for row in found] == truth


@needs_faiss
def test_a_walk_is_as_broad_as_its_candidates_need(
    accelerated: tuple[VectorIndex, HnswAccelerator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """efSearch is `oversample` x k between `ef_min` and `ef_search`: a route's 3 rows walk at
    64 (a third of the time of 256 at 1M nodes), hop 0's 50 at 128; the narrow walk still
    finds what the exact scan finds."""
    index, accelerator = accelerated
    breadths: list[int] = []
    faiss = accelerator._faiss

    def recorded(**kwargs: Any) -> Any:
        breadths.append(kwargs["efSearch"])
        return faiss.SearchParametersHNSW(**kwargs)

    monkeypatch.setattr(accelerator, "_faiss", types.SimpleNamespace(
        SearchParametersHNSW=recorded, omp_get_max_threads=faiss.omp_get_max_threads,
        omp_set_num_threads=faiss.omp_set_num_threads))
    queries = clustered(20, seed=13)
    assert recall_at(index, queries, 3, None) == 1.0
    assert set(breadths) == {64}
    breadths.clear()
    for k, breadth in ((10, 80), (50, 128)):
        index.search(queries[0], k, None)
        assert breadths[-1] == breadth


@needs_faiss
def test_walks_and_inserts_use_one_openmp_thread_and_leave_the_thread_s_setting(
    accelerated: tuple[VectorIndex, HnswAccelerator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search of several probes and an insert of new rows call faiss with one OpenMP thread
    (a team's idle worker would spin on a core for milliseconds after each call), and the
    calling thread's OpenMP setting is as it was afterwards, also when a walk raises."""
    index, accelerator = accelerated
    faiss = accelerator._faiss
    # (call, the OpenMP threads it may use)
    seen: list[tuple[str, int]] = []

    class Noted:
        """A graph's faiss index that notes the OpenMP threads each call may use."""

        def __init__(self, inner: Any, fails: bool) -> None:
            self.inner, self.fails = inner, fails

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def search(self, *args: Any, **kwargs: Any) -> Any:
            seen.append(("search", faiss.omp_get_max_threads()))
            if self.fails:
                raise RuntimeError("walk failed")
            return self.inner.search(*args, **kwargs)

        def add(self, vectors: Any) -> None:
            seen.append(("add", faiss.omp_get_max_threads()))
            self.inner.add(vectors)

    plain = {code: graph.index for code, graph in accelerator._graphs.items()}

    def noted(fails: bool) -> None:
        for code, graph in accelerator._graphs.items():
            graph.index = Noted(plain[code], fails)

    def walks(after: list[int]) -> None:
        faiss.omp_set_num_threads(3)  # as if the thread's default were a team of three
        try:
            index.search_rows(clustered(4, seed=17), 5, None)
        except RuntimeError:
            pass
        after.append(faiss.omp_get_max_threads())

    for fails in (False, True):
        noted(fails)
        after: list[int] = []
        thread = threading.Thread(target=walks, args=(after,))
        thread.start()
        thread.join()
        assert after == [3]
    noted(False)
    insert = accelerator._insert

    def inserting(batch: list[tuple[str, int]]) -> None:
        faiss.omp_set_num_threads(3)  # the worker's thread, likewise
        insert(batch)
        seen.append(("after the insert", faiss.omp_get_max_threads()))

    monkeypatch.setattr(accelerator, "_insert", inserting)
    index.add([f"m{i}" for i in range(40)], kinds(40), clustered(40, seed=19))
    assert accelerator.wait(30)
    assert {call for call, _ in seen} == {"search", "add", "after the insert"}
    assert {threads for call, threads in seen if call != "after the insert"} == {1}
    assert {threads for call, threads in seen if call == "after the insert"} == {3}


@pytest.mark.slow
@needs_faiss
def test_a_row_removed_during_a_rebuild_is_dead_in_both_graphs_and_counted_once(
    accelerated: tuple[VectorIndex, HnswAccelerator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row removed while the graphs are rebuilt, after its type's graph took it, is marked
    dead there and in the graph of every row, and counted once (`dead` counts rows, as
    `labels` does). Regressions: the graph of every row read the snapshot's codes after the
    removal had marked them, left the row out, and the rebuild failed (searches exact from
    then on); and the rebuild summed both graphs' marks, so one removal counted two."""
    index, accelerator = accelerated
    graph_of = accelerator._graph_of
    removed: list[str] = []

    def removing_meanwhile(snap: Any, rows: Any) -> Any:
        graph = graph_of(snap, rows)
        if not removed:
            removed.append(snap.ids[rows[0]])
            index.remove(removed)  # after the build's snapshot, in the first graph built
        return graph

    monkeypatch.setattr(accelerator, "_graph_of", removing_meanwhile)
    with accelerator._lock:
        accelerator._rebuild_due = True
        accelerator._kick()
    assert accelerator.wait(30)
    assert accelerator.failure is None
    assert accelerator.ready
    assert accelerator.stats()["dead"] == 1
    assert accelerator.stats()["labels"] == 2000
    queries = clustered(20, seed=9)
    assert not {node_id for q in queries for node_id, _ in index.search(q, 10)} & set(removed)
    assert recall_at(index, queries, 10, None) >= 0.9


async def test_a_big_gather_of_one_type_runs_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first `of_type` after a change copies every row of the type (113 MB of intents at
    1M nodes): from a big index, the routes' exact probes and the intent dedup of a commit
    gather in a worker thread; a gather already made answers on the loop."""
    n = 300
    index = VectorIndex(DIM)
    index.add([f"i{i}" for i in range(n)], [NodeType.INTENT] * n, clustered(n))
    monkeypatch.setattr(ann, "IN_THREAD_FROM", 100)
    loop = threading.get_ident()
    on_loop: list[bool] = []
    gather = index.of_type

    def recorded(kind: NodeType) -> tuple[list[str], Vector]:
        on_loop.append(threading.get_ident() == loop)
        return gather(kind)

    monkeypatch.setattr(index, "of_type", recorded)
    probes = clustered(2, seed=5)
    truth = [exact(index, p, 3, [NodeType.INTENT]) for p in probes]
    found = await ann.nearest_of_type(index, probes, NodeType.INTENT, 3)
    assert [[i for i, _ in row] for row in found] == [[i for i, _ in row] for row in truth]
    assert on_loop == [False]
    await ann.nearest_of_type(index, probes, NodeType.INTENT, 3)
    assert on_loop == [False, True]  # from the copy

    index.add(["i0"], [NodeType.INTENT], clustered(1, seed=9))  # a change: gathered again
    near = draft("new", NodeType.INTENT, "walk the dog", vector=index.get("i7"))

    async def texts_of(ids: list[str]) -> dict[str, str]:
        return {i: "walk the dog" for i in ids}

    out = await dedup.resolve_intents([near], index, texts_of, texts_of, Merger().one,
                                      identity_threshold=0.95, merge_threshold=0.8)
    assert on_loop == [False, True, False]
    assert out.survivor("new") == "i7"  # the same vector: the graph's intent stands for it


async def test_the_stores_gather_a_type_through_the_loop_safe_call(
    graph: GraphStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store's `vectors_of_type` of the tags (its in-memory rows, on both backends) goes
    through `ann.of_type`, which gathers a big index's rows off the loop."""
    kinds: list[NodeType] = []
    gather = ann.of_type

    async def recorded(index: VectorIndex, kind: NodeType) -> tuple[list[str], Vector]:
        kinds.append(kind)
        return await gather(index, kind)

    monkeypatch.setattr(ann, "of_type", recorded)
    ids, matrix = await graph.vectors_of_type(REPO, NodeType.TAG)
    assert (ids, matrix.shape[0]) == ([], 0)
    assert kinds == [NodeType.TAG]


def test_a_row_the_graphs_cannot_answer_alone_goes_to_the_exact_scan() -> None:
    """`search_rows` takes each row the graphs answered from them and scans only the rows
    they could not (too few survivors), as each row searched alone would."""
    vectors = clustered(600, seed=21)
    index = VectorIndex(DIM)
    index.add([f"n{i}" for i in range(600)], kinds(600), vectors)

    class OneRowOnly:
        def added(self, ids: Any) -> None: ...

        def removed(self, ids: Any) -> None: ...

        def search(self, queries: Any, k: int, codes: Any) -> Any:
            return [[("from the graphs", 1.0)], None]

    index.accelerator = OneRowOnly()
    probes = clustered(2, seed=22)
    found = index.search_rows(probes, 3)
    index.accelerator = None
    assert found == [[("from the graphs", 1.0)], index.search(probes[1], 3)]
