"""HNSW graphs saved beside the store, so that opening a big repo does not rebuild them; the
store stays the one truth. One file (xz) holds the graphs' links (no vectors); the ids and
vector digests of the graph of every row (`ALL`)'s labels; a type graph's labels as places in
`ALL`'s. At load a label is live only if the index holds that node with that type and digest;
too much dead or another format or setting: rebuilt instead. A save writes a temporary file
and renames it over the saved one, under the folder's lock.
"""

from __future__ import annotations

import hashlib
import json
import logging
import lzma
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import filelock
import numpy as np
import numpy.typing as npt

from mnemo import disk
from mnemo.graph.vectors import DEAD, Snapshot

log = logging.getLogger("mnemo")

# The key of the graph holding every row (type codes are >= 0).
ALL = -1
FORMAT = 3
# Labels compared per chunk at load (a chunk's vectors are copied once).
_CHUNK = 50_000
# xz's preset for the file (BENCHMARKS.md).
_PRESET = 1
# How long a save waits for another process's save before giving up on its own.
_LOCK_WAIT = 600.0


@dataclass(slots=True)
class Graph:
    """One HNSW graph: faiss label i is the node `labels[i]`. A type graph's `live` maps each
    node whose row it holds as the index has it now to that label (`ALL`'s stays empty)."""

    index: Any
    labels: list[str] = field(default_factory=list)
    live: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Saved:
    """One graph read back: the faiss index without vectors (`restore` gives it the store's),
    each label's node id and label in `ALL` (`places`), and the digest of the vector each of
    `ALL`'s labels was built from."""

    index: Any
    labels: list[str]
    places: npt.NDArray[np.int64]
    digests: npt.NDArray[np.uint64]


@dataclass(frozen=True, slots=True)
class Adopted:
    """What a load keeps of the saved graphs: each type graph's live labels, the snapshot's ids
    no live label holds, and per graph each label's row of the snapshot (-1: dead)."""

    live: dict[int, dict[str, int]]
    missing: list[str]
    rows: dict[int, npt.NDArray[np.int64]]


def discard(folder: Path) -> None:
    """Deletes a repo's saved graphs, under the folder's lock."""
    if folder.is_dir():
        with _lock(folder):
            _clear(folder, keep=())


def _clear(folder: Path, keep: tuple[str, ...]) -> None:
    """Deletes what the folder holds but its lock and `keep`: a killed save's temporary file,
    another format's files."""
    for old in folder.iterdir():
        if old.name not in ("lock", *keep):
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)


def _lock(folder: Path) -> filelock.FileLock:
    return filelock.FileLock(str(folder / "lock"), timeout=_LOCK_WAIT)


def repo_folder(root: Path, repo: str) -> Path:
    """A repo's folder under a store's graph folder, named by the repo name's digest."""
    return root / hashlib.sha256(repo.encode()).hexdigest()[:24]


class GraphFolder:
    """The saved HNSW graphs of one repo's vector index, in `folder`."""

    def __init__(self, folder: str | Path, settings: Mapping[str, int]) -> None:
        self.folder = Path(folder)
        self.path = self.folder / "graphs"
        # What the graphs were built with; a save under other settings is not loaded.
        self._settings = dict(settings)

    def save(self, graphs: Mapping[int, Graph], faiss: Any) -> None:
        """Writes the graphs in place of the saved ones (in the builder's thread); a save that
        fails leaves the saved ones as they were."""
        self.folder.mkdir(parents=True, exist_ok=True)

        def write(file: IO[bytes]) -> None:
            with lzma.open(file, "wb", preset=_PRESET) as out:
                self._write(out, graphs, faiss)

        with _lock(self.folder):
            _clear(self.folder, keep=(self.path.name,))
            disk.replace_file(self.path, write)

    def _write(self, out: IO[bytes], graphs: Mapping[int, Graph], faiss: Any) -> None:
        """The records of a save, each its length (8 bytes) then its bytes."""

        def record(data: bytes) -> None:
            out.write(len(data).to_bytes(8, "little") + data)

        every = graphs[ALL]
        record(json.dumps({"format": FORMAT, "settings": self._settings,
                           "graphs": sorted(graphs)}).encode())
        record(json.dumps(every.labels).encode())
        record(digests(_vectors(every.index, faiss)).tobytes())
        # A type graph's label takes the id and digest of `ALL`'s last label of its id (the
        # node's newest vector); `adopt` keeps the last of several labels of one id.
        position = {node_id: n for n, node_id in enumerate(every.labels)}
        for key in sorted(graphs):
            writer = faiss.VectorIOWriter()
            faiss.write_index(graphs[key].index, writer, faiss.IO_FLAG_SKIP_STORAGE)
            record(faiss.vector_to_array(writer.data).tobytes())
            if key != ALL:
                labels = graphs[key].labels
                record(np.fromiter((position[i] for i in labels), "<i4", len(labels)).tobytes())

    def load(self, faiss: Any) -> dict[int, Saved] | None:
        """The saved graphs, or None when there are none or they cannot be used (the reason
        is logged)."""
        try:
            with lzma.open(self.path) as source:

                def record() -> bytes:
                    size = int.from_bytes(source.read(8), "little")
                    data = source.read(size)
                    if len(data) != size:
                        raise ValueError("the file is cut short")
                    return data

                manifest = json.loads(record())
                if manifest.get("format") != FORMAT or manifest.get("settings") != self._settings:
                    log.info("mnemo: saved HNSW graphs in %s are for other settings", self.path)
                    return None
                ids = [str(i) for i in json.loads(record())]
                sums = np.frombuffer(record(), dtype=np.uint64)
                graphs = {}
                for key in manifest["graphs"]:
                    reader = faiss.VectorIOReader()
                    faiss.copy_array_to_vector(np.frombuffer(record(), np.uint8), reader.data)
                    index = faiss.read_index(reader, faiss.IO_FLAG_SKIP_STORAGE)
                    places = (np.arange(len(ids)) if key == ALL
                              else np.frombuffer(record(), dtype="<i4"))
                    if not index.ntotal == len(places) or len(ids) != len(sums):
                        raise ValueError(f"graph {key}: {index.ntotal} rows, {len(places)} ids,"
                                         f" {len(sums)} digests")
                    graphs[int(key)] = Saved(index, [ids[n] for n in places.tolist()],
                                             places.astype(np.int64), sums)
                return graphs
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RuntimeError, KeyError, TypeError, IndexError, EOFError,
                lzma.LZMAError) as exc:
            # RuntimeError: faiss's for a truncated or foreign file.
            log.warning("mnemo: saved HNSW graphs in %s not used (%s); rebuilding", self.folder,
                        exc)
            return None


