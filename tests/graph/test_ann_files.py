"""HNSW graphs saved beside the store: read back instead of built, checked row by row against
the store's rows, rebuilt when unusable, and safe against a save cut short."""

from __future__ import annotations

import logging
import lzma
import shutil
from pathlib import Path
from typing import IO

import anyio
import pytest

from mnemo.graph import ann, ann_files
from mnemo.graph.ann import HnswAccelerator, HnswParams
from mnemo.graph.model import NodeType, Vector
from mnemo.graph.vectors import VectorIndex
from mnemo.storage.sqlite import SqliteBackend
from tests.graph._support import policy
from tests.graph.test_ann import DIM, THRESHOLD, changeset, clustered, exact, kinds, needs_faiss

pytestmark = needs_faiss
N = 1500


def index_of(vectors: Vector, ids: list[str] | None = None) -> VectorIndex:
    index = VectorIndex(DIM)
    index.add(ids or [f"n{i}" for i in range(len(vectors))], kinds(len(vectors)), vectors)
    return index


def accelerate(
    index: VectorIndex, folder: Path, params: HnswParams | None = None
) -> HnswAccelerator:
    accelerator = ann.attach(index, threshold=THRESHOLD, params=params, folder=folder)
    assert accelerator is not None
    assert accelerator.wait(60)
    assert accelerator.failure is None
    return accelerator


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Vector, Path]:
    """Graphs of N clustered rows, built and saved once a module; the rows and the folder."""
    vectors = clustered(N, seed=3)
    folder = tmp_path_factory.mktemp("built") / "graphs"
    accelerator = accelerate(index_of(vectors), folder)
    assert accelerator.stats()["read"] == 0
    accelerator.close(10)
    return vectors, folder


@pytest.fixture
def saved(built: tuple[Vector, Path], tmp_path: Path) -> tuple[Vector, Path]:
    """A test's own copy of the saved graphs' folder, and the rows."""
    vectors, folder = built
    return vectors.copy(), Path(shutil.copytree(folder, tmp_path / "graphs"))


@pytest.mark.slow
def test_saved_graphs_are_read_back_and_search_as_built(saved: tuple[Vector, Path]) -> None:
    """A second index of the same rows reads the graphs instead of building them, and its
    searches return what the built graphs returned."""
    vectors, folder = saved
    built_index = index_of(vectors)
    built = accelerate(built_index, folder.parent / "elsewhere")
    index = index_of(vectors)
    read = accelerate(index, folder)
    try:
        assert read.stats() | {"read": 0} == built.stats()
        assert read.stats()["read"] == 1
        for q in clustered(20, seed=9):
            assert index.search(q, 10) == built_index.search(q, 10)
            assert index.search(q, 5, [NodeType.SEMANTIC]) == built_index.search(
                q, 5, [NodeType.SEMANTIC])
    finally:
        read.close(10)
        built.close(10)


def test_the_saved_files_hold_links_and_digests_not_vectors(
    saved: tuple[Vector, Path],
) -> None:
    """No row's vector is in the saved file (a forgotten node's would outlive it there), and
    the two graphs of a row take less than one float32 vector of it (they held two)."""
    vectors, folder = saved
    saved_bytes = (folder / "graphs").read_bytes()
    unpacked = lzma.decompress(saved_bytes)
    assert all(vector.tobytes()[:16] not in unpacked for vector in vectors[:50])
    assert len(saved_bytes) / N < 4 * DIM


@pytest.mark.slow
def test_rows_changed_since_the_save_are_never_answered_from_it(
    saved: tuple[Vector, Path],
) -> None:
    """Against the store's rows: a removed node is not found, a node with another vector is
    found by its new one (its saved label is dead), and a node added since is inserted."""
    vectors, folder = saved
    changed = vectors.copy()
    changed[7] = -vectors[7]
    ids = [f"n{i}" for i in range(N)]
    ids[3] = "someone-else"  # n3 gone, a new node in its place
    index = index_of(changed, ids)
    extra = clustered(5, seed=11)
    index.add([f"x{i}" for i in range(5)], [NodeType.EPISODIC] * 5, extra)
    accelerator = accelerate(index, folder)
    try:
        stats = accelerator.stats()
        assert stats["read"] == 1
        assert stats["pending"] == 0
        assert stats["labels"] - stats["dead"] == N + 5
        assert "n3" not in {i for i, _ in index.search(vectors[3], 50)}
        top = index.search(vectors[7], 50)
        assert "n7" not in {i for i, _ in top}
        assert index.search(-vectors[7], 1)[0][0] == "n7"
        assert index.search(changed[3], 1)[0][0] == "someone-else"
        for i in range(5):
            assert index.search(extra[i], 1)[0][0] == f"x{i}"
        # Every answer still matches the exact scan's best row.
        for q in clustered(20, seed=12):
            assert index.search(q, 1) == exact(index, q, 1)
    finally:
        accelerator.close(10)


