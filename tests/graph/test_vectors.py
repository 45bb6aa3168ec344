"""`VectorIndex`: exact cosine search, type filters, replacement, removal and snapshots."""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings, strategies as st

from mnemo.episode import StepRecord, starts_trajectory
from mnemo.graph.model import NodeType, Vector
from mnemo.graph.vectors import DEAD, VectorIndex, of_codes, unit
from mnemo.ports import cosine, reaches
from tests.graph._support import rounded
from tests.strategies import matrices, node_types, vectors

DIM = 6
TOL = 1e-5


def reference(
    matrix: Vector, query: Vector, allowed: npt.NDArray[np.bool_] | None = None
) -> npt.NDArray[np.float64]:
    """Brute-force cosines in float64 (0 for zero rows or a zero query; NaN where not allowed)."""
    rows = matrix.astype(np.float64)
    q = query.astype(np.float64)
    norms = np.linalg.norm(rows, axis=1) * np.linalg.norm(q)
    dots = rows @ q
    scores: npt.NDArray[np.float64] = np.divide(
        dots, norms, out=np.zeros_like(dots), where=norms > 0
    )
    if allowed is not None:
        scores = np.where(allowed, scores, np.nan)
    return scores


def index_of(matrix: Vector, types: list[NodeType] | None = None) -> tuple[VectorIndex, list[str]]:
    ids = [f"n{i}" for i in range(len(matrix))]
    index = VectorIndex(DIM)
    index.add(ids, types or [NodeType.SEMANTIC] * len(ids), matrix)
    return index, ids


@st.composite
def typed_matrices(draw: st.DrawFn) -> tuple[Vector, list[NodeType]]:
    matrix = draw(matrices(st.integers(1, 30), DIM))
    types = draw(st.lists(node_types, min_size=len(matrix), max_size=len(matrix)))
    return matrix, types


@settings(max_examples=150)
@given(
    data=typed_matrices(),
    query=vectors(DIM),
    k=st.integers(1, 35),
    allowed_types=st.none() | st.sets(node_types, max_size=3),
)
def test_search_equals_brute_force(
    data: tuple[Vector, list[NodeType]],
    query: Vector,
    k: int,
    allowed_types: set[NodeType] | None,
) -> None:
    """Search returns the k best cosines of the allowed rows, best first, as numpy computes."""
    matrix, types = data
    index, ids = index_of(matrix, types)
    allowed = None if allowed_types is None else np.array([t in allowed_types for t in types])
    ref = reference(matrix, query, allowed)
    result = index.search(query, k, allowed_types)

    candidates = int(np.sum(~np.isnan(ref)))
    assert len(result) == min(k, candidates)
    assert len({node_id for node_id, _ in result}) == len(result)
    scores = [score for _, score in result]
    assert all(a >= b for a, b in itertools.pairwise(scores))
    for node_id, score in result:
        assert score == pytest.approx(ref[ids.index(node_id)], abs=TOL)
    # Ties make the ids at the cut arbitrary, but the scores kept must be the top k.
    best = np.sort(ref[~np.isnan(ref)])[::-1][: len(result)]
    np.testing.assert_allclose(scores, best, atol=TOL)



@settings(max_examples=100)
@given(
    matrix=matrices(st.integers(1, 30), DIM),
    query=vectors(DIM),
    data=st.data(),
)
def test_similarities_are_the_cosine_of_each_known_id(
    matrix: Vector, query: Vector, data: st.DataObject
) -> None:
    """`similarities` gives each asked id that has a row (once, in the order asked) its cosine
    to the query; ids without a row, or removed, are left out."""
    index, ids = index_of(matrix)
    removed = data.draw(st.sets(st.sampled_from(ids)))
    index.remove(removed)
    asked = data.draw(st.lists(st.sampled_from([*ids, "stranger"]), max_size=40))
    found = index.similarities(asked, query)
    expected = [i for i in dict.fromkeys(asked) if i in ids and i not in removed]
    assert list(found) == expected
    ref = reference(matrix, query)
    for node_id, score in found.items():
        assert score == pytest.approx(ref[ids.index(node_id)], abs=TOL)