def adopt(graphs: Mapping[int, Saved], snap: Snapshot) -> Adopted:
    """Checks saved graphs (`ALL` among them) against the index's rows (`snap`): a label of
    `ALL` matches if its node is a row of `snap` with the vector the label was built from; a
    type graph's label is live if its place in `ALL` matches for a row of its type. Of an id's
    labels in a graph only the last that does counts."""
    every = graphs[ALL]
    rows = np.fromiter((snap.rows.get(node_id, -1) for node_id in every.labels),
                       dtype=np.int64, count=len(every.labels))
    rows[rows >= snap.size] = -1
    found = rows >= 0
    found[found] = snap.codes[rows[found]] != DEAD
    for start in range(0, len(rows), _CHUNK):
        idx = np.flatnonzero(found[start : start + _CHUNK]) + start
        found[idx[digests(snap.matrix[rows[idx]]) != every.digests[idx]]] = False
    rows[~found] = -1
    live: dict[int, dict[str, int]] = {}
    _, in_all = _last(every.labels, rows)
    adopted = {ALL: in_all}
    for key, saved in graphs.items():
        if key != ALL:
            at = in_all[saved.places]
            at[at >= 0] = np.where(snap.codes[at[at >= 0]] == key, at[at >= 0], -1)
            live[key], adopted[key] = _last(saved.labels, at)
    held = {node_id for kept in live.values() for node_id in kept}
    present = np.flatnonzero(snap.codes[: snap.size] != DEAD)
    missing = [snap.ids[row] for row in present.tolist() if snap.ids[row] not in held]
    return Adopted(live, missing, adopted)


def _last(
    labels: list[str], rows: npt.NDArray[np.int64]
) -> tuple[dict[str, int], npt.NDArray[np.int64]]:
    """(node id -> its last label with a row (>= 0) in `rows`; each label's row, -1 for the
    others)."""
    kept = {labels[label]: label for label in np.flatnonzero(rows >= 0).tolist()}
    out = np.full(len(labels), -1, dtype=np.int64)
    chosen = np.fromiter(kept.values(), dtype=np.int64, count=len(kept))
    out[chosen] = rows[chosen]
    return kept, out


def restore(saved: Saved, rows: npt.NDArray[np.int64], snap: Snapshot, faiss: Any) -> None:
    """Gives a graph read back its vectors: each label's row of `snap`, zero for a dead label."""
    dim = int(saved.index.d)
    vectors = np.zeros((len(rows), dim), dtype=np.float32)
    for start in range(0, len(rows), _CHUNK):
        idx = np.flatnonzero(rows[start : start + _CHUNK] >= 0) + start
        vectors[idx] = snap.matrix[rows[idx]]
    storage = faiss.IndexFlatIP(dim)
    if len(vectors):
        storage.add(vectors)
    storage.this.disown()  # the graph owns it from here, and frees it with itself
    saved.index.storage = storage
    saved.index.own_fields = True


def digests(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.uint64]:
    """A 64-bit digest of each row (BLAKE2b of its float32 bytes)."""
    rows = np.ascontiguousarray(vectors, dtype=np.float32)
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(), "little")
         for row in rows), dtype=np.uint64, count=len(rows))


def _vectors(index: Any, faiss: Any) -> npt.NDArray[np.float32]:
    """The vectors an `IndexHNSWFlat` holds, one row per label (a view, not a copy)."""
    total = int(index.ntotal) * int(index.d)
    if total == 0:
        return np.zeros((0, int(index.d)), dtype=np.float32)
    storage = faiss.downcast_index(index.storage)
    flat: npt.NDArray[np.float32] = faiss.rev_swig_ptr(storage.get_xb(), total)
    return flat.reshape(int(index.ntotal), int(index.d))
