"""Erasure on PostgreSQL: after `purge` and `forget`, no row of any table holds the content
or a token of it (search vectors and JSON included), read through each row's text form; and
after README's recipe, no file of the data directory holds a byte of it."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import mnemo
from tests.conversation._support import OfflineFake, assistant, tool_call, tool_result, user
from tests.fakes import FakeEmbedder
from tests.pg import start_server


async def rows_holding(url: str, needle: str) -> dict[str, int]:
    """Per table of the database, the rows whose text form (every column, tsvectors and jsonb
    included) contains `needle`; tables without any are left out."""
    found: dict[str, int] = {}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
        )
        for (table,) in await cur.fetchall():
            counted = await conn.execute(
                sql.SQL("SELECT count(*) FROM {} AS r WHERE r::text LIKE %s").format(
                    sql.Identifier(str(table))
                ),
                (f"%{needle}%",),
            )
            row = await counted.fetchone()
            assert row is not None
            if row[0]:
                found[str(table)] = int(row[0])
    return found


async def test_purge_leaves_no_row_holding_the_thread(pg_url: str) -> None:
    """A marker saved everywhere a thread reaches (messages, tool calls, search vectors,
    message vectors, compaction, snapshot, goal, pins) is in no row after purge; another
    thread is untouched."""
    marker = f"zq{uuid.uuid4().hex}qz"
    needle = marker[4:]  # survives stemming inside a tsvector's lexemes
    thread = f"thread-{marker}"
    async with mnemo.Memory(pg_url, llm=OfflineFake(), embedder=FakeEmbedder()) as mem:
        conv = mem.conversation(
            retrieval=mnemo.Semantic(k=5), compression=mnemo.Summary(max_tokens=80, keep=2)
        )
        await mem.add_goal(thread, f"ship the {marker} release")
        await conv.save(thread, [
            user(f"Always tag the build {marker} before the release of {marker}."),
            assistant(f"Understood, I will tag {marker} first."),
            tool_call("c1", "git_tag", f'{{"tag": "{marker}"}}'),
            tool_result("c1", f"tagged {marker} at commit abc123"),
            *[user(f"step {i}: the {marker} checklist item number {i} is done") for i in range(8)],
        ])
        await conv.save("keeper", [user("unrelated thread about gardening tomatoes")])
        await conv.load(thread, query=f"checklist {marker}")
        result = await mem.evict(thread, token_budget=400, eviction_fraction=0.5)
        assert result.snapshot is not None
        assert marker in result.snapshot.text
        assert await conv.compactions(thread)
        before = await rows_holding(pg_url, needle)
        assert {"messages", "snapshots", "goals", "compactions"} <= set(before), before

        await conv.purge(thread)

        assert await rows_holding(pg_url, needle) == {}
        assert await conv.raw(thread) == []
        assert [m.content for m in await conv.raw("keeper")] == [
            "unrelated thread about gardening tomatoes"
        ]


async def test_forget_leaves_no_row_holding_the_source(pg_url: str) -> None:
    """An ingested source's words are in nodes (and their search vectors), steps and the
    source's record; after `forget` they are in no row, and a second source stays."""
    marker = f"zq{uuid.uuid4().hex}qz"
    needle = marker[4:]
    async with mnemo.Memory(pg_url, embedder=mnemo.HashEmbedder()) as mem:
        await mem.open_repo("r")
        gone = mnemo.Trajectory(f"deploy {marker}", [
            mnemo.Step(f"The {marker} service listens on port 9090.", f"restart {marker}"),
            mnemo.Step(f"The {marker} health check passes.", "close the ticket"),
        ])
        kept = mnemo.Trajectory("water the garden", [
            mnemo.Step("The tomatoes need water.", "water them"),
        ])
        await mem.ingest("r", gone, source_id=f"src-{marker}")
        await mem.ingest("r", kept, source_id="garden")
        assert "nodes" in await rows_holding(pg_url, needle)

        await mem.forget("r", f"src-{marker}")

        assert await rows_holding(pg_url, needle) == {}
        found = await mem.recall("r", "tomatoes water", k=5)
        assert any("tomatoes" in m.node.text for m in found.memories)


def readme_recipe() -> list[str]:
    """The statements of README's PostgreSQL erasure recipe (its one ```sql block)."""
    readme = (Path(__file__).parents[3] / "README.md").read_text()
    block = readme.split("```sql\n", 1)[1].split("```", 1)[0]
    lines = (line.split("--", 1)[0] for line in block.splitlines())
    return [s.strip() for s in " ".join(lines).split(";") if s.strip()]


@pytest.mark.slow
async def test_readme_erasure_recipe_leaves_no_byte_in_the_data_directory() -> None:
    """On a server of its own (deployment settings: full-page writes on), a word ingested,
    saved in a thread and analysed is in the data directory; after `forget`, `purge` and
    README's recipe it is in no file of it, WAL and statistics included, and the rest stays."""
    marker = f"zq{uuid.uuid4().hex}qz"
    needle = marker[4:].encode()
    folder = Path(tempfile.mkdtemp(prefix="mnemo-erase-"))
    server = start_server(folder / "data", fast=False)
    try:
        server.admin(sql.SQL("CREATE DATABASE erased"))
        url = server.url("erased")

        def holding() -> list[str]:
            return sorted(str(path.relative_to(folder)) for path in folder.rglob("*")
                          if path.is_file() and needle in path.read_bytes())

        async with mnemo.Memory(url, embedder=mnemo.HashEmbedder()) as mem:
            await mem.open_repo("r")
            await mem.ingest("r", mnemo.Trajectory(f"deploy {marker}", [
                mnemo.Step(f"The {marker} service listens on port 9090.", f"restart {marker}"),
            ]), source_id="gone")
            await mem.ingest("r", mnemo.Trajectory("water the garden", [
                mnemo.Step("The tomatoes need water.", "water them"),
            ]), source_id="kept")
            conv = mem.conversation()
            await conv.save("t", [user(f"tag the build {marker}"), assistant(f"tagged {marker}")])
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute("ANALYZE")  # the statistics hold sampled values
                await conn.execute("CHECKPOINT")
            assert holding(), "sanity: the word is on disk before the erasure"
            await mem.forget("r", "gone")
            await conv.purge("t")
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                for statement in readme_recipe():
                    await conn.execute(statement)
            assert holding() == []
            found = await mem.recall("r", "tomatoes water", k=5)
            assert any("tomatoes" in m.node.text for m in found.memories)
    finally:
        server.handle.cleanup()
        shutil.rmtree(folder, ignore_errors=True)
