"""HNSW graphs saved beside the store, so that opening a big repo does not rebuild them; the
store stays the one truth. A saved graph holds its links (no vectors, compressed) and per label
a node id and vector digest: at load a label is live only if the index holds that node with that
type and digest, else dead; too much dead or another format or setting: rebuilt instead. A save
writes a new version folder and moves `current` to it atomically, under the folder's lock.
"""

from __future__ import annotations

import hashlib
import json
import logging
import lzma
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock
import numpy as np
import numpy.typing as npt

from mnemo import disk
from mnemo.graph.ann_search import ALL
from mnemo.graph.vectors import DEAD, Snapshot

log = logging.getLogger("mnemo")

# 2: links without vectors, ids compressed (xz), a type graph's as positions in `ALL`'s.
FORMAT = 2
# Labels compared per chunk at load (a chunk's vectors are copied once).
_CHUNK = 50_000
# xz's preset for the links and ids (BENCHMARKS.md).
_PRESET = 1


def _pack(data: bytes) -> bytes:
    return lzma.compress(data, preset=_PRESET)


def _unpack(data: bytes) -> bytes:
    return lzma.decompress(data)
# How long a load or save waits for another process's save before giving up on the files.
_LOCK_WAIT = 600.0


@dataclass(frozen=True, slots=True)
class Saved:
    """One graph: the faiss index and each label's node id; as read back, without vectors
    (`adopt` gives it the store's) and with each label's `digests`."""

    index: Any
    labels: list[str]
    digests: npt.NDArray[np.uint64] | None = None


@dataclass(frozen=True, slots=True)
class Adopted:
    """What a load keeps of the saved graphs: per graph, its dead labels and each label's row
    of the snapshot (-1: dead); per live node id, (type code, label, label in `ALL`); the
    snapshot's ids no live label holds; and the type graphs' dead labels."""

    dead: dict[int, int]
    labels: dict[str, tuple[int, int, int]]
    missing: list[str]
    dead_total: int
    rows: dict[int, npt.NDArray[np.int64]]


def discard(folder: Path) -> None:
    """Deletes every saved version of a repo's graphs, under the folder's lock."""
    if not folder.is_dir():
        return
    with filelock.FileLock(str(folder / "lock"), timeout=_LOCK_WAIT):
        for old in folder.iterdir():
            if old.name.startswith(("v-", ".current.")) and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            elif old.name == "current" or old.name.startswith(".current."):
                old.unlink(missing_ok=True)


def repo_folder(root: Path, repo: str) -> Path:
    """A repo's folder under a store's graph folder, named by the repo name's digest."""
    return root / hashlib.sha256(repo.encode()).hexdigest()[:24]


