"""SQLite's one connection: calls queued on its thread without waiting for them (`post`, a
recall's access counts) or begun now and awaited later (`start`, a recall's look at the node
log) keep the order they were given in."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shutil
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import anyio
import pytest
from sqlite_utils import Database as SqliteUtilsDatabase

import mnemo
from mnemo.graph.model import Changeset, NodeType, now_utc
from mnemo.storage.ports import Backend
from mnemo.storage.sql import Statements, drive
from mnemo.storage.sqlite import SqliteBackend
from mnemo.storage.sqlite.database import Database
from tests.backends import open_stores
from tests.graph._support import DIM, draft, policy

REPO = "r"


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[Backend]:
    async with open_stores(str(tmp_path / "s.db"), DIM) as opened:
        await opened.graph.apply(
            Changeset("c", REPO, [draft("a", NodeType.SEMANTIC, "the kettle is blue")]),
            intents=policy(),
        )
        yield opened


async def held(database: Database, gate: threading.Event,
               task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Holds the connection's thread until `gate` opens: whatever is given meanwhile waits."""
    task_status.started()
    await database.run(lambda db: gate.wait(10))


def database_of(backend: Backend) -> Database:
    return cast(SqliteBackend, backend).database


async def test_reinforce_returns_before_its_write_and_later_reads_see_it(
    backend: Backend,
) -> None:
    """SQLite's access counts are queued on the connection's thread: `reinforce` returns while
    that thread is busy, and a read given after it sees the counts."""
    database, gate = database_of(backend), threading.Event()
    async with anyio.create_task_group() as tg:
        await tg.start(held, database, gate)
        with anyio.fail_after(5):
            await backend.graph.reinforce(REPO, ["a", "a"], now_utc())
        gate.set()
    stats = await backend.graph.access_stats(REPO, ["a"])
    assert stats["a"][0] == 1
    assert stats["a"][1] is not None


async def test_posted_and_started_calls_keep_the_order_they_were_given_in(
    backend: Backend,
) -> None:
    """A posted write runs after the calls given before it and before those given after; a
    started read runs at once, whether or not it is awaited, and its answer waits for it."""
    database, gate = database_of(backend), threading.Event()
    order: list[str] = []

    def write(db: SqliteUtilsDatabase) -> None:
        order.append("write")
        db.conn.execute("UPDATE nodes SET access_count = 7 WHERE id = 'a'")

    def read(db: SqliteUtilsDatabase) -> int:
        order.append("read")
        count: int = db.conn.execute("SELECT access_count FROM nodes WHERE id = 'a'").fetchone()[0]
        return count

    async with anyio.create_task_group() as tg:
        await tg.start(held, database, gate)
        database.post(write, lambda exc: order.append("refused"))
        started = database.start(read)
        unread = database.start(read)
        unread.discard()
        assert order == []
        gate.set()
        assert await started.result() == 7
    await database.run(lambda db: None)
    assert order == ["write", "read", "read"]


async def test_a_refused_posted_write_reaches_its_callback_as_a_storage_error(
    backend: Backend,
) -> None:
    """A posted write that SQLite refuses is rolled back and handed to `failed` as a
    StorageError (nothing reaches the caller, who did not wait)."""
    database = database_of(backend)
    failed: list[mnemo.StorageError] = []

    def write(db: SqliteUtilsDatabase) -> None:
        db.conn.execute("BEGIN")
        db.conn.execute("UPDATE nodes SET access_count = 9 WHERE id = 'a'")
        raise sqlite3.OperationalError("database is locked")

    database.post(write, failed.append)
    count = await database.run(
        lambda db: db.conn.execute("SELECT access_count FROM nodes WHERE id = 'a'").fetchone()[0]
    )
    assert count == 0
    assert [exc.reason for exc in failed] == ["busy"]


async def test_a_started_call_that_fails_raises_a_storage_error_when_awaited(
    backend: Backend,
) -> None:
    """A started call's SQLite error is a StorageError where its answer is awaited."""
    database = database_of(backend)

    def broken(db: SqliteUtilsDatabase) -> None:
        db.conn.execute("SELECT * FROM no_such_table")

    with pytest.raises(mnemo.StorageError):
        await database.start(broken).result()


