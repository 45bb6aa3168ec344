"""PostgreSQL: a thread's writers take turns on its row even while it is being created or
deleted. Regressions: a purge or clear of a thread whose first save was
in flight locked nothing (no row yet), so a save committed between their statements left
messages without a thread, or a count of 0 beside them; a save waiting on a purge's lock found
the row gone and raised a bare AssertionError. Each interleaving is forced: another connection
plays the other writer, and the store's statements wait where the race fell."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import psycopg
import pytest

import mnemo
from mnemo.conversation.drafts import draft
from mnemo.storage import thread_rows
from mnemo.storage.postgres.connection import Postgres
from mnemo.storage.postgres.store import PgThreads, message_row
from mnemo.storage.thread_rows import MESSAGE_COLUMNS
from tests.pg import until_a_lock_wait
from tests.storage.postgres.test_threads import EPOCH, drafts, save


async def first_save_in_flight(conn: psycopg.AsyncConnection[Any], thread: str) -> None:
    """What a first save writes, not committed: the thread's row and one message."""
    await conn.execute(
        "INSERT INTO threads(id, next_seq, history_len, boundary_seq, created_at)"
        " VALUES (%s, 1, 1, 0, %s)", (thread, EPOCH))
    one = draft({"role": "user", "content": "hello there"}, 0)
    await conn.execute(
        f"INSERT INTO messages({MESSAGE_COLUMNS})"
        f" VALUES ({', '.join(['%s'] * len(MESSAGE_COLUMNS.split(',')))})",
        message_row(f"msg_{uuid.uuid4().hex}", thread, 0, one, EPOCH))


async def purge_held(conn: psycopg.AsyncConnection[Any], thread: str) -> None:
    """Ends what a purge holding the thread's row does: its messages and row deleted,
    committed."""
    await conn.execute("DELETE FROM messages WHERE thread_id = %s", (thread,))
    await conn.execute("DELETE FROM threads WHERE id = %s", (thread,))
    await conn.commit()


async def first_of(*waits: Any) -> None:
    """Returns once any of the waits has returned."""
    async with anyio.create_task_group() as group:
        for wait in waits:
            async def run(wait: Any = wait) -> None:
                await wait()
                group.cancel_scope.cancel()
            group.start_soon(run)


@pytest.mark.parametrize("erase", ["purge", "clear"])
async def test_an_erasure_of_a_thread_being_created_takes_its_turn(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, erase: str
) -> None:
    """The first save commits while a purge or clear runs: the erasure either waits for it on
    the thread's key (the fix) or, had it locked nothing, the save lands between its delete
    of the messages and its write of the thread's row. Either way the thread's row and its
    messages must agree afterwards."""
    thread = f"t-{uuid.uuid4().hex}"
    deleted, committed = anyio.Event(), anyio.Event()
    delete_rows = thread_rows.delete_thread_rows

    async def delete_then_wait(conn: Any, thread_id: str) -> tuple[int, int]:
        gone = await delete_rows(conn, thread_id)
        deleted.set()
        await committed.wait()
        return gone

    monkeypatch.setattr(thread_rows, "delete_thread_rows", delete_then_wait)
    async with Postgres(pg_url) as pg, await psycopg.AsyncConnection.connect(pg_url) as other:
        threads = PgThreads(pg)
        await first_save_in_flight(other, thread)
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(getattr(threads, erase), thread)
                await first_of(deleted.wait, lambda: until_a_lock_wait(pg_url))
                await other.commit()
                committed.set()
        state = await threads.state(thread)
        messages = await threads.raw(thread)
    assert (state.history_len if state else 0) == len(messages)
    assert messages == []  # the erasure came second


async def test_a_save_waiting_on_a_purge_that_deletes_the_row_is_a_conflict(
    pg_url: str,
) -> None:
    """A save waits on the thread's row, which a purge holds and then deletes: the save makes
    the row again and refuses its stale expected length with ConflictError (the manager then
    reads the length again), where it raised a bare AssertionError."""
    thread = f"t-{uuid.uuid4().hex}"
    async with Postgres(pg_url) as pg, await psycopg.AsyncConnection.connect(pg_url) as other:
        threads = PgThreads(pg)
        await save(threads, thread, drafts("first"))
        await other.execute("SELECT 1 FROM threads WHERE id = %s FOR UPDATE", (thread,))
        failures: list[BaseException] = []

        async def append() -> None:
            try:
                await threads.append(thread, drafts("second"), expected_len=1,
                                     recorded_at=EPOCH)
            except Exception as exc:
                failures.append(exc)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(append)
                await until_a_lock_wait(pg_url)
                await purge_held(other, thread)
        assert [type(f) for f in failures] == [mnemo.ConflictError]
        await save(threads, thread, drafts("again"))
        assert [m.seq for m in await threads.raw(thread)] == [0]


async def test_a_save_racing_a_purge_through_the_manager_starts_the_thread_again(
    pg_url: str,
) -> None:
    """Through `save`: a purge that deletes the row while the save waits leaves the save to
    store the whole history as a new thread from seq 0."""
    thread = f"t-{uuid.uuid4().hex}"
    history = [{"role": "user", "content": f"message {i}"} for i in range(3)]
    async with mnemo.Memory(pg_url, embedder=mnemo.HashEmbedder(8)) as mem:
        manager = mem.conversation()
        await manager.save(thread, history[:2])
        async with await psycopg.AsyncConnection.connect(pg_url) as other:
            await other.execute("SELECT 1 FROM threads WHERE id = %s FOR UPDATE", (thread,))
            with anyio.fail_after(20):
                async with anyio.create_task_group() as group:
                    group.start_soon(manager.save, thread, history)
                    await until_a_lock_wait(pg_url)
                    await purge_held(other, thread)
        raw = await manager.raw(thread)
    assert [(m.seq, m.content) for m in raw] == [(i, f"message {i}") for i in range(3)]
