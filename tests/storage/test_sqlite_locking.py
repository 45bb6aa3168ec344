"""SQLite under another writer: waits off the event loop, `StorageError("busy")`
after `Config.busy_timeout`, nothing half-written, and new files opened by many processes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import mnemo
from mnemo.graph.model import Changeset, NodeType
from mnemo.storage.sqlite.graph import SqliteGraph
from tests.backends import open_stores
from tests.fakes import EventLog, FakeEmbedder, FakeLLM
from tests.graph._support import DIM, draft, policy
from tests.loop import ticking

REPO = "r"


@contextmanager
def write_lock_held(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection (a second process, the CLI) holding the file's write lock."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    finally:
        conn.execute("ROLLBACK")
        conn.close()


@pytest.fixture
def events() -> EventLog:
    return EventLog()


@pytest.fixture
async def mem(tmp_path: Path, events: EventLog) -> AsyncIterator[mnemo.Memory]:
    config = mnemo.Config(busy_timeout=0.6)
    async with mnemo.Memory(
        tmp_path / "m.db", llm=FakeLLM(), embedder=FakeEmbedder(), config=config, on_event=events
    ) as m:
        await m.open_repo(REPO)
        yield m


def step_count(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM steps").fetchone()[0])


@pytest.mark.slow
async def test_a_write_that_waits_for_another_writer_does_not_block_the_loop(
    mem: mnemo.Memory, tmp_path: Path
) -> None:
    """While another connection holds the lock, an append waits off the loop (5 ms ticks go on),
    then raises StorageError("busy") with the driver error as cause, and stores nothing."""
    path = tmp_path / "m.db"
    sid = await mem.start_session("explore", repo=REPO)
    async with ticking() as ticker:
        with write_lock_held(path):
            with pytest.raises(mnemo.StorageError) as caught:
                await mem.append(sid, "walk north", "go north")
    assert caught.value.reason == "busy"
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    assert ticker.longest < 0.25
    assert step_count(path) == 0
    assert await mem.session_state(sid) is mnemo.State.COLLECTING
    info = await mem.append(sid, "walk north", "go north")  # the lock is gone: it works
    assert info.index == 0
    assert step_count(path) == 1


@pytest.mark.slow
async def test_a_busy_commit_stores_nothing_and_can_be_retried(
    mem: mnemo.Memory, tmp_path: Path, events: EventLog
) -> None:
    """A commit that cannot get the lock raises StorageError("busy"), leaves the session ready
    with no node written, and commits once the lock is free."""
    path = tmp_path / "m.db"
    sid = await mem.start_session("explore", repo=REPO)
    await mem.append(sid, "The kitchen is north.", "go north")
    await mem.close(sid)
    assert await events.wait_state(mem, sid, mnemo.State.READY) is mnemo.State.READY
    with write_lock_held(path), pytest.raises(mnemo.StorageError, match="busy"):
        await mem.commit(sid)
    assert await mem.session_state(sid) is mnemo.State.READY
    assert await mem.get_nodes_by_type(REPO, list(mnemo.NodeType)) == []
    receipt = await mem.commit(sid)
    assert receipt is not None
    assert receipt.node_ids
    assert await mem.session_state(sid) is mnemo.State.IDLE


async def test_reads_and_repo_calls_never_raise_a_driver_error(tmp_path: Path) -> None:
    """A store that is not a database surfaces as StorageError on open, not sqlite3.Error."""
    path = tmp_path / "not-a.db"
    path.write_bytes(b"this is not a database file at all, just text" * 100)
    with pytest.raises(mnemo.StorageError) as caught:
        async with mnemo.Memory(path, llm=FakeLLM(), embedder=FakeEmbedder()):
            pass
    assert isinstance(caught.value.__cause__, sqlite3.Error)


@pytest.mark.slow
def test_many_processes_open_the_same_new_store_at_once(tmp_path: Path) -> None:
    """Four processes opening one new file at the same moment all succeed (schema set-up is
    serialised), and each file ends with one schema and the repo; ten files in a row, since one
    race may miss the window."""
    paths = [str(tmp_path / f"new{i}.db") for i in range(10)]
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.storage.open_child", *paths],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(4)
    ]
    try:
        for _ in paths:
            for child in children:  # every child is at the line before it opens the file
                assert child.stdout is not None
                line = child.stdout.readline()
                if line != "ready\n":  # the child died: show why
                    assert child.stderr is not None
                    pytest.fail(f"a child failed: {child.stderr.read()}")
            for child in children:
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
        outcomes = [child.communicate(timeout=120) for child in children]
    finally:
        for child in children:
            child.kill()
    assert [c.returncode for c in children] == [0] * 4, [err for _, err in outcomes]
    for path in paths:
        with sqlite3.connect(path) as conn:
            names = [r[0] for r in conn.execute("SELECT name FROM _sqlite_migrations")]
            repos = [r[0] for r in conn.execute("SELECT name FROM repos")]
        assert len(names) == len(set(names)) > 0
        assert repos == ["shared"]


async def test_a_repo_lock_file_that_cannot_be_made_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write takes its repo's lock file beside the database; when that file cannot be made
    (the folder read-only, gone, or full), the write fails as `StorageError("unavailable")`
    with nothing stored, not as the OSError of the lock library."""
    async with open_stores(str(tmp_path / "m.db"), DIM) as backend:
        graph = backend.graph
        assert isinstance(graph, SqliteGraph)
        lock_of = graph._file_lock

        def unmakeable(repo: str, kind: str) -> object:
            held = lock_of(repo, kind)
            assert held is not None
            # Under a file, not a folder: no lock file can be made there.
            return type(held)(str(tmp_path / "m.db" / "repo.lock"), thread_local=False)

        monkeypatch.setattr(graph, "_file_lock", unmakeable)
        changeset = Changeset("c1", REPO, [draft("f1", NodeType.SEMANTIC, "the sky is blue")], [])
        with pytest.raises(mnemo.StorageError) as raised:
            await graph.apply(changeset, intents=policy())
        assert raised.value.reason == "unavailable"
        assert isinstance(raised.value.__cause__, OSError)
        assert await graph.get_nodes(REPO, ["f1"]) == []
