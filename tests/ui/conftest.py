"""A small memory to look at: a committed and a live session, an ingested source, and a
thread with an eviction boundary, a snapshot and a goal. Built once per test run (offline LLM,
default embedder, as `mnemo ui` opens it) and copied for each test that may write."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest

import mnemo
from mnemo.ui.app import create_app
from mnemo.ui.source import MemorySource

REPO = "ops"
THREAD = "week/1"


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
            source_id="chat-1",
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


@pytest.fixture
async def client(memory: mnemo.Memory) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(MemorySource(memory))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://ui.test") as c:
        yield c
