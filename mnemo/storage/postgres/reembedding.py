"""`PgReembedding`: a repo's re-embedding on PostgreSQL (`PgGraph` inherits it; the steps in
`mnemo.graph.reembed`, the SQL in `storage/reembeds.py`)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime

import anyio

from mnemo.errors import ConflictError
from mnemo.graph.model import Vector
from mnemo.storage.postgres.connection import Postgres
from mnemo.storage.postgres.schema import vector_index_name
from mnemo.storage.postgres.vectors import PgVectors, as_array
from mnemo.storage.reembeds import ReembeddedGraph, SqlReembeds


def reembed_lock_key(repo: str) -> int:
    """The advisory-lock key of a repo's re-embedding."""
    digest = hashlib.sha256(b"mnemo.reembed:" + repo.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PgReembeds(SqlReembeds):
    """The re-embedding's statements on PostgreSQL (staged vectors keyed by node id)."""

    OF_REPO = "repo = ?"
    STAGED = "s.node_id = n.id"
    LOCK = " FOR UPDATE"
    STAGE = (
        "INSERT INTO staged_vectors (node_id, repo, vec) SELECT id, repo, ? FROM nodes"
        " WHERE rowid = ? AND id = ? ON CONFLICT (node_id) DO UPDATE SET vec = excluded.vec"
    )
    UNSTAGE_LOGGED = (
        "DELETE FROM staged_vectors s USING nodes n WHERE s.node_id = n.id AND n.rowid IN"
        " (SELECT node FROM lexical_log WHERE repo = ? AND seq > ? AND seq <= ?)"
    )
    VECTOR_COLUMNS = "node_id, repo, vec"

    @staticmethod
    def _vector(vector: Vector) -> object:
        return as_array(vector)

    @staticmethod
    def _stamp(at: datetime) -> object:
        return at


class PgReembedding(ReembeddedGraph):
    """`GraphStore`'s re-embedding methods over PostgreSQL."""

    REEMBEDS = PgReembeds()

    _pg: Postgres
    _vectors: PgVectors

    @asynccontextmanager
    async def _reembed_lock(self, repo: str, busy: ConflictError) -> AsyncIterator[None]:
        """The repo's re-embedding advisory lock, taken without waiting, held for the block."""
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

    async def _before_switch(self, repo: str) -> None:
        # Its cast to the old dimension would refuse the new vectors (rebuilt after).
        await self._pg.write(
            lambda sql: sql.run(f'DROP INDEX IF EXISTS "{vector_index_name(repo)}"')
        )

    async def vectors_switched(self, repo: str, dim: int) -> None:
        """Rebuilds the repo's HNSW index if it is large; drops its routes' saved graphs."""
        await self._vectors.switched(repo, dim)
