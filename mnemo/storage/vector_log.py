"""In-memory vectors that follow the store's node log (`lexical_log`), whichever process
wrote: before each use the owner reads the repo's sequence and generation (`VECTOR_STATE`) and
applies the changed nodes (idempotent); a cache past the log's horizon or of another generation
is reloaded. In a `reading` block one look at its start serves every use inside it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import anyio
import numpy as np

from mnemo.graph import ann
from mnemo.graph.model import NodeType, Vector
from mnemo.graph.ports import PendingRead
from mnemo.graph.vectors import VectorIndex
from mnemo.storage.lexical.source import LOGGED
from mnemo.storage.row import Row

CHANGED = (
    f"SELECT l.node, n.id, n.type, v.vec FROM {LOGGED}"
    " LEFT JOIN nodes n ON n.rowid = l.node AND n.repo = ?"
    " LEFT JOIN vectors v ON v.node_id = n.id"
)

# `CHANGED` for a cache of some node types: the others' vectors are not read.
CHANGED_OF_KINDS = CHANGED + " AND n.type = ANY(?)"

# A changed node as read: (rowid, id, type, vector), the last three None when it is gone.
Change = tuple[int, str | None, str | None, Vector | None]

# The repo's log sequence and horizon, its vectors' generation and dimension, in one row.
VECTOR_STATE = (
    "SELECT l.seq, l.horizon, r.vectors_generation, r.dim FROM (SELECT CAST(? AS TEXT) AS name) q"
    " LEFT JOIN lexical_repos l ON l.repo = q.name LEFT JOIN repos r ON r.name = q.name"
)


@dataclass(frozen=True, slots=True)
class VectorState:
    """`VECTOR_STATE` as read (0s, and dimension None, for a repo without rows)."""

    seq: int
    horizon: int
    generation: int
    dim: int | None

    @classmethod
    def of(cls, rows: Sequence[Row]) -> VectorState:
        (seq, horizon, generation, dim), = rows
        return cls(int(seq or 0), int(horizon or 0), int(generation or 0),
                   None if dim is None else int(dim))


@dataclass(slots=True)
class RepoVectors:
    """A repo's vectors in memory (of `kinds`, None: all): the log sequence they reflect and
    each node's rowid."""

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
        """Whether the log moved since; raises `Reload` past its horizon or generation."""
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
    """Whether a log at `seq` moved past `since`; `Reload` when `horizon` is past it."""
    if seq == since:
        return False
    if since < horizon or since > seq:
        raise Reload
    return True


# A backend's read of a repo's changes since a `RepoVectors`'s sequence (None: unmoved).
Changes = Callable[[str, RepoVectors], Awaitable[tuple[int, list[Change]] | None]]
Load = Callable[[str], Awaitable[RepoVectors]]
# The same read started at a `reading` block's start, awaited at its first use.
Look = PendingRead[tuple[int, list[Change]] | None]
Start = Callable[[str, int, int], Look]


class VectorCache:
    def __init__(self, changes: Changes, load: Load, start: Start | None = None) -> None:
        self._read_changes = changes
        self._read_all = load
        self._start_changes = start
        self._held: dict[str, RepoVectors] = {}
        self._locks: dict[str, anyio.Lock] = {}

    def loaded(self, repo: str) -> VectorIndex | None:
        """The repo's index if it is loaded (as it was at its last use)."""
        held = self._held.get(repo)
        return None if held is None else held.index

    def forget(self, repo: str, node_ids: Sequence[str]) -> None:
        """The owner deleted these nodes: out of the index at once."""
        if repo in self._held:
            self._held[repo].index.remove(node_ids)

    async def settle(self, repo: str) -> None:
        await ann.settle(self.loaded(repo))

    async def aclose(self) -> None:
        """Stops the HNSW builders (a build in progress stops at its next chunk)."""
        await ann.close([held.index for held in self._held.values()])

    @asynccontextmanager
    async def reading(self, repo: str) -> AsyncIterator[None]:
        """A block whose uses of the repo's vectors share one look at the log, at its start:
        begun there (`start`, for a loaded repo) and finished at the first use, or else taken
        at once. A block inside another of the same repo and task takes none."""
        if _look(self, repo) is not None:
            yield
            return
        held = self._held.get(repo)
        pending = (None if self._start_changes is None or held is None
                   else self._start_changes(repo, held.seq, held.index.generation))
        if pending is None:
            await self.index(repo)
        look = _Look(pending=pending)
        token = _LOOKS.set({**_LOOKS.get({}), (id(self), repo): look})
        try:
            yield
        finally:
            look.open = False
            _LOOKS.reset(token)
            if look.pending is not None:
                look.pending.discard()

    async def index(self, repo: str) -> VectorIndex:
        """The repo's vectors as the store holds them now, or at its `reading` block's start."""
        held = self._held.get(repo)
        look = _look(self, repo)
        if held is not None and look is not None and look.pending is None:
            return held.index
        async with self._locks.setdefault(repo, anyio.Lock()):
            held = self._held.get(repo)
            try:
                if held is not None:
                    if look is not None and look.pending is not None:
                        # Finished once, by the first use, whatever its outcome.
                        try:
                            changed = await look.pending.result()
                        finally:
                            look.pending = None
                    else:
                        changed = await self._read_changes(repo, held)
                    if changed is not None and changed[0] > held.seq:
                        held.apply(*changed)
                    return held.index
            except Reload:
                assert held is not None
                await ann.close([held.index])
            followed = await self._read_all(repo)
            self._held[repo] = followed
            return followed.index


Hits = list[tuple[str, float]]


class CachedVectors(VectorCache):
    """A backend's vector side: the cache, and the searches and reads of `GraphStore`'s names."""

    search: Callable[[str, Vector, int, Iterable[NodeType] | None], Awaitable[Hits]]
    similarities: Callable[[str, Sequence[str], Vector, int | None], Awaitable[dict[str, float]]]
    of_nodes: Callable[[str, Sequence[str]], Awaitable[dict[str, Vector]]]

    def on_loop(self, repo: str) -> bool:
        return False  # PostgreSQL searches the nodes' vectors: a round trip each

    async def nearest_of_type(self, repo: str, probes: Vector, kind: NodeType, k: int,
                              among: Sequence[str] | None = None) -> list[Hits]:
        return await ann.nearest_of_type(await self.index(repo), probes, kind, k, among)

    async def of_type(self, repo: str, kind: NodeType) -> tuple[list[str], Vector]:
        return await ann.of_type(await self.index(repo), kind)


@dataclass(slots=True)
class _Look:
    open: bool = True
    pending: Look | None = None


# (owner, repo) pairs brought up at the start of a block this task is in (closed at its end).
_LOOKS: ContextVar[dict[tuple[int, str], _Look]] = ContextVar("mnemo_vector_looks")


def _look(owner: object, repo: str) -> _Look | None:
    look = _LOOKS.get({}).get((id(owner), repo))
    return look if look is not None and look.open else None
