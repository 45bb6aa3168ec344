"""Shared fixtures: the store on each backend, the fakes, a `Memory` on them with repo "r", and
sessions in a given state.

`store` is where a test's `Memory` keeps everything, once per backend: a SQLite file, and a
fresh database on the session's PostgreSQL server (tests/pg.py). Every test that stores
something through `Memory` takes it (or `mem`, which does), so the whole suite runs on both. A
test of one backend's own mechanics says so: it opens a SQLite file or a `pg_url` directly, and
its docstring or module says why.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing.process
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import pytest
from hypothesis import settings

import mnemo
from mnemo import State
from tests.backends import BACKENDS
from tests.fakes import EventLog, FakeEmbedder, FakeLLM
from tests.pg import (
    Reused,
    pg_clones,
    pg_empty_url,
    pg_own_url,
    pg_reused,
    pg_server,
    pg_spare,
    pg_template,
    pg_url,
)

__all__ = [
    "pg_clones", "pg_empty_url", "pg_own_url", "pg_reused", "pg_server", "pg_spare", "pg_template",
    "pg_url",
]

REPO = "r"

# Tests do not time things: hypothesis's per-example deadline (200 ms) failed examples that
# open a store or an index on a loaded machine, which says nothing about the behaviour.
settings.register_profile("mnemo", deadline=None)
settings.load_profile("mnemo")
# scripts/check's fast loop (`--hypothesis-profile=quick`): a fifth of the examples, which
# scripts/test runs in full.
settings.register_profile("quick", settings.get_profile("mnemo"), max_examples=20)

Enter = Callable[[State], Awaitable[str]]


_SERVER_FIXTURES = frozenset({"pg_server", "pg_template", "pg_clones", "pg_reused", "pg_spare",
                              "pg_url", "pg_own_url", "pg_empty_url"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks `postgres` every test that needs the server (by its fixtures, or its folder), so
    that `-m "not postgres"` never starts one. Puts the modules holding a `slow` test first
    (each module's tests together, in their order): the long tests start early, and a parallel
    run ends on short tests the workers share, not on one long test while a core idles."""
    for item in items:
        needs = _SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if needs or "storage/postgres/" in item.nodeid:
            item.add_marker(pytest.mark.postgres)
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A test that is not marked `slow` may not start a process (its fixtures may: the
    PostgreSQL server starts in one): the unit layer `scripts/check` runs stays free of them."""
    if item.get_closest_marker("slow") is not None:
        return (yield)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{item.nodeid} starts a process: mark it slow")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", refuse)
        patch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
        return (yield)


@pytest.fixture(scope="session", autouse=True)
def lexical_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """PostgreSQL stores' lexical indexes go to a temporary folder, not the user's cache."""
    folder = tmp_path_factory.mktemp("lexical")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MNEMO_LEXICAL_DIR", str(folder))
        yield folder


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a test's Memory keeps everything: a SQLite file with the schema applied (a copy
    of `sqlite_template`), or a new PostgreSQL database with the schema applied (dropped after
    the test)."""
    if request.param == "sqlite":
        path = tmp_path / "memory.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return str(path)
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty SQLite store with every migration applied, made once per worker: a test's
    store starts as a copy of it, as a PostgreSQL one starts as a copy of the template
    database (a new file's migrations take 20 ms of the 26 a Memory's first open costs). The
    migrations themselves are tested on new files (tests/storage)."""
    path = tmp_path_factory.mktemp("template") / "memory.db"

    async def make() -> None:
        async with mnemo.Memory(str(path)):
            pass

    with concurrent.futures.ThreadPoolExecutor(1) as thread:  # outside any test's event loop
        thread.submit(anyio.run, make).result()
    return path


@pytest.fixture(params=BACKENDS)
def fresh_stores(request: pytest.FixtureRequest) -> Callable[[], str]:
    """A factory of empty stores of one backend, for tests that need one per hypothesis
    example: `":memory:"` databases, or this worker's spare PostgreSQL database (`pg_spare`),
    emptied by each call. One at a time: a call empties the store the previous one gave."""
    if request.param == "sqlite":
        return lambda: ":memory:"
    spare: Reused = request.getfixturevalue("pg_spare")

    def make() -> str:
        spare.empty()
        return spare.url

    return make


@pytest.fixture
def llm() -> FakeLLM:
    return FakeLLM()


@pytest.fixture
def embedder() -> FakeEmbedder:
    return FakeEmbedder()


@pytest.fixture
def events() -> EventLog:
    return EventLog()


async def _memory(
    store: str,
    llm: FakeLLM,
    embedder: FakeEmbedder,
    events: EventLog,
    config: mnemo.Config | None,
) -> AsyncIterator[mnemo.Memory]:
    # pytest-asyncio sets a fixture up and tears it down in two different tasks: entering the
    # Memory here and leaving it in the teardown is itself a test that Memory allows that.
    async with mnemo.Memory(store, llm=llm, embedder=embedder, on_event=events) as m:
        await m.open_repo(REPO, config=config)
        try:
            yield m
        finally:
            # A test may end with a call still held; let it go so closing does not wait on it.
            llm.release_all()


@pytest.fixture
async def mem(
    store: str, llm: FakeLLM, embedder: FakeEmbedder, events: EventLog
) -> AsyncIterator[mnemo.Memory]:
    async for m in _memory(store, llm, embedder, events, None):
        yield m


@pytest.fixture
async def auto_mem(
    store: str, llm: FakeLLM, embedder: FakeEmbedder, events: EventLog
) -> AsyncIterator[mnemo.Memory]:
    async for m in _memory(store, llm, embedder, events, mnemo.Config(auto_commit=True)):
        yield m


@pytest.fixture
def enter(mem: mnemo.Memory, llm: FakeLLM, events: EventLog) -> Enter:
    """A factory: `await enter(state)` starts a session in repo "r" and drives it to `state`.

    EXTRACTING holds the "semantic" task (release it with `llm.holds["semantic"].release()`);
    FAILED is reached through a failing "semantic" task, which is healthy again afterwards.
    """

    async def to(state: State) -> str:
        sid = await mem.start_session("explore the house", repo=REPO)
        if state is State.COLLECTING:
            return sid
        await mem.append(sid, "walk north", "go north")
        if state is State.EXTRACTING:
            held = llm.hold("semantic")
            await mem.close(sid)
            with anyio.fail_after(5):
                await held.started.wait()
            return sid
        if state is State.FAILED:
            llm.fail_tasks.add("semantic")
            await mem.close(sid)
            landed = await events.wait_state(mem, sid, State.FAILED, State.READY)
            assert landed is State.FAILED
            llm.fail_tasks.discard("semantic")
            return sid
        await mem.close(sid)
        landed = await events.wait_state(mem, sid, State.READY, State.FAILED)
        assert landed is State.READY
        if state is State.READY:
            return sid
        assert state is State.IDLE
        await mem.commit(sid)
        return sid

    return to
