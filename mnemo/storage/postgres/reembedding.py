"""`PgReembedding`: a repo's re-embedding on PostgreSQL (`PgGraph` inherits it; the steps in
`mnemo.graph.reembed`, the SQL in `reembeds.py`)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio

from mnemo.errors import ConflictError
from mnemo.graph.model import Vector
from mnemo.graph.reembed import Staging, Unstaged
from mnemo.storage.graph_base import GraphBase
from mnemo.storage.postgres import reembeds
from mnemo.storage.postgres.connection import Postgres
from mnemo.storage.postgres.vectors import PgVectors
from mnemo.storage.reembed_claims import Claims


def reembed_lock_key(repo: str) -> int:
    """The advisory-lock key of a repo's re-embedding."""
    digest = hashlib.sha256(b"mnemo.reembed:" + repo.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PgReembedding(GraphBase):
    """`GraphStore`'s re-embedding methods over PostgreSQL."""

    _pg: Postgres
    _vectors: PgVectors
    _reembeds: Claims

    @asynccontextmanager
    async def _reembed_lock(self, repo: str, busy: ConflictError) -> AsyncIterator[None]:
        """The database's advisory lock of the repo's re-embedding, taken without waiting on
        a connection held for the block (the server lets it go when the connection ends,
        with its process)."""
        async with self._pg.connection() as conn:
            key = reembed_lock_key(repo)
            cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (key,))
            row = await cur.fetchone()
            if row is None or row[0] is not True:
                raise busy
            try:
                yield
            finally:
                with anyio.CancelScope(shield=True):
                    await conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

    async def begin_reembed(self, repo: str, embedder: str, dim: int) -> Staging:
        async with self._pg.transaction() as conn:
            return await reembeds.begin(conn, repo, embedder, dim)

    async def unstaged(
        self, repo: str, after: int, limit: int, upto: int | None = None
    ) -> list[Unstaged]:
        async with self._pg.connection() as conn:
            return await reembeds.unstaged(conn, repo, after, limit, upto)

    async def last_rowid(self, repo: str) -> int:
        async with self._pg.connection() as conn:
            return await reembeds.last_rowid(conn, repo)

    async def stage(self, repo: str, nodes: Sequence[Unstaged], vectors: Vector) -> None:
        async with self._pg.transaction() as conn:
            await reembeds.stage(conn, nodes, vectors)

    async def unstage_changed(self, repo: str) -> None:
        async with self._pg.transaction() as conn:
            await reembeds.unstage_changed(conn, repo)

    async def switch_vectors(self, repo: str) -> tuple[int, int]:
        async with self._pg.transaction() as conn:
            await reembeds.drop_vector_index(conn, repo)
        async with self._pg.transaction() as conn:
            return await reembeds.switch(conn, repo)

    async def vectors_switched(self, repo: str, dim: int) -> None:
        """The repo's HNSW index is built again for the new vectors when the repo is past
        exact scans, and its routes' saved graphs go (the routes in memory load the new
        vectors at their next use: their generation moved)."""
        await self._vectors.switched(repo, dim)
