"""In-memory vectors that follow the store, whichever process or `Memory` wrote to it.

`SqliteVectors` keeps every repo's vectors in memory, `PgVectors` its tags' and intents'.
They follow the node log (`lexical_log`), a per-repo sequence that triggers move in the
writer's transaction on every insert, text change and delete of a node. A `RepoVectors`
records the sequence it reflects and each node's rowid; before each use its owner reads the
repo's sequence and generation (`VECTOR_STATE`, one row) and, when it moved, applies the changed
nodes. Applying is idempotent, so a read racing a write is caught up by the next. A cache
behind the log's horizon, or of an earlier generation (`Memory.reembed`), is loaded again.

`reading_block` looks once at a block's start; the uses inside it (child tasks too) skip the
read: a recall sees every write that returned before it started.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import anyio
import numpy as np

from mnemo.graph import ann
from mnemo.graph.model import NodeType, Vector
from mnemo.graph.ports import PendingRead
from mnemo.graph.vectors import VectorIndex
from mnemo.storage.lexical.source import LOGGED

# "?" placeholders; PostgreSQL's owner swaps them for "%s".
CHANGED = (
    f"SELECT l.node, n.id, n.type, v.vec FROM {LOGGED}"
    " LEFT JOIN nodes n ON n.rowid = l.node AND n.repo = ?"
    " LEFT JOIN vectors v ON v.node_id = n.id"
)

# `CHANGED` for a cache of some node types: the others' vectors are not read.
CHANGED_OF_KINDS = CHANGED.replace(
    "LEFT JOIN vectors v ON v.node_id = n.id", "LEFT JOIN vectors v ON v.node_id = n.id"
    " AND n.type = ANY(?)")

# A changed node as read: (rowid, id, type, vector), the last three None when it is gone.
Change = tuple[int, str | None, str | None, Vector | None]

# The repo's node log (sequence, horizon) and its vectors' generation and dimension as its
# record holds them (`Memory.reembed` moves both), in one read of one row; "?" placeholders.
VECTOR_STATE = (
    "SELECT l.seq, l.horizon, r.vectors_generation, r.dim FROM (SELECT CAST(? AS TEXT) AS name) q"
    " LEFT JOIN lexical_repos l ON l.repo = q.name LEFT JOIN repos r ON r.name = q.name"
)


@dataclass(frozen=True, slots=True)
class VectorState:
    """`VECTOR_STATE` as read: the node log's sequence and horizon (0 for a repo never
    written), the vectors' generation (0 without a record) and dimension (None without one:
    the owner's own `dims` then)."""

    seq: int
    horizon: int
    generation: int
    dim: int | None

    @classmethod
    def of(cls, rows: Sequence[Sequence[object]]) -> VectorState:
        seq, horizon, generation, dim = rows[0] if rows else (None, None, None, None)
        return cls(_whole(seq), _whole(horizon), _whole(generation),
                   None if dim is None else _whole(dim))


def _whole(value: object) -> int:
    return int(value) if isinstance(value, int) else 0


@dataclass(slots=True)
class RepoVectors:
    """A repo's vectors in memory: the log sequence they reflect, and each node's rowid.
    `kinds`: the node types kept (None: all). The index's `generation` is the vectors' (see
    `behind`)."""

    index: VectorIndex
    seq: int
    kinds: Collection[NodeType] | None = None
    rowids: dict[int, str] = field(default_factory=dict)

    def load(self, rowids: Iterable[int], ids: list[str], types: list[NodeType],
             vectors: Vector) -> None:
        """The repo's rows as first read (in rowid order)."""
        self.index.add(ids, types, vectors)
        self.rowids.update(zip(rowids, ids, strict=True))

    def behind(self, seq: int, horizon: int, generation: int | None = None) -> bool:
        """Whether the log moved since; raises `Reload` when it no longer reaches back here,
        or when the repo's vectors are of another `generation` than the index's."""
        if generation is not None and generation != self.index.generation:
            raise Reload
        return moved(self.seq, seq, horizon)

    def apply(self, seq: int, changes: Iterable[Change]) -> None:
        """The changed nodes as the store holds them now (after its sequence `seq`)."""
        gone: list[str] = []
        ids: list[str] = []
        types: list[NodeType] = []
        vectors: list[Vector] = []
        for rowid, node_id, kind, vector in sorted(changes, key=lambda change: change[0]):
            held = self.rowids.pop(rowid, None)
            node_type = None if kind is None else NodeType(kind)
            if (node_id is None or node_type is None or vector is None
                    or (self.kinds is not None and node_type not in self.kinds)):
                if held is not None:
                    gone.append(held)  # deleted, without a vector, or of a type not kept
                continue
            if held is not None and held != node_id:
                gone.append(held)  # its rowid is now another node's
            self.rowids[rowid] = node_id
            ids.append(node_id)
            types.append(node_type)
            vectors.append(vector)
        self.index.remove(gone)
        if ids:
            self.index.add(ids, types, np.stack(vectors))
        self.seq = seq


class Reload(Exception):
    """The log no longer holds every change since the cache's sequence: load it again."""