@given(
    st.lists(st.integers(-128, 127), max_size=40),
    st.sets(st.integers(-128, 127), max_size=8),
)
def test_of_codes_is_membership_and_never_dead(codes: list[int], wanted: set[int]) -> None:
    array = np.array(codes, dtype=np.int8)
    expected = [code in wanted and code != DEAD for code in codes]
    assert of_codes(array, wanted).tolist() == expected


def test_type_filter_returns_only_those_types() -> None:
    """A type filter leaves other types out even when they are closer."""
    index = VectorIndex(DIM)
    index.add(
        ["tag", "fact", "step"],
        [NodeType.TAG, NodeType.SEMANTIC, NodeType.EPISODIC],
        np.array([[1, 0, 0, 0, 0, 0], [0.6, 0.8, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0]]),
    )
    query = np.array([1, 0, 0, 0, 0, 0], dtype=np.float32)
    assert [i for i, _ in index.search(query, 5, [NodeType.SEMANTIC])] == ["fact"]
    assert [i for i, _ in index.search(query, 5, [NodeType.SEMANTIC, NodeType.EPISODIC])] == [
        "fact",
        "step",
    ]
    assert index.search(query, 5, [NodeType.INTENT]) == []
    assert index.search(query, 5, []) == []


def test_search_on_empty_index_and_k_zero() -> None:
    """An empty index, or k <= 0, gives no results."""
    index = VectorIndex(DIM)
    query = np.ones(DIM, dtype=np.float32)
    assert index.search(query, 5) == []
    assert len(index) == 0
    index.add(["a"], [NodeType.TAG], query[None, :])
    assert index.search(query, 0) == []
    assert index.search(query, -1) == []


def test_add_rejects_wrong_shape() -> None:
    """Vectors of another dimension, or a count not matching the ids, raise ValueError."""
    index = VectorIndex(DIM)
    with pytest.raises(ValueError, match="dim"):
        index.add(["a"], [NodeType.TAG], np.ones((1, DIM + 1)))
    with pytest.raises(ValueError, match="vectors"):
        index.add(["a", "b"], [NodeType.TAG] * 2, np.ones((1, DIM)))
    assert len(index) == 0


@settings(max_examples=50)
@given(matrices(st.integers(2, 20), DIM), st.data())
def test_remove_drops_rows_and_keeps_the_rest(matrix: Vector, data: st.DataObject) -> None:
    """Removed ids are gone from search, get and len; the others keep their vectors."""
    index, ids = index_of(matrix)
    gone = data.draw(st.sets(st.sampled_from(ids), min_size=1))
    index.remove([*gone, "never-added"])
    kept = [i for i in ids if i not in gone]
    assert len(index) == len(kept)
    for node_id in gone:
        assert node_id not in index
        assert index.get(node_id) is None
    for node_id in kept:
        got = index.get(node_id)
        assert got is not None
        np.testing.assert_allclose(got, unit(matrix[ids.index(node_id)])[0], atol=TOL)
    query = data.draw(vectors(DIM))
    found = {node_id for node_id, _ in index.search(query, len(ids))}
    assert found == set(kept)


def test_remove_then_add_again() -> None:
    """An id removed and added again is found once, with its new vector."""
    index = VectorIndex(DIM)
    index.add(["a", "b"], [NodeType.TAG] * 2, np.eye(DIM)[:2])
    index.remove(["a"])
    index.add(["a"], [NodeType.INTENT], np.eye(DIM)[2:3])
    assert len(index) == 2
    assert rounded(index.search(np.eye(DIM)[2], 5, [NodeType.INTENT])) == [("a", 1.0)]
    assert index.search(np.eye(DIM)[0], 1)[0][1] == pytest.approx(0.0)


