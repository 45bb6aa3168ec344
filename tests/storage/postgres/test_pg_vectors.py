"""PostgreSQL's vector side: a repo gets its HNSW index only once it outgrows exact search."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import numpy.typing as npt
import psycopg
import pytest
from hypothesis import given, strategies as st

from mnemo.errors import StorageError
from mnemo.graph import ann
from mnemo.graph.ann import HnswAccelerator
from mnemo.graph.model import Changeset, NodeDraft, NodeType
from mnemo.graph.vectors import top_per_row, unit
from mnemo.storage.postgres import vectors as pg_vectors
from mnemo.storage.postgres.connection import Postgres
from mnemo.storage.postgres.graph import PgGraph
from mnemo.storage.postgres.schema import vector_index_name
from tests.graph._support import DIM, policy, searches_of


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


async def test_exact_search_breaks_ties_by_insertion_wherever_the_rows_lie(
    pg_url: str,
) -> None:
    """Equal distances come in the order the nodes were written, with and without a type
    filter, even when the table's physical order differs (an updated row moves to the end
    of the heap): the ranking keeps every row tied at its cut before ordering by insertion."""
    same = np.ones(DIM, dtype=np.float32)
    kinds = [NodeType.SEMANTIC, NodeType.EPISODIC] * 20
    async with Postgres(pg_url) as pg:
        graph = PgGraph(pg, lambda repo: DIM)
        nodes = [NodeDraft(f"n{i}", kinds[i], f"fact {i}", {}, same) for i in range(40)]
        await graph.apply(Changeset("cs", "r", nodes), intents=policy())
        with psycopg.connect(pg_url) as conn:  # n0 and n1 now lie last in the heap
            conn.execute("UPDATE vectors SET vec = vec WHERE node_id IN ('n0', 'n1')")
        assert [i for i, _ in await graph.search_vectors("r", same, 3)] == ["n0", "n1", "n2"]
        episodic = await graph.search_vectors("r", same, 2, [NodeType.EPISODIC])
        assert [i for i, _ in episodic] == ["n1", "n3"]


async def test_a_scoped_dense_search_reads_k_rows_not_the_scope(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a scope, the server ranks the members' vectors and returns the best `k` rows
    (a zero vector, never near, left out): what a scoped search reads is bounded by k, not
    by the scope's size, and it finds what the exact ranking finds."""
    vectors = np.random.default_rng(9).normal(size=(60, DIM)).astype(np.float32)
    vectors[7] = 0.0
    query = vectors[3] + 0.1 * vectors[4]
    async with Postgres(pg_url) as pg:
        graph = PgGraph(pg, lambda repo: DIM)
        nodes = [NodeDraft(f"n{i}", NodeType.SEMANTIC, f"fact {i}", {}, vectors[i])
                 for i in range(60)]
        await graph.apply(Changeset("cs", "r", nodes, metadata={"user_id": "alice"}),
                          intents=policy())
        scope = await graph.scope("r", {"user_id": ('"alice"',)})
        assert scope.members is not None
        assert len(scope.members) == 60
        read: list[int] = []
        real = pg.fetch_all

        async def counted(statement: Any, params: Any = None, **kwargs: Any) -> Any:
            rows = await real(statement, params, **kwargs)
            read.append(len(rows))
            return rows

        monkeypatch.setattr(pg, "fetch_all", counted)
        hits = await graph.search_vectors("r", query, 5, scope=scope)
        scores = unit(vectors) @ unit(query)[0]
        assert [i for i, _ in hits] == [f"n{i}" for i in np.argsort(-scores)[:5]]
        assert np.allclose([s for _, s in hits], np.sort(scores)[::-1][:5], atol=1e-5)
        assert sum(read) <= 5
        assert await graph.search_vectors("r", np.zeros(DIM, np.float32), 5, scope=scope) == []


