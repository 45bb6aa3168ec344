"""`SqliteVectors`: the in-memory vectors of a SQLite graph's repos, each loaded on first use
and brought up to the node log before each use (`mnemo.storage.vector_log`). Past
`ann_threshold` vectors, with faiss-cpu, HNSW graphs answer (`mnemo.graph.ann`), read back
from the saved files when they still match."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import anyio
import anyio.to_thread
from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.cpu import Queued
from mnemo.graph import ann, ann_files
from mnemo.graph.model import NodeType, Vector
from mnemo.graph.vectors import VectorIndex
from mnemo.storage import vector_log
from mnemo.storage.sqlite.database import Database
from mnemo.storage.sqlite.rows import vector_of_half
from mnemo.storage.vector_log import (
    CachedVectors,
    Change,
    RepoVectors,
    VectorState,
)


class SqliteVectors(CachedVectors):
    def __init__(self, database: Database, dims: Callable[[str], int], *,
                 ann_threshold: int | None = ann.DEFAULT_THRESHOLD, ann_dir: Path | None = None
                 ) -> None:
        self._database = database
        self._dims = dims
        self._ann_threshold = ann_threshold
        self._ann_dir = ann_dir
        super().__init__(self._changes, self._load, self._start)

    def on_loop(self, repo: str) -> bool:
        """Whether the repo's searches run on the event loop now (`ann.on_loop`); False
        while it is not loaded (the first use reads it)."""
        index = self.loaded(repo)
        return index is not None and ann.on_loop(index)

    async def search(
        self, repo: str, vector: Vector, limit: int, types: Iterable[NodeType] | None = None
    ) -> list[tuple[str, float]]:
        index = await self.index(repo)
        kinds = None if types is None else list(types)
        return await ann.by_size(len(index), lambda: index.search(vector, limit, kinds))

    async def similarities(
        self, repo: str, node_ids: Sequence[str], vector: Vector, limit: int | None = None
    ) -> dict[str, float]:
        """Raw cosine of each of these nodes with a vector, whatever `limit` (all in memory)."""
        return (await self.index(repo)).similarities(node_ids, vector)

    async def of_nodes(self, repo: str, node_ids: Sequence[str]) -> dict[str, Vector]:
        index = await self.index(repo)
        return {i: v for i in dict.fromkeys(node_ids) if (v := index.get(i)) is not None}

    async def _changes(self, repo: str, followed: RepoVectors) -> tuple[int, list[Change]] | None:
        since, generation = followed.seq, followed.index.generation
        return await self._database.run(lambda db: _changes(db, repo, since, generation))

    def _start(
        self, repo: str, since: int, generation: int
    ) -> Queued[tuple[int, list[Change]] | None]:
        return self._database.start(lambda db: _changes(db, repo, since, generation))

    async def _load(self, repo: str) -> RepoVectors:
        state, rowids, ids, types, vectors = await self._database.run(
            lambda db: _load_vectors(db, repo))
        # The dimension the store records: another Memory may have made the vectors again.
        dim = state.dim or self._dims(repo)
        followed = RepoVectors(VectorIndex(dim, generation=state.generation), state.seq)
        followed.load(rowids, ids, types, vectors.reshape(len(ids), dim))
        if self._ann_threshold is not None:
            # The first load imports faiss: in a thread, not on the loop.
            await anyio.to_thread.run_sync(ann.load_faiss)
            ann.attach(followed.index, threshold=self._ann_threshold,
                       folder=self.graph_folder(repo))
        return followed

    def graph_folder(self, repo: str) -> Path | None:
        """Where the repo's HNSW graphs are saved (None: not saved)."""
        return None if self._ann_dir is None else ann_files.repo_folder(self._ann_dir, repo)


# The store's vectors are keyed by their node's rowid.
_CHANGED = vector_log.CHANGED.replace("v.node_id = n.id", "v.node = n.rowid")


def _state(db: SqliteUtilsDatabase, repo: str) -> VectorState:
    """The repo's `VECTOR_STATE`, read in a transaction that the connection's job rolls back
    when it ends: the vectors read after it are of the same moment, never the old
    generation's state with the vectors a switch put in place meanwhile."""
    if not db.conn.in_transaction:
        db.conn.execute("BEGIN")
    return VectorState.of(db.conn.execute(vector_log.VECTOR_STATE, (repo,)).fetchall())


def _changes(
    db: SqliteUtilsDatabase, repo: str, since: int, generation: int
) -> tuple[int, list[Change]] | None:
    """The log's sequence and the nodes changed since `since` (None: none); raises `Reload`
    past the log's horizon, or for vectors of another `generation` (all made again)."""
    state = _state(db, repo)
    if state.generation != generation:
        raise vector_log.Reload
    if not vector_log.moved(since, state.seq, state.horizon):
        return None
    rows = db.conn.execute(_CHANGED, (repo, since, state.seq, repo)).fetchall()
    return state.seq, [
        (int(rowid), node_id, kind,
         None if blob is None else vector_of_half(blob))
        for rowid, node_id, kind, blob in rows
    ]


def _load_vectors(
    db: SqliteUtilsDatabase, repo: str
) -> tuple[VectorState, list[int], list[str], list[NodeType], Vector]:
    """The log's state, read first (what changes after it is applied again later; one read,
    so its generation is the vectors' read next), then the repo's rowids, ids, types and
    vectors (flat) in rowid order."""
    state = _state(db, repo)
    rows = db.conn.execute(
        "SELECT n.rowid, n.id, n.type, v.vec FROM nodes n JOIN vectors v ON v.node = n.rowid"
        " WHERE n.repo = ? ORDER BY n.rowid", (repo,)).fetchall()
    return (state, [r[0] for r in rows], [r[1] for r in rows], [NodeType(r[2]) for r in rows],
            vector_of_half(b"".join(r[3] for r in rows)))