def test_replace_updates_vector_and_type_in_place() -> None:
    """Adding an existing id replaces its vector and type without adding a row."""
    index = VectorIndex(DIM)
    index.add(["a", "b"], [NodeType.TAG, NodeType.TAG], np.eye(DIM)[:2])
    index.add(["a"], [NodeType.INTENT], np.array([[0, 0, 3, 0, 0, 0]]))
    assert len(index) == 2
    replaced = index.get("a")
    assert replaced is not None
    np.testing.assert_allclose(replaced, np.eye(DIM)[2])
    assert rounded(index.search(np.eye(DIM)[2], 1)) == [("a", 1.0)]
    assert rounded(index.search(np.eye(DIM)[0], 5, [NodeType.TAG])) == [("b", 0.0)]
    assert [i for i, _ in index.search(np.eye(DIM)[2], 5, [NodeType.INTENT])] == ["a"]


def test_growth_keeps_every_row() -> None:
    """Adding past the initial capacity keeps every earlier row findable."""
    index = VectorIndex(DIM)
    rng = np.random.default_rng(7)
    matrix = rng.standard_normal((2500, DIM)).astype(np.float32)
    for start in range(0, 2500, 700):
        chunk = range(start, min(start + 700, 2500))
        index.add(
            [f"n{i}" for i in chunk],
            [NodeType.SEMANTIC] * len(chunk),
            matrix[chunk.start : chunk.stop],
        )
    assert len(index) == 2500
    for i in (0, 1023, 1024, 2499):
        assert rounded(index.search(matrix[i], 1)) == [(f"n{i}", 1.0)]


def test_zero_vectors_score_zero() -> None:
    """A zero row scores 0 against any query, and a zero query scores 0 against every row."""
    index = VectorIndex(DIM)
    index.add(["zero", "one"], [NodeType.TAG] * 2, np.vstack([np.zeros(DIM), np.eye(DIM)[0]]))
    np.testing.assert_array_equal(index.get("zero"), np.zeros(DIM))
    assert index.search(np.eye(DIM)[0], 2) == [("one", 1.0), ("zero", 0.0)]
    assert sorted(index.search(np.zeros(DIM), 2)) == [("one", 0.0), ("zero", 0.0)]
    assert cosine(np.zeros(DIM, dtype=np.float32), np.ones(DIM, dtype=np.float32)) == 0.0
    np.testing.assert_array_equal(unit(np.zeros((2, DIM))), np.zeros((2, DIM)))


@pytest.mark.parametrize("threshold", [0.95, 0.9, 0.8, 0.75, 0.35])
def test_a_cosine_exactly_at_a_threshold_reaches_it(threshold: float) -> None:
    """Float32 vectors whose exact cosine is the threshold count as at it (the API contract: "at or
    above"), though float32 puts some of them a hair below (0.95 -> 0.94999999), and a step
    whose subgoal is exactly that similar does not start a trajectory."""
    def vector(c: float) -> Vector:
        return np.array([c, np.sqrt(1.0 - c * c), 0.0], dtype=np.float32)

    ones, at = vector(1.0), vector(threshold)
    assert reaches(cosine(ones, at), threshold)
    assert not reaches(threshold - 1e-3, threshold)
    previous = StepRecord("s0", 0, "t", "obs", "act", "state", "goal", ones)
    assert not starts_trajectory(previous, at, threshold)
    assert starts_trajectory(previous, vector(threshold - 1e-3), threshold)


def test_results_and_vectors_from_before_a_remove_stay_valid() -> None:
    """A result list and a vector taken before a remove are unchanged by it."""
    index = VectorIndex(DIM)
    index.add(["a", "b", "c"], [NodeType.TAG] * 3, np.eye(DIM)[:3])
    query = np.array([3, 2, 1, 0, 0, 0], dtype=np.float32)
    before = index.search(query, 3)
    copy = list(before)
    vector_b = index.get("b")
    index.remove(["a", "b"])
    assert before == copy
    assert [i for i, _ in before] == ["a", "b", "c"]
    assert vector_b is not None
    np.testing.assert_array_equal(vector_b, np.eye(DIM)[1])
    assert [i for i, _ in index.search(query, 3)] == ["c"]


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Makes the interpreter switch threads as often as it can, to expose races."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


