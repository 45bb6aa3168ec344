"""PostgreSQL's step claims under READ COMMITTED: a claim that waited for a commit of the same
step is not granted that step (SQLite serialises writers, so this race is PostgreSQL's own)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import psycopg

import mnemo
from mnemo.session.ports import HolderInfo
from tests.backends import open_stores, sql
from tests.fakes import FakeEmbedder, FakeLLM


async def _until_a_lock_wait(url: str) -> None:
    """Returns once a session of the database waits for a lock (its activity view is read
    until it shows one)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        with anyio.fail_after(10):
            while True:
                cur = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
                row = await cur.fetchone()
                if row is not None and row[0]:
                    return
                await anyio.sleep(0.005)


async def test_a_claim_that_waited_for_a_commit_of_the_step_is_not_granted_it(
    pg_url: str,
) -> None:
    """Holder y claimed a step and commits it (its transaction marks the step committed and
    drops the claim); holder x claims the same step meanwhile and waits on y's row. Once y's
    commit lands, x gets nothing and keeps no claim. Before, x's insert, whose snapshot
    predated y's commit, claimed the committed step: extracted twice (a review)."""
    async with mnemo.Memory(pg_url, llm=FakeLLM(), embedder=FakeEmbedder()) as mem:
        await mem.open_repo("r")
        sid = await mem.start_session("explore", repo="r")
        await mem.append(sid, "look", "act")
    now = datetime.now(UTC)
    async with open_stores(pg_url, FakeEmbedder().dim) as backend:
        co = backend.coordination
        [(step,)] = await sql(backend, "SELECT id FROM steps WHERE session_id = ?", sid)
        for name in ("x", "y"):
            await co.register(HolderInfo(name, "another-host", 1, now, now))
        cut = now - timedelta(seconds=30)
        assert await co.claim_steps(sid, [step], "y", unseen_since=cut) == {step}
        granted: list[set[str]] = []
        async with await psycopg.AsyncConnection.connect(pg_url) as commit:
            # y's commit, as `side_writes` makes it, not yet committed.
            await commit.execute("UPDATE steps SET committed_in = 'changeset_y' WHERE id = %s",
                                 (step,))
            await commit.execute("DELETE FROM step_claims WHERE step_id = %s", (step,))

            async def claim() -> None:
                granted.append(await co.claim_steps(sid, [step], "x", unseen_since=cut))

            async with anyio.create_task_group() as tg:
                tg.start_soon(claim)
                await _until_a_lock_wait(pg_url)
                assert granted == []
                await commit.commit()
        assert granted == [set()]
        assert await sql(backend, "SELECT step_id, holder FROM step_claims") == []
