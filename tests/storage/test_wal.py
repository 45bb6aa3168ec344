"""Under sustained writes the WAL stays small and the file holds little more
than its data (a WAL once reached 2.6 GB beside a 47 MB database)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import mnemo
from mnemo.storage.sqlite.database import WAL_SIZE_LIMIT
from tests.fakes import FakeEmbedder, FakeLLM, sqlite_database

# SQLite checkpoints every 1000 pages; the WAL may pass the limit by about that much between
# two checkpoints before it is truncated.
WAL_BOUND = WAL_SIZE_LIMIT + 1000 * 4096 * 2


def _file_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


@pytest.mark.slow
async def test_sustained_writes_keep_the_wal_bounded(tmp_path: Path) -> None:
    """250 writes of 100 KB each to one thread (25 MB, about 30 MB with the search index):
    the WAL never passes its bound, and database plus WAL stay under twice the pages the
    database uses. Each writes its new messages with `append`, the same write a `save` of the
    whole history makes, without `save`'s check of every message before them."""
    path = tmp_path / "m.db"
    wal = Path(f"{path}-wal")
    biggest = 0
    async with mnemo.Memory(path, llm=FakeLLM(), embedder=FakeEmbedder()) as mem:
        manager = mem.conversation()
        for turn in range(250):
            await manager.append("t", [
                {"role": "user", "content": f"turn {turn} line {i} " + "lorem ipsum " * 80}
                for i in range(100)
            ])
            biggest = max(biggest, _file_size(wal))
        used = await sqlite_database(mem).run(
            lambda db: db.conn.execute(
                "SELECT (page_count - freelist_count) * page_size"
                " FROM pragma_page_count, pragma_freelist_count, pragma_page_size"
            ).fetchone()[0]
        )
        on_disk = _file_size(path) + _file_size(wal)
    assert biggest < WAL_BOUND, f"WAL reached {biggest / 2**20:.1f} MB"
    assert on_disk < 2 * used
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 25_000
