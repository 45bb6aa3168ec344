"""PostgreSQL's repo locks: a lock holds a pooled connection for its block, so they must
never take the whole pool."""

from __future__ import annotations

import anyio
import numpy as np

from mnemo.graph.model import Changeset, NodeDraft, NodeType
from mnemo.storage.postgres.store import PostgresBackend
from tests.graph._support import DIM, policy


async def test_commits_to_more_repos_than_connections_all_land(pg_url: str) -> None:
    """Eight repos commit at once over a pool of two connections: every commit lands (none
    waits for a connection that only another lock's block would give back)."""
    backend = PostgresBackend(pg_url, dims=lambda repo: DIM, busy_timeout=2.0, max_connections=2)
    await backend.open()
    try:
        receipts = []

        async def commit(i: int) -> None:
            node = NodeDraft(f"n{i}", NodeType.SEMANTIC, f"fact {i}", {},
                             np.eye(DIM, dtype=np.float32)[i % DIM])
            receipts.append(await backend.graph.apply(
                Changeset(f"cs{i}", f"repo-{i}", [node]), intents=policy()))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(commit, i)
        assert sorted(r.node_ids[0] for r in receipts) == [f"n{i}" for i in range(8)]
    finally:
        await backend.close()
