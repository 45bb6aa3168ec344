"""PostgreSQL's vector side: a repo gets its HNSW index only once it outgrows exact search."""

from __future__ import annotations

import numpy as np
import psycopg

from mnemo.graph.model import Changeset, NodeDraft, NodeType
from mnemo.storage.postgres.connection import Postgres
from mnemo.storage.postgres.graph import PgGraph
from mnemo.storage.postgres.schema import vector_index_name
from tests.graph._support import DIM, policy


def has_index(url: str, repo: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT to_regclass(%s)", (vector_index_name(repo),)).fetchone()
    return row is not None and row[0] is not None


async def test_the_hnsw_index_comes_when_exact_search_stops(pg_url: str) -> None:
    """Up to `exact_below` vectors a repo has no HNSW index (each insert would pay for one it
    never uses); the commit that takes it past gets one, and searches find the same nodes."""
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(12, DIM)).astype(np.float32)
    async with Postgres(pg_url) as pg:
        graph = PgGraph(pg, lambda repo: DIM, exact_below=8)
        for start in (0, 4):
            nodes = [NodeDraft(f"n{i}", NodeType.SEMANTIC, f"fact {i}", {}, vectors[i])
                     for i in range(start, start + 4)]
            await graph.apply(Changeset(f"cs{start}", "r", nodes), intents=policy())
        assert not has_index(pg_url, "r")
        before = [i for i, _ in await graph.search_vectors("r", vectors[5], 3)]
        nodes = [NodeDraft(f"n{i}", NodeType.SEMANTIC, f"fact {i}", {}, vectors[i])
                 for i in range(8, 12)]
        await graph.apply(Changeset("cs8", "r", nodes), intents=policy())
        assert has_index(pg_url, "r")
        after = [i for i, _ in await graph.search_vectors("r", vectors[5], 3)]
        assert before[0] == after[0] == "n5"
        assert [i for i, _ in await graph.search_vectors("r", vectors[10], 1)] == ["n10"]
