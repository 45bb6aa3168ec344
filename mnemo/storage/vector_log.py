"""In-memory vectors that follow the store, whichever process or `Memory` wrote to it.

`SqliteVectors` keeps every repo's vectors in memory, `PgVectors` its tags' and intents'. They
used to be kept in step by their own `Memory`'s writes only, so what another one committed or
forgot never reached them: a commit then linked a new intent to one forgotten elsewhere (a
foreign-key error, at every retry), an intent committed elsewhere was not deduplicated against,
and recall missed what another process had stored (session 19's review).

The store already says what changed: its node log (`lexical_log`, mnemo/storage/lexical), a
per-repo sequence that triggers move in the writer's own transaction on every insert, text
change and delete of a node. A `Followed` repo records the sequence its vectors reflect and
the rowid of each node it holds; before each use its owner reads the repo's sequence (one keyed
row) and, when it moved, the changed nodes with their vectors, and applies them. Applying is
idempotent (a node's vector is replaced or removed), so the owner's own writes, applied at
once, are applied again harmlessly, and a read racing a write is caught up by the next one.
A cache behind the log's horizon (more than `LOG_KEEP` changes since it looked) is loaded
again.

A read of one keyed row is a trip to the database's thread (SQLite) or server (PostgreSQL), and
a recall uses the vectors five to seven times: one look per recall is enough for what it
promises (it sees every write that returned before it started). `one_look` brings a repo up
once, at the start of a block, and the uses inside it (in its child tasks too) skip the read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import numpy as np

from mnemo.graph.model import NodeType, Vector
from mnemo.graph.vectors import VectorIndex

# "?" placeholders; PostgreSQL's owner swaps them for "%s".
STATE = "SELECT seq, horizon FROM lexical_repos WHERE repo = ?"
CHANGED = (
    "SELECT l.node, n.id, n.type, v.vec FROM"
    " (SELECT DISTINCT node FROM lexical_log WHERE repo = ? AND seq > ? AND seq <= ?) l"
    " LEFT JOIN nodes n ON n.rowid = l.node AND n.repo = ?"
    " LEFT JOIN vectors v ON v.node_id = n.id"
)

# `CHANGED` for a cache of some node types: the others' vectors are not read.
CHANGED_OF_KINDS = CHANGED.replace(
    "LEFT JOIN vectors v ON v.node_id = n.id", "LEFT JOIN vectors v ON v.node_id = n.id"
    " AND n.type = ANY(?)")

# A changed node as read: (rowid, id, type, vector), the last three None when it is gone.
Change = tuple[int, str | None, str | None, Vector | None]


@dataclass(slots=True)
class Followed:
    """A repo's vectors in memory: the log sequence they reflect, and each node's rowid.
    `kinds`: the node types kept (None: all)."""

    index: VectorIndex
    seq: int
    kinds: Collection[NodeType] | None = None
    rowids: dict[int, str] = field(default_factory=dict)

    def load(self, rowids: Iterable[int], ids: list[str], types: list[NodeType],
             vectors: Vector) -> None:
        """The repo's rows as first read (in rowid order)."""
        self.index.add(ids, types, vectors)
        self.rowids.update(zip(rowids, ids, strict=True))

    def behind(self, seq: int, horizon: int) -> bool:
        """Whether the log moved since; raises `Reload` when it no longer reaches back here."""
        if seq == self.seq:
            return False
        if self.seq < horizon or self.seq > seq:
            raise Reload
        return True

    def apply(self, seq: int, changes: Iterable[Change]) -> None:
        """The changed nodes as the store holds them now (after its sequence `seq`)."""
        gone: list[str] = []
        ids: list[str] = []
        types: list[NodeType] = []
        vectors: list[Vector] = []
        for rowid, node_id, kind, vector in sorted(changes, key=lambda change: change[0]):
            held = self.rowids.pop(rowid, None)
            if held is not None and held != node_id:
                gone.append(held)  # deleted, or its rowid now another node's
            if node_id is None or kind is None or vector is None:
                if held is not None and held == node_id:
                    gone.append(held)  # still there without a vector: not searchable
                continue
            node_type = NodeType(kind)
            if self.kinds is not None and node_type not in self.kinds:
                if held == node_id:
                    gone.append(node_id)
                continue
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


@dataclass(slots=True)
class _Look:
    open: bool = True


# The (owner, repo) pairs brought up at the start of a block this task is in. A `_Look` is
# closed when its block ends, so that a task started inside and outliving it looks again.
_LOOKS: ContextVar[dict[tuple[int, str], _Look]] = ContextVar("mnemo_vector_looks")


def looked(owner: object, repo: str) -> bool:
    """Whether `owner`'s vectors of `repo` were brought up at the start of an open block
    (`one_look`) this task is in."""
    look = _LOOKS.get({}).get((id(owner), repo))
    return look is not None and look.open


@asynccontextmanager
async def one_look(
    owner: object, repo: str, catch_up: Callable[[], Awaitable[object]]
) -> AsyncIterator[None]:
    """Brings `owner`'s vectors of `repo` up (`catch_up`) now; inside the block, `looked` is
    True and the uses skip the log."""
    if looked(owner, repo):
        yield
        return
    await catch_up()
    look = _Look()
    token = _LOOKS.set({**_LOOKS.get({}), (id(owner), repo): look})
    try:
        yield
    finally:
        look.open = False
        _LOOKS.reset(token)
