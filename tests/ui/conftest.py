"""A small memory to look at: a committed and a live session, an ingested source, and a
thread with an eviction boundary, a snapshot and a goal. Built once per test run (offline LLM,
default embedder, as `mnemo ui` opens it) and copied for each test that may write."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest
from starlette.applications import Starlette

import mnemo
from mnemo.ui.app import create_app
from mnemo.ui.source import MemorySource

REPO = "ops"
THREAD = "week/1"
# The address a local browser uses: one of the Host names the app answers by default.
BASE = "http://127.0.0.1:8765"


@dataclass(frozen=True, slots=True)
class Sample:
    db: Path
    committed_session: str
    live_session: str


async def build_sample(db: Path) -> Sample:
    """Fills `db` with every kind of thing the app shows."""
    async with mnemo.Memory(db) as mem:
        await mem.open_repo(REPO)
        done = await mem.start_session("Deploy the blog", repo=REPO)
        await mem.append(done, "nginx returns 502: gunicorn listens on port 8001.",
                         "Bind gunicorn to 127.0.0.1:8000 and reload nginx.")
        await mem.append(done, "The TLS certificate of the blog expires in 3 days.",
                         "Run certbot renew and reload nginx.")
        await mem.close_and_commit(done)
        live = await mem.start_session("Tune postgres", repo=REPO)
        await mem.append(live, "Postgres refuses connections above 100 clients.",
                         "Put pgbouncer in front of it with a pool of 20.")
        await mem.ingest(
            REPO,
            mnemo.Trajectory("Plan the Lisbon trip", [
                mnemo.Step("Dana is vegetarian and prefers quiet restaurants.", "Note it."),
            ]),
            source_id="chat-1", metadata={"user_id": "dana"},
        )
        # An instruction in the evicted part: the offline eviction pins it to the goal.
        history = [{"role": "user", "content": "Never run the orders_stage migration on a "
                    "Friday: the release train leaves on Fridays."}]
        for i in range(1, 24):
            role = "user" if i % 2 == 0 else "assistant"
            history.append({"role": role, "content": f"Message {i}: the staging database "
                            f"orders_stage needs migration step {i} before the release."})
        await mem.conversation().save(THREAD, history)
        await mem.add_goal(THREAD, "Migrate orders_stage")
        await mem.evict(THREAD, token_budget=300)
    return Sample(db, done, live)


@pytest.fixture(scope="session")
def sample_master(tmp_path_factory: pytest.TempPathFactory) -> Sample:
    db = tmp_path_factory.mktemp("ui") / "sample.db"
    return anyio.run(build_sample, db)


@pytest.fixture
def sample(sample_master: Sample, tmp_path: Path) -> Sample:
    """A copy of the sample memory, this test's own."""
    db = tmp_path / "sample.db"
    for suffix in ("", "-wal"):
        source = sample_master.db.with_name(sample_master.db.name + suffix)
        if source.exists():
            shutil.copyfile(source, db.with_name(db.name + suffix))
    return Sample(db, sample_master.committed_session, sample_master.live_session)


@pytest.fixture
async def memory(sample: Sample) -> AsyncIterator[mnemo.Memory]:
    async with mnemo.Memory(sample.db) as mem:
        yield mem


def dump(db: Path) -> list[str]:
    """Every row of the SQLite file, as SQL: equal before and after means nothing written."""
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def client_of(app: Starlette, base: str = BASE) -> httpx.AsyncClient:
    """An httpx client of the ASGI app, as a browser at `base` reaches it."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base)


@pytest.fixture
async def client(memory: mnemo.Memory) -> AsyncIterator[httpx.AsyncClient]:
    async with client_of(create_app(MemorySource(memory))) as c:
        yield c


@pytest.fixture
async def writer(memory: mnemo.Memory) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app started with --allow-writes, sending its own Origin, as the app's
    pages do."""
    app = create_app(MemorySource(memory, writes=True), allow_writes=True)
    async with client_of(app) as c:
        c.headers["origin"] = BASE
        yield c