@pytest.mark.usefixtures("fast_switching")
def test_search_in_a_thread_during_removes_sees_one_snapshot() -> None:
    """Searches in a worker thread while rows are removed and re-added never mix versions."""
    n = 3000
    rng = np.random.default_rng(3)
    matrix = rng.standard_normal((n, DIM)).astype(np.float32)
    kinds = [NodeType.SEMANTIC if i % 2 else NodeType.TAG for i in range(n)]
    ids = [f"n{i}" for i in range(n)]
    position = {node_id: i for i, node_id in enumerate(ids)}
    index = VectorIndex(DIM)
    index.add(ids, kinds, matrix)
    query = rng.standard_normal(DIM).astype(np.float32)
    expected = reference(matrix, query)
    problems: list[str] = []
    done = threading.Event()

    def search_many() -> None:
        try:
            for _ in range(600):
                for node_id, score in index.search(query, 10, [NodeType.SEMANTIC]):
                    i = position[node_id]
                    if kinds[i] is not NodeType.SEMANTIC or abs(expected[i] - score) > 1e-4:
                        problems.append(f"{node_id} scored {score}, expected {expected[i]}")
        except Exception as exc:
            problems.append(repr(exc))
        finally:
            done.set()

    worker = threading.Thread(target=search_many)
    worker.start()
    while not done.is_set():
        i = int(rng.integers(n))
        index.remove([ids[i]])
        index.add([ids[i]], [kinds[i]], matrix[i : i + 1])
    worker.join()
    assert problems == []


def test_of_type_is_gathered_once_until_the_index_changes() -> None:
    """Recall asks for a type's rows at every call: they are gathered once, and again only
    after an add or a remove (at 1M nodes each gathering copied 113 MB of intents)."""
    index = VectorIndex(4)
    index.add(["t1", "f1"], [NodeType.TAG, NodeType.SEMANTIC], np.eye(4, dtype=np.float32)[:2])
    ids, matrix = index.of_type(NodeType.TAG)
    again = index.of_type(NodeType.TAG)
    assert again[1] is matrix
    assert again[0] == ids == ["t1"]
    index.add(["t1"], [NodeType.TAG], np.eye(4, dtype=np.float32)[2:3])  # replaced in place
    ids, matrix = index.of_type(NodeType.TAG)
    assert ids == ["t1"]
    np.testing.assert_allclose(matrix, np.eye(4, dtype=np.float32)[2:3])
    index.add(["t2"], [NodeType.TAG], np.eye(4, dtype=np.float32)[3:4])
    assert index.of_type(NodeType.TAG)[0] == ["t1", "t2"]
    index.remove(["t1"])
    assert index.of_type(NodeType.TAG)[0] == ["t2"]


def test_a_gather_in_the_middle_of_an_add_is_not_kept_for_after_it() -> None:
    """`of_type` runs in a worker thread while the event loop's thread adds rows: a gather
    made while an add is half done is never answered once the add is over (it was, when the
    version moved before the rows did: the new intent stayed out of recall's routes and a
    commit's dedup)."""
    index = VectorIndex(4)
    eye = np.eye(4, dtype=np.float32)
    index.add(["a"], [NodeType.INTENT], eye[:1])

    class Meanwhile(list[NodeType]):
        """The add's types, read while it is half done: a gather runs then, as a worker
        thread's would."""

        def __getitem__(self, i: Any) -> Any:
            index.of_type(NodeType.INTENT)
            return super().__getitem__(i)

    index.add(["b"], Meanwhile([NodeType.INTENT]), eye[1:2])
    assert index.of_type(NodeType.INTENT)[0] == ["a", "b"]
    assert index.has_of_type(NodeType.INTENT)