@pytest.mark.slow
def test_a_store_that_changed_too_much_is_rebuilt(saved: tuple[Vector, Path]) -> None:
    vectors, folder = saved
    fresh = clustered(N, seed=4)
    fresh[: N // 2] = vectors[: N // 2]  # half the rows as saved, half new vectors
    accelerator = accelerate(index_of(fresh), folder)
    try:
        assert accelerator.stats()["read"] == 0
        assert accelerator.stats()["dead"] == 0
    finally:
        accelerator.close(10)
    # ... and the rebuilt graphs were saved in their place.
    again = accelerate(index_of(fresh), folder)
    try:
        assert again.stats()["read"] == 1
        assert again.stats()["dead"] == 0
    finally:
        again.close(10)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "not xz", "records cut short"])
def test_unreadable_files_are_rebuilt_with_a_warning(
    saved: tuple[Vector, Path], damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    vectors, folder = saved
    path = folder / "graphs"
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:1000])
    elif damage == "not xz":
        path.write_bytes(b"{not a graph")
    else:
        path.write_bytes(lzma.compress(lzma.decompress(path.read_bytes())[:5000]))
    index = index_of(vectors)
    with caplog.at_level(logging.WARNING, logger="mnemo"):
        accelerator = accelerate(index, folder)
    try:
        assert accelerator.stats()["read"] == 0
        assert "not used" in caplog.text
        q = clustered(1, seed=5)[0]
        assert index.search(q, 1) == exact(index, q, 1)
    finally:
        accelerator.close(10)


@pytest.mark.slow
def test_graphs_saved_with_other_settings_are_not_read(saved: tuple[Vector, Path]) -> None:
    vectors, folder = saved
    accelerator = accelerate(index_of(vectors), folder, HnswParams(m=16))
    try:
        assert accelerator.stats()["read"] == 0
    finally:
        accelerator.close(10)


@pytest.mark.slow
def test_graphs_of_another_generation_of_the_vectors_are_not_read(
    saved: tuple[Vector, Path],
) -> None:
    """The same rows of the same dimension, re-embedded (the next generation): built, not read
    (before, the old graphs were read back, the rows being the same, and a cancelled
    re-embedding could leave them in place)."""
    vectors, folder = saved
    index = VectorIndex(DIM, generation=1)
    index.add([f"n{i}" for i in range(N)], kinds(N), vectors)
    accelerator = accelerate(index, folder)
    try:
        assert accelerator.stats()["read"] == 0
    finally:
        accelerator.close(10)


@pytest.mark.slow
def test_graphs_of_vectors_of_another_dimension_are_not_read(
    saved: tuple[Vector, Path],
) -> None:
    """A repo whose embedder changed dimension (the store's rows were re-embedded) builds."""
    _, folder = saved
    index = VectorIndex(DIM * 2)
    index.add([f"n{i}" for i in range(N)], kinds(N), clustered(N, seed=3).repeat(2, axis=1))
    accelerator = accelerate(index, folder)
    try:
        assert accelerator.stats()["read"] == 0
    finally:
        accelerator.close(10)


