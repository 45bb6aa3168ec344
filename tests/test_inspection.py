"""A `Memory` opened for inspection (`inspect=True`, as the command line's reads, the web app
and an MCP server's read tools open it) does no work: it resumes and takes over nothing,
records no repo's settings or models, counts no access unless asked, and refuses what would
start work (the API contract, "Inspection never works")."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import psycopg
import pytest

import mnemo
from mnemo import State
from mnemo.mcp.server import open_tools
from mnemo.ui import open_view
from tests.fakes import EventLog, FakeEmbedder, FakeLLM, leave_extracting

REPO = "r"
# The backends of a test that makes its own store (the PostgreSQL one needs the server).
BOTH = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
# Built without touching the network; any call to it fails at once (nothing listens on 9).
DEAD = "openai-compatible:dead@http://127.0.0.1:9/v1"


async def test_an_inspecting_memory_takes_no_extraction_over(store: str) -> None:
    """An inspecting Memory with the extraction's own model reads the session, opens the
    repo and recalls, and never extracts; a working Memory with that model then does at
    once (the work was there to take)."""
    llm = FakeLLM()
    sid = await leave_extracting(store, llm, repo=REPO)
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), inspect=True) as mem:
        assert await mem.session_state(sid) is State.EXTRACTING
        assert await mem.session_context(sid) is not None
        assert [(s.id, s.state) for s in await mem.list_sessions()] == [(sid, State.EXTRACTING)]
        await mem.open_repo(REPO)
        await mem.recall(REPO, "kitchen")
        await anyio.wait_all_tasks_blocked()
        assert await mem.session_state(sid) is State.EXTRACTING
    assert llm.tasks() == []

    events = EventLog()
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events) as mem:
        assert await events.wait_state(mem, sid, State.READY) is State.READY
    assert "semantic" in llm.tasks()


async def test_an_inspecting_memory_refuses_what_would_start_work(store: str) -> None:
    """Starting or driving a session, an ingest and the creation of a repo are refused with
    StorageError("read_only"), and leave nothing behind."""
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("explore", repo=REPO)
    trajectory = mnemo.Trajectory("goal", [mnemo.Step("walk north", "go north")])
    async with mnemo.Memory(store, embedder=FakeEmbedder(), inspect=True) as mem:
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: mem.open_repo("new"),
            lambda: mem.start_session("explore", repo=REPO),
            lambda: mem.append(sid, "walk north", "go north"),
            lambda: mem.append_async(sid, "walk north", "go north"),
            lambda: mem.close(sid),
            lambda: mem.close_async(sid),
            lambda: mem.close_and_commit(sid),
            lambda: mem.commit(sid),
            lambda: mem.discard(sid),
            lambda: mem.start_episode(sid, "again"),
            lambda: mem.end_session(sid),
            lambda: mem.ingest(REPO, trajectory, source_id="s"),
        ]
        for call in calls:
            with pytest.raises(mnemo.StorageError) as caught:
                await call()
            assert caught.value.reason == "read_only"
        assert await mem.list_repos() == [REPO]
        assert [(s.id, s.steps) for s in await mem.list_sessions()] == [(sid, 0)]
        assert await mem.get_nodes_by_type(REPO, list(mnemo.NodeType)) == []


async def test_an_inspecting_recall_counts_no_access_unless_asked(store: str) -> None:
    """An inspecting Memory's recall leaves the access counts alone; with reinforce=True it
    counts them as an agent's recall does."""
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, "walk north through the garden", "go north")
        await mem.close_and_commit(sid)
    async with mnemo.Memory(store, embedder=FakeEmbedder(), inspect=True) as mem:
        looked = await mem.recall(REPO, "garden")
        ids = [m.node.id for m in looked.memories]
        assert ids
        stats = await mem._graph.access_stats(REPO, ids)
        assert all(count == 0 for count, _ in stats.values())
        await mem.recall(REPO, "garden", reinforce=True)
        stats = await mem._graph.access_stats(REPO, ids)
        assert all(count == 1 for count, _ in stats.values())


async def _recorded_model_serves_the_next_ingest(store: str) -> None:
    """A working Memory opened without models ingests through the repo's recorded ones: the
    offline LLM, unless a read recorded the dead model (then the ingest fails); the repo's
    config is still the default."""
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        assert mem._repos.get(REPO).config == mnemo.Config()
        trajectory = mnemo.Trajectory("Tune postgres", [mnemo.Step("pgbouncer pools", "add")])
        receipt = await mem.ingest(REPO, trajectory, source_id="after")
        assert receipt.created


async def _repo_of_the_offline_model(store: str) -> None:
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        trajectory = mnemo.Trajectory("Deploy", [mnemo.Step("gunicorn binds 8000", "reload")])
        await mem.ingest(REPO, trajectory, source_id="before")