def moved(since: int, seq: int, horizon: int) -> bool:
    """Whether a log at `seq` (keeping every change past `horizon`) moved past `since`;
    raises `Reload` when it no longer reaches back to `since`."""
    if seq == since:
        return False
    if since < horizon or since > seq:
        raise Reload
    return True


# What a backend gives a `VectorCache`: a repo's changes since a `RepoVectors`'s sequence (None when
# the log did not move; raises `Reload` when it no longer reaches back), and a repo's first load.
Changes = Callable[[str, RepoVectors], Awaitable[tuple[int, list[Change]] | None]]
Load = Callable[[str], Awaitable[RepoVectors]]
# Optionally, the same read started at once and awaited later (`PendingRead`; `Reload` for
# another generation): a `reading` block starts its look and waits at its first use.
Look = PendingRead[tuple[int, list[Change]] | None]
Start = Callable[[str, int, int], Look]


class VectorCache:
    """One owner's `RepoVectors` repos: loaded on first use, brought up to the log at every use
    after, unless a `reading` block of the repo did at its start (with `start`: began to, at
    its start, and finished at its first use)."""

    def __init__(self, changes: Changes, load: Load, start: Start | None = None) -> None:
        self._changes = changes
        self._load = load
        self._start = start
        self._held: dict[str, RepoVectors] = {}
        self._locks: dict[str, anyio.Lock] = {}

    def loaded(self, repo: str) -> VectorIndex | None:
        """The repo's index if it is loaded (as it was at its last use)."""
        held = self._held.get(repo)
        return None if held is None else held.index

    def indexes(self) -> list[VectorIndex]:
        return [held.index for held in self._held.values()]

    def remove(self, repo: str, node_ids: Sequence[str]) -> None:
        """The owner deleted these nodes: out of the index at once (the log says so later)."""
        if repo in self._held:
            self._held[repo].index.remove(node_ids)

    def reading(self, repo: str) -> AbstractAsyncContextManager[None]:
        """A block whose uses of the repo's vectors share one look at the log, taken at its
        start: they see every write that returned before it began."""
        return reading_block(self, repo, lambda: self.index(repo), lambda: self._started(repo))

    def _started(self, repo: str) -> Look | None:
        """The look at the log since the repo's sequence, under way (None: no `start`, or the
        repo not loaded yet, which `index` loads)."""
        held = self._held.get(repo)
        if self._start is None or held is None:
            return None
        return self._start(repo, held.seq, held.index.generation)

    async def index(self, repo: str) -> VectorIndex:
        """The repo's vectors as the store holds them now (one keyed read when nothing
        changed), or as of the start of the `reading` block this task is in."""
        held = self._held.get(repo)
        look = _look(self, repo)
        if held is not None and look is not None and look.pending is None:
            return held.index
        async with self._locks.setdefault(repo, anyio.Lock()):
            held = self._held.get(repo)
            try:
                if held is not None and look is not None and look.pending is not None:
                    # Finished once, by the first use (the others of the block wait for the
                    # lock, then find it done), whatever its outcome.
                    try:
                        changed = await look.pending.result()
                    finally:
                        look.pending = None
                    # Read since an earlier sequence, the changes hold each node as the store
                    # had it when read: newer than `held` wherever `held` is older.
                    if changed is not None and changed[0] > held.seq:
                        held.apply(*changed)
                    return held.index
                if held is not None:
                    changed = await self._changes(repo, held)
                    if changed is not None:
                        held.apply(*changed)
                    return held.index
            except Reload:
                assert held is not None
                await ann.close([held.index])
            followed = await self._load(repo)
            self._held[repo] = followed
            return followed.index


@dataclass(slots=True)
class _Look:
    open: bool = True
    # The look, when it was started and is not finished yet.
    pending: Look | None = None


# The (owner, repo) pairs brought up at the start of a block this task is in. A `_Look` is
# closed when its block ends, so that a task started inside and outliving it looks again.
_LOOKS: ContextVar[dict[tuple[int, str], _Look]] = ContextVar("mnemo_vector_looks")


def _look(owner: object, repo: str) -> _Look | None:
    look = _LOOKS.get({}).get((id(owner), repo))
    return look if look is not None and look.open else None


def looked(owner: object, repo: str) -> bool:
    """Whether `owner`'s vectors of `repo` were brought up (or began to be) at the start of an
    open block (`reading_block`) this task is in."""
    return _look(owner, repo) is not None


@asynccontextmanager
async def reading_block(
    owner: object, repo: str, catch_up: Callable[[], Awaitable[object]],
    start: Callable[[], Look | None] = lambda: None,
) -> AsyncIterator[None]:
    """Brings `owner`'s vectors of `repo` up now (`catch_up`), or starts to (`start`, when it
    returns the look under way: the owner's first use inside the block finishes it); inside
    the block, `looked` is True and the uses skip the log."""
    if looked(owner, repo):
        yield
        return
    pending = start()
    if pending is None:
        await catch_up()
    look = _Look(pending=pending)
    token = _LOOKS.set({**_LOOKS.get({}), (id(owner), repo): look})
    try:
        yield
    finally:
        look.open = False
        _LOOKS.reset(token)
        if look.pending is not None:
            look.pending.discard()
