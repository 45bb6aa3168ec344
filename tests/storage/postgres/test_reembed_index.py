"""PostgreSQL's HNSW index of a re-embedded repo (`Memory.reembed`): dropped before the switch,
built again after it for the new dimension without holding up commits
(`schema.build_vector_index`), and an index a cut build left invalid is replaced."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

import mnemo
from mnemo.storage.postgres import schema
from mnemo.storage.postgres.connection import Postgres

REPO = "r"


async def _index(url: str, repo: str = REPO) -> tuple[str, bool] | None:
    """The repo's HNSW index definition and whether it is valid, None without one."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT pg_get_indexdef(i.indexrelid), i.indisvalid FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s",
            (schema.vector_index_name(repo),),
        )
        row = await cur.fetchone()
    return None if row is None else (str(row[0]), bool(row[1]))


async def test_a_reembedded_repo_past_exact_scans_gets_its_index_again(pg_url: str) -> None:
    """A repo with an HNSW index (past exact scans) re-embedded into another dimension has
    a valid index of the new dimension after, and its recall finds through it."""
    async with mnemo.Memory(pg_url, embedder=mnemo.HashEmbedder(64)) as mem:
        await mem.open_repo(REPO)
        mem._graph._vectors._exact_below = 3  # type: ignore[attr-defined]
        for i, text in enumerate(["The kettle is on the stove.", "Tomatoes need sun.",
                                  "The backup runs at night."]):
            await mem.ingest(REPO, mnemo.Trajectory(f"g{i}", [mnemo.Step(text, "note it")]),
                             source_id=f"s{i}")
        before = await _index(pg_url)
        assert before is not None
        assert "vector(64)" in before[0]
        await mem.reembed(REPO, embedder=mnemo.HashEmbedder(32))
        after = await _index(pg_url)
        assert after is not None
        assert "vector(32)" in after[0]
        assert after[1]
        found = await mem.recall(REPO, "where is the kettle", reinforce=False)
        assert "The kettle is on the stove." in [m.node.text for m in found.memories]


async def test_an_index_a_cut_build_left_invalid_is_built_again(pg_url: str) -> None:
    """A concurrent build that failed leaves an invalid index of the repo's name, which no
    search uses: `build_vector_index` and `ensure_vector_index` both drop it and build it
    valid."""
    async with Postgres(pg_url) as pg, pg.connection() as conn:
        await conn.execute("INSERT INTO nodes (id, repo, type, text, data, created_at)"
                           " VALUES ('n', %s, 'semantic', 'x', '{}', now())", (REPO,))
        await conn.execute("INSERT INTO vectors (node_id, repo, vec) VALUES ('n', %s, %s)",
                           (REPO, "[1,0,0]"))
        for build in (schema.build_vector_index, schema.ensure_vector_index):
            # Built for another dimension than its rows': the concurrent build fails.
            with pytest.raises(mnemo.StorageError):
                await schema.build_vector_index(conn, REPO, 4)
            left = await _index(pg_url)
            assert left is not None
            assert not left[1]
            await build(conn, REPO, 3)
            rebuilt = await _index(pg_url)
            assert rebuilt is not None
            assert rebuilt[1]
            assert "vector(3)" in rebuilt[0]
            await conn.execute(sql.SQL("DROP INDEX {}").format(
                sql.Identifier(schema.vector_index_name(REPO))))