async def test_a_model_given_to_an_inspecting_memory_is_not_recorded(store: str) -> None:
    """A Memory opened for inspection with another model (and another config) opens the repo
    and recalls with them; the repo keeps its own, and the next ingest runs on them."""
    await _repo_of_the_offline_model(store)
    llm = mnemo.llm_from_uri(DEAD)
    other = mnemo.Config(trajectory_threshold=0.5)
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), inspect=True) as mem:
        await mem.open_repo(REPO, llm=llm, config=other)
        await mem.recall(REPO, "gunicorn")
    await _recorded_model_serves_the_next_ingest(store)


async def test_an_mcp_servers_reads_record_no_model(store: str, tmp_path: Path) -> None:
    """The MCP server's tools (`mnemo mcp --llm ...`) recall and read with the model they were
    given, and leave the repo's recorded one; the next ingest runs on the recorded one.
    Before, its first recall opened the repo through a working Memory, which recorded the
    server's model: the next ingest made no call to the repo's own."""
    await _repo_of_the_offline_model(store)
    async with open_tools(
        store, llm=mnemo.llm_from_uri(DEAD), embedder=FakeEmbedder(), memory_dir=tmp_path
    ) as tools:
        assert "memories" in await tools.recall(REPO, "gunicorn")
        assert json.loads(await tools.list_repos())["repos"] == [REPO]
    await _recorded_model_serves_the_next_ingest(store)


async def test_an_mcp_servers_edits_call_no_model_and_record_none(
    store: str, tmp_path: Path
) -> None:
    """The MCP server's correct and forget run on its inspecting Memory: with a model that
    fails every call, a fact is corrected and a source forgotten, and the repo keeps its
    recorded model for the next ingest."""
    await _repo_of_the_offline_model(store)
    step = mnemo.Step("The blog's gunicorn worker binds port 8000 on the web host.", "reload")
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.ingest(REPO, mnemo.Trajectory("Deploy", [step]), source_id="port")
        (fact, *_) = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
    async with open_tools(
        store, llm=mnemo.llm_from_uri(DEAD), embedder=FakeEmbedder(), memory_dir=tmp_path
    ) as tools:
        assert "commit_id" in await tools.correct(REPO, fact.id, "gunicorn binds port 8001")
        assert '"forgotten": 0' not in await tools.forget(REPO, source_id="port")
    await _recorded_model_serves_the_next_ingest(store)


async def test_the_web_apps_reads_record_no_model(store: str) -> None:
    """The web app (`mnemo ui --llm ...`, with or without --allow-writes) reads and recalls
    with the model it was given, and leaves the repo's recorded one."""
    await _repo_of_the_offline_model(store)
    for allow_writes in (False, True):
        async with open_view(
            store, llm=mnemo.llm_from_uri(DEAD), embedder=FakeEmbedder(),
            allow_writes=allow_writes,
        ) as view:
            assert await view.memory.list_repos() == [REPO]
            assert (await view.recall(REPO, "gunicorn", 5, None)).memories
    await _recorded_model_serves_the_next_ingest(store)


async def test_the_mcp_server_opens_a_working_memory_only_for_session_tools(
    store: str, tmp_path: Path
) -> None:
    """Reads go through the inspecting Memory; the first session tool opens the Memory that
    works, which runs the session to its commit, and the reads then recall what it made."""
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
    async with open_tools(store, embedder=FakeEmbedder(), memory_dir=tmp_path) as tools:
        assert '"memories": []' in await tools.recall(REPO, "garden")
        sid = json.loads(await tools.start_session("explore", REPO))["session_id"]
        await tools.append(sid, "walk north through the garden", "go north")
        assert '"node_count"' in await tools.close_and_commit(sid)
        assert "garden" in await tools.recall(REPO, "garden")


def _run(store: str, *statements: str) -> list[tuple[object, ...]]:
    """Runs the statements on the store, committed; the last one's rows."""
    if store.startswith("postgresql"):
        with psycopg.connect(store, autocommit=True) as pg:
            cursors = [pg.execute(statement) for statement in statements]
            return cursors[-1].fetchall() if cursors[-1].description else []
    with contextlib.closing(sqlite3.connect(store, isolation_level=None)) as conn:
        return [conn.execute(statement).fetchall() for statement in statements][-1]


