"""PostgreSQL's step claims under READ COMMITTED: a claim that waited for a commit of the same
step is not granted that step (SQLite serialises writers, so this race is PostgreSQL's own)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest

import mnemo
from mnemo.graph.ports import StepsCommitted
from mnemo.session.ports import HolderInfo
from mnemo.storage.postgres import sessions as pg_sessions
from mnemo.storage.postgres.connection import PgStatements, claims_lock_key
from tests.backends import open_stores, sql
from tests.fakes import FakeEmbedder, FakeLLM
from tests.pg import until_a_lock_wait


async def test_a_claim_that_waited_for_a_commit_of_the_step_is_not_granted_it(
    pg_url: str,
) -> None:
    """Holder y claimed a step and commits it (`side_writes` marks the step committed and
    drops the claim, under the session's claims lock, in the graph's transaction); holder x
    claims the same step meanwhile and waits. Once y's commit lands, x gets nothing and keeps
    no claim. Before, x's insert, whose snapshot predated y's commit, claimed the committed
    step: extracted twice; and without the lock in `side_writes` too."""
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
        [(episode,)] = await sql(backend, "SELECT episode_id FROM steps WHERE id = ?", step)
        granted: list[set[str]] = []
        async with await psycopg.AsyncConnection.connect(pg_url) as commit:
            # y's commit of the step (the graph's transaction, its side writes made).
            await pg_sessions.PgSessions.side_writes(PgStatements(commit), [
                StepsCommitted(sid, str(episode), "changeset_y", ((step, None),), None)])

            async def claim() -> None:
                granted.append(await co.claim_steps(sid, [step], "x", unseen_since=cut))

            async with anyio.create_task_group() as tg:
                tg.start_soon(claim)
                await until_a_lock_wait(pg_url)
                assert granted == []
                await commit.commit()
        assert granted == [set()]
        assert await sql(backend, "SELECT step_id, holder FROM step_claims") == []


async def test_overlapping_claims_of_holders_that_disagree_on_a_departure_do_not_deadlock(
    pg_url: str,
) -> None:
    """Holder d claimed step b. x, which takes d for gone, is half-way through its claim of
    a and b (d's claim of b deleted, its own rows not yet inserted: its statements, on a
    connection of the test); y, which takes d for alive, claims a and b meanwhile. y waits
    for x's claim to end, then gets nothing; x gets both. Before the session's claims lock,
    y inserted a, then waited on b, while x's insert of a waited on y: a deadlock, which
    PostgreSQL breaks by failing one of them."""
    async with mnemo.Memory(pg_url, llm=FakeLLM(), embedder=FakeEmbedder()) as mem:
        await mem.open_repo("r")
        sid = await mem.start_session("explore", repo="r")
        await mem.append(sid, "look", "act")
        await mem.append(sid, "look again", "act again")
    now = datetime.now(UTC)
    async with open_stores(pg_url, FakeEmbedder().dim) as backend:
        co = backend.coordination
        a, b = [str(r[0]) for r in await sql(
            backend, "SELECT id FROM steps WHERE session_id = ? ORDER BY idx", sid)]
        for name in ("d", "x", "y"):
            await co.register(HolderInfo(name, "another-host", 1, now, now))
        cut = now - timedelta(seconds=30)
        assert await co.claim_steps(sid, [b], "d", unseen_since=cut) == {b}
        granted: list[set[str]] = []
        async with await psycopg.AsyncConnection.connect(pg_url) as x:
            await x.execute("SELECT pg_advisory_xact_lock(%s)", (claims_lock_key(sid),))
            await x.execute("DELETE FROM step_claims WHERE step_id = %s", (b,))

            async def claim() -> None:
                granted.append(await co.claim_steps(sid, [a, b], "y", unseen_since=cut))

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(claim)
                    await until_a_lock_wait(pg_url)
                    await x.execute(
                        "INSERT INTO step_claims(step_id, session_id, holder)"
                        " VALUES (%s, %s, 'x'), (%s, %s, 'x')", (a, sid, b, sid))
                    await x.commit()
        assert granted == [set()]
        assert sorted(await sql(backend, "SELECT step_id, holder FROM step_claims")) == [
            (a, "x"), (b, "x")]


async def test_an_end_racing_a_closes_commit_waits_for_it(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close's commit (`side_writes` moving the session to idle) has taken its step's row
    and the session's claims lock when the session is ended: the end waits for the commit,
    then ends the session, and neither fails. The end took the session's row, then the
    claims lock, the commit the other way round: a deadlock, which PostgreSQL broke by
    failing one of them as `StorageError("busy")`."""
    async with mnemo.Memory(pg_url, llm=FakeLLM(), embedder=FakeEmbedder()) as mem:
        await mem.open_repo("r", config=mnemo.Config(auto_commit=True))
        sid = await mem.start_session("explore", repo="r")
        await mem.append(sid, "look", "act")
    async with open_stores(pg_url, FakeEmbedder().dim) as backend:
        [(step, episode)] = await sql(
            backend, "SELECT id, episode_id FROM steps WHERE session_id = ?", sid)
        [(version,)] = await sql(backend, "SELECT version FROM sessions WHERE id = ?", sid)
        errors: list[BaseException] = []
        async with await psycopg.AsyncConnection.connect(pg_url) as commit:

            async def end() -> None:
                try:
                    await backend.sessions.end(sid)
                except mnemo.MnemoError as exc:
                    errors.append(exc)

            lock_claims = pg_sessions.PgSessions._lock_claims

            async def locked_then_end(sql: Any, session_id: str) -> None:
                await lock_claims(sql, session_id)
                if sql.conn is commit:  # the end comes now, and waits
                    tg.start_soon(end)
                    await until_a_lock_wait(pg_url)

            monkeypatch.setattr(pg_sessions.PgSessions, "_lock_claims",
                                staticmethod(locked_then_end))
            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    await pg_sessions.PgSessions.side_writes(PgStatements(commit), [StepsCommitted(
                        sid, str(episode), "changeset_c", ((step, None),), "idle", version)])
                    await commit.commit()
        assert errors == []
        assert await sql(backend, "SELECT ended, state FROM sessions WHERE id = ?", sid) == [
            (True, "idle")]