def many_routes(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> tuple[npt.NDArray[np.float32], list[NodeDraft]]:
    """1,000 random routes (a tag in four, the rest intents), with the threshold of a walk
    lowered to 100 rows: both types get HNSW graphs and are walked, not multiplied."""
    monkeypatch.setattr(ann, "WALK_FROM", 100)
    vectors = np.random.default_rng(seed).normal(size=(1000, DIM)).astype(np.float32)
    kinds = [NodeType.TAG if i % 4 == 0 else NodeType.INTENT for i in range(1000)]
    return vectors, [NodeDraft(f"n{i}", kinds[i], f"route {i}", {}, vectors[i])
                     for i in range(1000)]


async def test_routes_past_the_threshold_are_probed_through_hnsw(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past `ann.WALK_FROM` routing vectors, recall's probes of tags and intents walk HNSW
    graphs (in a worker thread) instead of a product with every routing row, find what that
    product finds, and follow a route added after the graphs were built."""
    vectors, nodes = many_routes(monkeypatch, seed=5)
    async with Postgres(pg_url) as pg:
        graph = PgGraph(pg, lambda repo: DIM)
        try:
            await graph.apply(Changeset("cs", "r", nodes[:999]), intents=policy())
            routes = await graph._vectors.index("r")
            await graph.settle("r")
            assert isinstance(routes.accelerator, HnswAccelerator)
            assert routes.accelerator.ready
            walks = searches_of(routes, monkeypatch)
            probes = vectors[[1, 8, 21]]
            for kind in (NodeType.TAG, NodeType.INTENT):
                found = await graph.nearest_of_type("r", probes, kind, 3)
                ids, matrix = routes.of_type(kind)
                truth = top_per_row(unit(probes) @ matrix.T, ids, 3)
                assert [[i for i, _ in row] for row in found] == [
                    [i for i, _ in row] for row in truth
                ]
            assert walks == [3, 3]  # one walk per type, of the three probes
            late = NodeDraft("n999", NodeType.TAG, "route 999", {}, vectors[999])
            await graph.apply(Changeset("late", "r", [late]), intents=policy())
            found = await graph.nearest_of_type("r", vectors[999][None, :], NodeType.TAG, 1)
            assert found[0][0][0] == "n999"
        finally:
            await graph.aclose()


async def test_routes_graphs_are_saved_and_read_back_by_the_next_process(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With a folder, the routes' graphs are saved once built; a graph store opened later on
    the same database reads them instead of building them, and a route deleted in between
    is never found through them."""
    vectors, nodes = many_routes(monkeypatch, seed=6)
    async with Postgres(pg_url) as pg:
        graph = PgGraph(pg, lambda repo: DIM, ann_dir=tmp_path)
        try:
            await graph.apply(Changeset("cs", "r", nodes), intents=policy())
            routes = await graph._vectors.index("r")
            await graph.settle("r")
            assert isinstance(routes.accelerator, HnswAccelerator)
            assert routes.accelerator.stats()["read"] == 0
        finally:
            await graph.aclose()
        saved = [p async for p in anyio.Path(tmp_path).glob("pg-*/hnsw/*/graphs")]
        assert len(saved) == 1

        again = PgGraph(pg, lambda repo: DIM, ann_dir=tmp_path)
        try:
            await again.delete_nodes("r", ["n8"])
            routes = await again._vectors.index("r")
            await again.settle("r")
            assert isinstance(routes.accelerator, HnswAccelerator)
            assert routes.accelerator.stats()["read"] == 1
            assert routes.accelerator.ready
            found = await again.nearest_of_type("r", vectors[[8, 12]], NodeType.TAG, 1)
            assert found[0][0][0] != "n8"
            assert found[1][0][0] == "n12"
        finally:
            await again.aclose()


async def test_routes_load_when_the_database_identity_cannot_be_read(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Where `pg_control_system()` is revoked (a managed server), the routes' graphs are not
    saved, with a warning, and recall's probes work as without a folder."""
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(20, DIM)).astype(np.float32)
    async with Postgres(pg_url) as pg:
        real = pg.fetch_all

        async def revoked(statement: Any, params: Any = None, **kwargs: Any) -> Any:
            if "pg_control_system" in str(statement):
                raise StorageError("unavailable", "permission denied for function")
            return await real(statement, params, **kwargs)

        monkeypatch.setattr(pg, "fetch_all", revoked)
        graph = PgGraph(pg, lambda repo: DIM, ann_dir=tmp_path)
        try:
            nodes = [NodeDraft(f"t{i}", NodeType.TAG, f"tag {i}", {}, vectors[i])
                     for i in range(20)]
            await graph.apply(Changeset("cs", "r", nodes), intents=policy())
            with caplog.at_level(logging.WARNING, logger="mnemo"):
                found = await graph.nearest_of_type("r", vectors[[4]], NodeType.TAG, 1)
            assert found[0][0][0] == "t4"
            assert "will not be saved" in caplog.text
            routes = await graph._vectors.index("r")
            assert isinstance(routes.accelerator, HnswAccelerator)
            assert routes.accelerator.files is None
        finally:
            await graph.aclose()


@given(
    st.lists(
        st.lists(st.floats(-1e3, 1e3, width=32), min_size=DIM, max_size=DIM),
        max_size=12,
    )
)
def test_unit_rows_scales_each_row_as_unit_does_alone(rows: list[list[float]]) -> None:
    """`unit_rows` (one numpy call for a read's rows) gives each id the vector that `unit` of
    its row alone gives, zero rows staying zero: recall's reads took 0.6 ms to scale 50 rows
    one by one."""
    read = [(f"n{i}", np.array(row, dtype=np.float32)) for i, row in enumerate(rows)]
    scaled = pg_vectors.unit_rows(read)
    assert list(scaled) == [node_id for node_id, _ in read]
    for node_id, vector in read:
        np.testing.assert_array_equal(scaled[node_id], unit(vector)[0])