async def test_sqlite_work_runs_whole_in_the_connections_thread(tmp_path: Path) -> None:
    """A store's work over `Statements` runs to its end in the database's thread (its
    statements never wait), with its result; work that waits for something else is refused
    there, closed, rather than left half done."""
    database = Database(tmp_path / "m.db")
    await database.open()

    async def count(sql: Statements) -> int:
        row = await sql.row("SELECT count(*) FROM threads")
        assert row is not None
        return int(row[0])

    try:
        assert await database.read(count) == 0
        assert await database.write(count) == 0
    finally:
        await database.close()

    async def waits() -> None:
        await asyncio.sleep(0)

    work = waits()
    with pytest.raises(RuntimeError, match="waited"):
        drive(work)
    assert inspect.getcoroutinestate(work) == inspect.CORO_CLOSED


async def test_a_store_whose_folder_is_removed_while_open_refuses_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's folder removed under an open Memory: an append, a thread's save and a
    commit raise StorageError("unavailable") naming the file (SQLite wrote on into the unlinked
    files and every call returned as if stored); a store opened by a relative path keeps
    working after the process changes its directory."""
    folder = tmp_path / "store"
    folder.mkdir()
    monkeypatch.chdir(folder)
    async with mnemo.Memory("m.db", embedder=mnemo.HashEmbedder()) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("tidy the shed", repo=REPO)
        monkeypatch.chdir(tmp_path)
        await mem.append(sid, "the shed is full", "open a box")
        shutil.rmtree(folder)
        calls = [lambda: mem.append(sid, "the box holds tools", "sort them"),
                 lambda: mem.conversation().save("t", [{"role": "user", "content": "hi"}]),
                 lambda: mem.close_and_commit(sid)]
        for call in calls:
            with pytest.raises(mnemo.StorageError) as refused:
                await call()
            assert refused.value.reason == "unavailable"
            assert "removed or replaced" in str(refused.value)


@pytest.mark.parametrize("inspecting", [False, True])
async def test_a_store_replaced_while_open_refuses_reads(
    tmp_path: Path, inspecting: bool
) -> None:
    """The store's file replaced by another store under an open Memory (or an inspecting one):
    a read raises StorageError("unavailable") rather than answer from the old file or mix the
    two."""
    path = tmp_path / "m.db"
    async with mnemo.Memory(path, embedder=mnemo.HashEmbedder()) as mem:
        await mem.open_repo("alpha")
    async with mnemo.Memory(path, embedder=mnemo.HashEmbedder(), inspect=inspecting) as reader:
        assert await reader.list_repos() == ["alpha"]
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(f"{path}{suffix}")
        async with mnemo.Memory(path, embedder=mnemo.HashEmbedder()) as other:
            await other.open_repo("beta")
        reads = [reader.list_repos, reader.list_sessions, reader.list_threads,
                 lambda: reader.search_messages("anything"),
                 lambda: reader.recall("alpha", "anything")]
        for read in reads:
            with pytest.raises(mnemo.StorageError) as refused:
                await read()
            assert refused.value.reason == "unavailable"
            assert "removed or replaced" in str(refused.value)


async def test_a_removed_store_in_a_folder_named_busy_is_unavailable(tmp_path: Path) -> None:
    """A store removed under an open Memory is "unavailable" (for good), not "busy" (to try
    again) because its path holds the word."""
    path = tmp_path / "busybox" / "m.db"
    path.parent.mkdir()
    async with mnemo.Memory(path, embedder=mnemo.HashEmbedder()) as mem:
        await mem.open_repo(REPO)
        shutil.rmtree(path.parent)
        with pytest.raises(mnemo.StorageError) as refused:
            await mem.list_repos()
        assert refused.value.reason == "unavailable"


@pytest.mark.parametrize("kind", ["no folder", "not a database"])
async def test_a_file_that_cannot_be_opened_is_named(tmp_path: Path, kind: str) -> None:
    """A store in a folder that does not exist ("unavailable"), or a file that is no database
    ("corrupt"), is a StorageError naming the path (SQLite's own message names no file)."""
    path = tmp_path / "no such folder" / "m.db"
    if kind == "not a database":
        path = tmp_path / "notes.db"
        path.write_bytes(b"plain notes, not a database\n" * 200)
    with pytest.raises(mnemo.StorageError) as refused:
        async with mnemo.Memory(path, embedder=mnemo.HashEmbedder()):
            pass
    assert refused.value.reason == ("unavailable" if kind == "no folder" else "corrupt")
    assert str(path) in str(refused.value)
    assert not (tmp_path / "no such folder").exists()