@pytest.mark.slow
def test_a_failure_while_checking_the_files_falls_back_to_a_build(
    saved: tuple[Vector, Path], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    vectors, folder = saved

    def broken(*args: object) -> None:
        raise MemoryError("no room to compare")

    monkeypatch.setattr(ann_files, "adopt", broken)
    index = index_of(vectors)
    with caplog.at_level(logging.ERROR, logger="mnemo"):
        accelerator = accelerate(index, folder)
    try:
        assert accelerator.stats()["read"] == 0
        assert accelerator.ready
        assert "reading the saved HNSW graphs failed" in caplog.text
    finally:
        accelerator.close(10)


def test_rows_changed_while_the_files_are_checked_are_not_lost(
    saved: tuple[Vector, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row removed and a row added while a load checks the files against its snapshot
    (the event loop goes on meanwhile): the removed one is dead, the added one inserted."""
    vectors, folder = saved
    index = index_of(vectors)
    late = clustered(1, seed=13)
    real = ann_files.adopt

    def meanwhile(*args: object, **kwargs: object) -> ann_files.Adopted:
        adopted = real(*args, **kwargs)  # type: ignore[arg-type]
        assert any("n10" in live for live in adopted.live.values())  # live when checked ...
        index.remove(["n10"])  # ... and removed before the graphs are published
        index.add(["late"], [NodeType.EPISODIC], late)
        return adopted

    monkeypatch.setattr(ann_files, "adopt", meanwhile)
    accelerator = accelerate(index, folder)
    try:
        stats = accelerator.stats()
        assert stats["read"] == 1
        assert stats["pending"] == 0
        assert stats["dead"] == 1
        assert stats["labels"] - stats["dead"] == N
        assert "n10" not in {i for i, _ in index.search(vectors[10], 50)}
        assert index.search(late[0], 1)[0][0] == "late"
    finally:
        accelerator.close(10)


@pytest.mark.slow
def test_a_failed_save_leaves_nothing_behind_and_is_not_retried_at_once(
    saved: tuple[Vector, Path], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A save that fails midway (a full disk) deletes what it wrote, keeps the previous save
    current, and the graphs in memory go on answering."""
    _, folder = saved
    before = (folder / "graphs").read_bytes()
    attempts: list[object] = []

    def full_disk(self: ann_files.GraphFolder, out: IO[bytes], *args: object) -> None:
        attempts.append(out)
        out.write(b"\0" * 1000)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ann_files.GraphFolder, "_write", full_disk)
    fresh = clustered(N, seed=4)  # too different from the save: rebuilt, then saved
    index = index_of(fresh)
    with caplog.at_level(logging.WARNING, logger="mnemo"):
        accelerator = accelerate(index, folder)
    try:
        assert len(attempts) == 1
        assert "No space left" in caplog.text
        assert accelerator.ready
        assert {p.name for p in folder.iterdir()} == {"graphs", "lock"}
        assert (folder / "graphs").read_bytes() == before
        more = clustered(20, seed=14)
        index.add([f"m{i}" for i in range(20)], [NodeType.EPISODIC] * 20, more)
        assert accelerator.wait(60)
        assert len(attempts) == 1  # 20 inserts are not a tenth of the graphs
        assert index.search(more[3], 1)[0][0] == "m3"
    finally:
        accelerator.close(10)


def test_a_save_cut_short_leaves_the_previous_one_current(saved: tuple[Vector, Path]) -> None:
    """A process killed mid-save leaves a half-written temporary file: the previous save is
    still the one read, and the next save deletes what the dead one left (and the files of an
    older format)."""
    vectors, folder = saved
    before = (folder / "graphs").stat().st_ino
    (folder / ".half.tmp").write_bytes(b"\0" * 100)
    (folder / "v-old").mkdir()
    index = index_of(vectors)
    accelerator = accelerate(index, folder)
    try:
        assert accelerator.stats()["read"] == 1
        assert accelerator.files is not None
        accelerator.files.save(accelerator._graphs, ann.load_faiss())
    finally:
        accelerator.close(10)
    assert {p.name for p in folder.iterdir()} == {"graphs", "lock"}
    assert (folder / "graphs").stat().st_ino != before  # saved again


@pytest.mark.slow
def test_inserts_are_saved_once_they_are_a_tenth_of_the_graphs(
    saved: tuple[Vector, Path],
) -> None:
    vectors, folder = saved
    index = index_of(vectors)
    accelerator = accelerate(index, folder)
    more = clustered(N // 5, seed=6)
    try:
        before = (folder / "graphs").read_bytes()
        index.add([f"m{i}" for i in range(len(more))], [NodeType.EPISODIC] * len(more), more)
        assert accelerator.wait(60)
        assert (folder / "graphs").read_bytes() != before
    finally:
        accelerator.close(10)
    reopened = index_of(vectors)
    reopened.add([f"m{i}" for i in range(len(more))], [NodeType.EPISODIC] * len(more), more)
    again = accelerate(reopened, folder)
    try:
        assert again.stats()["read"] == 1
        assert again.stats()["pending"] == 0
        assert again.stats()["dead"] == 0
    finally:
        again.close(10)


@pytest.mark.slow
async def test_a_sqlite_store_saves_its_graphs_beside_the_file(tmp_path: Path) -> None:
    """Through the backend: the graphs go to "<file>.hnsw", and a store opened again on the
    file reads them, with the nodes deleted in between gone from its searches."""
    path = tmp_path / "store.db"
    vectors = clustered(900, seed=2)

    async def opened() -> SqliteBackend:
        backend = SqliteBackend(path, dims=lambda repo: DIM, busy_timeout=5.0)
        backend.graph._vectors._ann_threshold = THRESHOLD  # small enough to be built
        await backend.open()
        return backend

    backend = await opened()
    try:
        await backend.graph.apply(changeset("a", vectors, 0), intents=policy())
        await backend.graph.search_vectors("r", vectors[0], 1)
        with anyio.fail_after(60):
            await backend.graph.settle("r")
    finally:
        await backend.close()
    assert await anyio.Path(f"{path}.hnsw").is_dir()

    backend = await opened()
    try:
        await backend.graph.delete_nodes("r", ["v5"])
        await backend.graph.search_vectors("r", vectors[6], 1)  # loads the index
        with anyio.fail_after(60):
            await backend.graph.settle("r")
        index = await backend.graph.vector_index("r")
        assert isinstance(index.accelerator, HnswAccelerator)
        assert index.accelerator.stats()["read"] == 1
        assert index.accelerator.stats()["dead"] == 1  # v5's label, checked against the rows
        assert (await backend.graph.search_vectors("r", vectors[6], 1))[0][0] == "v6"
        assert "v5" not in {n for n, _ in await backend.graph.search_vectors("r", vectors[5], 20)}
    finally:
        await backend.close()