class GraphFolder:
    """The saved HNSW graphs of one repo's vector index, in `folder`."""

    def __init__(self, folder: str | Path, settings: Mapping[str, int]) -> None:
        self.folder = Path(folder)
        # What the graphs were built with; a save under other settings is not loaded.
        self._settings = dict(settings)

    def save(self, graphs: Mapping[int, Saved], faiss: Any) -> None:
        """Writes the graphs as a new version and makes it current (in the builder's thread)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._lock():
            name = f"v-{uuid.uuid4().hex}"
            version = self.folder / name
            try:
                self._write(version, graphs, faiss)
            except BaseException:
                # A failed save leaves nothing behind unless `current` already moved to it.
                if self._current() != name:
                    shutil.rmtree(version, ignore_errors=True)
                raise
            # Older versions, and what a killed save left (its folder, the pointer's tmp file).
            for old in self.folder.iterdir():
                if old.name != name and old.name.startswith(("v-", ".current.")):
                    if old.is_dir():
                        shutil.rmtree(old, ignore_errors=True)
                    else:
                        old.unlink(missing_ok=True)

    def _write(
        self, version: Path, graphs: Mapping[int, Saved], faiss: Any
    ) -> None:
        """Writes one version's files, then points `current` at it."""
        version.mkdir()
        keys = sorted(graphs)
        # A type graph's ids as positions in the every-row graph's, which holds them all.
        every = graphs[ALL].labels if ALL in graphs else []
        position = {node_id: n for n, node_id in enumerate(every)}
        for key in keys:
            index, labels = graphs[key].index, graphs[key].labels
            writer = faiss.VectorIOWriter()
            faiss.write_index(index, writer, faiss.IO_FLAG_SKIP_STORAGE)
            links = faiss.vector_to_array(writer.data).tobytes()
            (version / f"g{key}.faiss").write_bytes(_pack(links))
            if key != ALL and all(node_id in position for node_id in labels):
                # Each label's id and digest are those of `ALL`'s last label of that id (the
                # node's newest vector); `adopt` keeps the last of several labels of one id.
                places = np.fromiter((position[i] for i in labels), dtype="<i4", count=len(labels))
                (version / f"g{key}.pos").write_bytes(_pack(places.tobytes()))
            else:
                (version / f"g{key}.ids").write_bytes(_pack(json.dumps(labels).encode()))
                (version / f"g{key}.sums").write_bytes(digests(_vectors(index, faiss)).tobytes())
        manifest = {"format": FORMAT, "settings": self._settings, "graphs": keys}
        (version / "manifest.json").write_text(json.dumps(manifest))
        for child in version.iterdir():
            _sync_file(child)
        disk.fsync_directory(version)
        disk.atomic_write(self.folder / "current", version.name)

    def _current(self) -> str | None:
        try:
            return (self.folder / "current").read_text().strip()
        except OSError:
            return None

    def load(self, faiss: Any) -> dict[int, Saved] | None:
        """The current version's graphs, or None when there is none or it cannot be used (the
        reason is logged)."""
        if self._current() is None:
            return None
        try:
            with self._lock():
                name = self._current()
                if name is None:
                    return None
                version = self.folder / name
                manifest = json.loads((version / "manifest.json").read_text())
                if manifest.get("format") != FORMAT or manifest.get("settings") != self._settings:
                    log.info("mnemo: saved HNSW graphs in %s are for other settings", version)
                    return None
                graphs = {}
                every: list[str] = []
                every_sums = np.zeros(0, dtype=np.uint64)
                # The every-row graph first: the others' ids may be positions in its.
                for key in sorted(manifest["graphs"], key=lambda k: k != ALL):
                    reader = faiss.VectorIOReader()
                    links = _unpack((version / f"g{key}.faiss").read_bytes())
                    faiss.copy_array_to_vector(np.frombuffer(links, dtype=np.uint8), reader.data)
                    index = faiss.read_index(reader, faiss.IO_FLAG_SKIP_STORAGE)
                    if (version / f"g{key}.pos").exists():
                        places = np.frombuffer(_unpack((version / f"g{key}.pos").read_bytes()),
                                               dtype="<i4")
                        labels = [every[n] for n in places.tolist()]
                        sums = every_sums[places]
                    else:
                        labels = json.loads(_unpack((version / f"g{key}.ids").read_bytes()))
                        sums = np.frombuffer((version / f"g{key}.sums").read_bytes(),
                                             dtype=np.uint64)
                        if key == ALL:
                            every, every_sums = [str(i) for i in labels], sums
                    if not index.ntotal == len(labels) == len(sums):
                        raise ValueError(f"graph {key}: {index.ntotal} rows, {len(labels)} ids,"
                                         f" {len(sums)} digests")
                    graphs[int(key)] = Saved(index, [str(i) for i in labels], sums)
                return graphs
        except (OSError, ValueError, RuntimeError, KeyError, TypeError, IndexError,
                filelock.Timeout, lzma.LZMAError) as exc:
            # RuntimeError: faiss's for a truncated or foreign file.
            log.warning("mnemo: saved HNSW graphs in %s not used (%s); rebuilding", self.folder,
                        exc)
            return None

    def _lock(self) -> filelock.FileLock:
        return filelock.FileLock(str(self.folder / "lock"), timeout=_LOCK_WAIT)