async def test_a_look_never_upgrades_a_store_others_still_run(store: str) -> None:
    """A store a migration behind this mnemo (its agents run the older one) is refused by an
    inspecting Memory, left as it was (an upgrade would lock the older agents out); a
    working Memory upgrades it, and then the look goes through."""
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
    ledger = ("mnemo_migrations" if store.startswith("postgresql") else "_sqlite_migrations")
    _run(store, f"DELETE FROM {ledger} WHERE name LIKE '%scope_digests'")
    before = _run(store, f"SELECT name FROM {ledger} ORDER BY name")
    with pytest.raises(mnemo.StorageError) as refused:
        async with mnemo.Memory(store, embedder=FakeEmbedder(), inspect=True):
            pass
    assert refused.value.reason == "read_only"
    assert "scope_digests not applied" in str(refused.value)
    assert _run(store, f"SELECT name FROM {ledger} ORDER BY name") == before
    async with mnemo.Memory(store, embedder=FakeEmbedder()):
        pass
    async with mnemo.Memory(store, embedder=FakeEmbedder(), inspect=True) as mem:
        assert await mem.list_repos() == [REPO]


def _files(folder: Path) -> dict[str, bytes]:
    """The folder's files and their bytes; SQLite's shared memory (-shm) by name only."""
    return {p.name: b"" if p.name.endswith("-shm") else p.read_bytes()
            for p in folder.iterdir() if p.is_file()}


async def test_a_look_writes_nothing_to_a_sqlite_file(tmp_path: Path) -> None:
    """An inspecting Memory leaves a SQLite store's bytes as they were: it folds no other
    process's WAL into the file when it closes (which waited out the busy timeout while a
    writer held the lock), and keeps a new boot's clock anchor to itself, forgetting no
    holder."""
    path = str(tmp_path / "memory.db")
    async with mnemo.Memory(path, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("UPDATE store_clock SET boot = 'another boot'")
        writer.execute("INSERT INTO holders VALUES ('h', 'host', 1, 'then', 'then')")
        files = _files(tmp_path)
        assert len(files["memory.db-wal"]) > 0
        async with mnemo.Memory(path, embedder=FakeEmbedder(), inspect=True) as mem:
            assert await mem.list_repos() == [REPO]
        assert _files(tmp_path) == files
        assert writer.execute("SELECT boot FROM store_clock").fetchall() == [("another boot",)]
        assert writer.execute("SELECT id FROM holders").fetchall() == [("h",)]
    finally:
        writer.close()


@pytest.mark.parametrize("backend", BOTH)
async def test_a_look_at_a_place_holding_no_store_makes_none(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """An inspecting Memory where no store is (a missing file, an empty database) is refused
    and leaves nothing there: no file, no table, no extension (it made a whole store, so a
    read command pointed at a mistyped database gave it mnemo's tables)."""
    where = (str(tmp_path / "missing.db") if backend == "sqlite"
             else str(request.getfixturevalue("pg_empty_url")))
    with pytest.raises(mnemo.StorageError):
        async with mnemo.Memory(where, inspect=True):
            pass
    if backend == "sqlite":
        assert not (tmp_path / "missing.db").exists()
        return
    with psycopg.connect(where) as conn:
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        extensions = conn.execute("SELECT extname FROM pg_extension ORDER BY extname")
        assert (tables.fetchone(), extensions.fetchall()) == ((0,), [("plpgsql",)])


async def test_a_look_needs_no_write_on_postgresql(pg_url: str) -> None:
    """A store opened for a look over a connection that may not write (a standby, a role that
    may only SELECT): repos and a recall are read (it ran CREATE TABLE and failed)."""
    async with mnemo.Memory(pg_url, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        await mem.ingest(REPO, mnemo.Trajectory("note the port", [mnemo.Step(
            "The proxy listens on port 8443.", "Note it.")]), source_id="doc")
    options = "options=-c%20default_transaction_read_only%3Don"
    read_only = f"{pg_url}{'&' if '?' in pg_url else '?'}{options}"
    async with mnemo.Memory(read_only, embedder=FakeEmbedder(), inspect=True) as look:
        assert await look.list_repos() == [REPO]
        found = await look.recall(REPO, "which port does the proxy use", reinforce=False)
        assert any("8443" in m.node.text for m in found.memories)


@pytest.mark.parametrize("backend", BOTH)
async def test_an_mcp_server_starts_where_no_store_is_yet_and_makes_it(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The agent's MCP server started before any store (README: "created if missing"): its
    working Memory makes the store, and its reads and session tools work (the reader, opened
    first, was refused, and the server did not start)."""
    where = (str(tmp_path / "agent.db") if backend == "sqlite"
             else str(request.getfixturevalue("pg_empty_url")))
    async with open_tools(where, embedder=FakeEmbedder(), memory_dir=tmp_path / "files") as tools:
        sid = json.loads(await tools.start_session("explore the house", REPO))["session_id"]
        assert sid.startswith("session_")
        assert REPO in await tools.list_repos()
