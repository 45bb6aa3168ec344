"""The SQLite file's layout: an operator's `PRAGMA integrity_check` is clean, vectors are
float16 rows packed in their pages, and commit records stay in their pages."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

import mnemo
from mnemo.storage.sqlite.rows import unpack_text
from tests.storage.filled import fill


def integrity(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        rows = [row[0] for row in conn.execute("PRAGMA integrity_check(1000)")]
    conn.close()
    return rows


async def test_integrity_check_is_clean_on_a_filled_store(tmp_path: Path) -> None:
    """`PRAGMA integrity_check` answers "ok" on a store with a row in every table (SQLite
    3.40 reported "NULL value in links.repo" for every link, where no row is NULL)."""
    path = tmp_path / "memory.db"
    await fill(path)
    with sqlite3.connect(path) as conn:
        (links,) = conn.execute("SELECT count(*) FROM links").fetchone()
    conn.close()
    assert links > 0
    assert integrity(path) == ["ok"]


async def test_vectors_are_float16_rows_and_commits_and_links_are_compact(
    tmp_path: Path,
) -> None:
    """A node's vector takes 2 bytes a dimension and not much more on disk (a float32 one
    took half a 4 KB page), an ingest's commit record, its lists packed, well under a
    kilobyte (it took an overflow page of its own, 4.7 KB), and a link, with its entry in
    links_by_dst, under 100 bytes (naming its ends by id, it took 220); no index of the
    nodes leads with the id but the id's own."""
    path = tmp_path / "memory.db"
    async with mnemo.Memory(path, embedder=mnemo.HashEmbedder(dim=384)) as mem:
        await mem.open_repo("chat")
        for i in range(60):
            step = mnemo.Step(f"Message {i}: the garden hose {i} leaks again.", "remember it")
            await mem.ingest("chat", mnemo.Trajectory("remember the chat", [step]),
                             source_id=f"m{i}")
    with sqlite3.connect(path) as conn:
        lengths = {n for (n,) in conn.execute("SELECT DISTINCT length(vec) FROM vectors")}
        disk = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
        (vectors,) = conn.execute("SELECT count(*) FROM vectors").fetchone()
        records = conn.execute("SELECT nodes, links FROM commits").fetchall()
        (links,) = conn.execute("SELECT count(*) FROM links").fetchone()
        by_id = [name for name, in conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'nodes'"
            " AND sql LIKE '%(id%'")]
    conn.close()
    assert links >= 6 * 60
    assert (disk["links"] + disk["links_by_dst"]) / links < 100
    assert by_id == []
    assert lengths == {2 * 384}
    assert disk["vectors"] / vectors < 1.12 * 2 * 384
    assert disk["commits"] / len(records) < 1024
    nodes, links = records[0]
    assert isinstance(links, bytes)
    assert json.loads(unpack_text(nodes))[0].startswith("source_")
    assert len(links) < len(unpack_text(links)) / 2


async def test_a_file_named_like_a_uri_is_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store path SQLite would read as a URI ("file:notes.db") is the file of that name: it
    opened "notes.db" instead, then failed (StorageError) leaving that file behind."""
    monkeypatch.chdir(tmp_path)
    for _ in range(2):  # made, then opened again
        async with mnemo.Memory("file:notes.db") as mem:
            await mem.open_repo("r")
            assert await mem.list_repos() == ["r"]
    assert [name for name in sorted(os.listdir(tmp_path)) if name.endswith(".db")] == [
        "file:notes.db"]