def adopt(graphs: Mapping[int, Saved], snap: Snapshot, every: int) -> Adopted:
    """Checks saved graphs against the index's rows (`snap`); `every` is the key of the
    every-row graph, the others are keyed by type code."""
    live: dict[int, dict[str, int]] = {}
    dead: dict[int, int] = {}
    rows_of: dict[int, npt.NDArray[np.int64]] = {}
    for key, saved in graphs.items():
        kept, rows = _matching(saved, snap, None if key == every else key)
        live[key] = kept
        rows_of[key] = rows
        dead[key] = len(saved.labels) - len(kept)
    in_every = live.get(every, {})
    labels: dict[str, tuple[int, int, int]] = {}
    for key, kept in live.items():
        if key == every:
            continue
        for node_id, label in kept.items():
            label_in_every = in_every.get(node_id)
            if label_in_every is not None:
                labels[node_id] = (key, label, label_in_every)
    # A node live in only one of its type's graph and `ALL` is inserted again into both.
    for key, kept in live.items():
        for node_id in kept:
            if node_id not in labels:
                dead[key] += 1
    count, _, codes, ids, _, _ = snap
    present = np.flatnonzero(codes[:count] != DEAD)
    missing = [ids[row] for row in present.tolist() if ids[row] not in labels]
    dead_total = sum(n for key, n in dead.items() if key != every)
    return Adopted(dead, labels, missing, dead_total, rows_of)


def restore(saved: Saved, rows: npt.NDArray[np.int64], snap: Snapshot, faiss: Any) -> None:
    """Gives a graph read back its vectors: each label's row of `snap`, zero for a dead label."""
    dim = int(saved.index.d)
    vectors = np.zeros((len(rows), dim), dtype=np.float32)
    live = rows >= 0
    for start in range(0, len(rows), _CHUNK):
        chunk = slice(start, min(start + _CHUNK, len(rows)))
        idx = np.flatnonzero(live[chunk]) + start
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
    found = np.empty(len(rows), dtype=np.uint64)
    for i, row in enumerate(rows):
        found[i] = int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(),
                                  "little")
    return found


def _matching(
    saved: Saved, snap: Snapshot, code: int | None
) -> tuple[dict[str, int], npt.NDArray[np.int64]]:
    """(node id -> label, for labels whose node is a row of `snap` (of type `code`, or any) with
    the vector the label was built from, the last label of an id winning; and each label's
    row of `snap`, -1 for the others)."""
    labels = saved.labels
    n = len(labels)
    if n == 0:
        return {}, np.zeros(0, dtype=np.int64)
    assert saved.digests is not None, "a graph read back has its digests"
    count, matrix, codes, _, rows_of, _ = snap
    rows = np.fromiter((rows_of.get(node_id, -1) for node_id in labels), dtype=np.int64,
                       count=n)
    ok = (rows >= 0) & (rows < count)
    types = np.full(n, DEAD, dtype=np.int8)
    types[ok] = codes[rows[ok]]
    ok &= types != DEAD if code is None else types == code
    for start in range(0, n, _CHUNK):
        chunk = slice(start, min(start + _CHUNK, n))
        idx = np.flatnonzero(ok[chunk]) + start
        if len(idx):
            same = digests(matrix[rows[idx]]) == saved.digests[idx]
            ok[idx[~same]] = False
    kept = {labels[label]: label for label in np.flatnonzero(ok).tolist()}
    # Of an id with several matching labels only the last is live: the others are dead.
    live = np.full(n, -1, dtype=np.int64)
    chosen = np.fromiter(kept.values(), dtype=np.int64, count=len(kept))
    live[chosen] = rows[chosen]
    return kept, live


def _vectors(index: Any, faiss: Any) -> npt.NDArray[np.float32]:
    """The vectors an `IndexHNSWFlat` holds, one row per label (a view, not a copy)."""
    storage = faiss.downcast_index(index.storage)
    total = int(index.ntotal) * int(index.d)
    if total == 0:
        return np.zeros((0, int(index.d)), dtype=np.float32)
    flat: npt.NDArray[np.float32] = faiss.rev_swig_ptr(storage.get_xb(), total)
    return flat.reshape(int(index.ntotal), int(index.d))


def _sync_file(path: Path) -> None:
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())
