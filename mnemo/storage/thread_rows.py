"""Rows of conversation memory, on both backends, and the statements that several of the
`storage.threads.SqlThreads` methods (and search) share.

Tables (SQLite's migration `m003_conversation`, PostgreSQL's `m004_conversation`): `threads`
(the seq counter, the caller's history length, the eviction boundary and the history's hash),
`messages` (with the backend's search index), `message_vectors`, `compactions`, `snapshots`,
`goals` and `pins`. Message rows are inserted and deleted, never updated. Times read back in
UTC (`moment`): SQLite keeps them as ISO-8601 text, PostgreSQL as `timestamptz`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Sequence
from datetime import UTC, datetime
from typing import Any

from mnemo.conversation.model import GOAL_OPEN, Goal, Message, Snapshot
from mnemo.conversation.ports import ThreadState
from mnemo.storage.row import Row
from mnemo.storage.sql import Statements

MESSAGE_COLUMNS = "id, thread_id, seq, role, text, content, data, recorded_at, tokens, metadata"
SNAPSHOT_COLUMNS = "id, thread_id, level, start_seq, end_seq, text, created_at, covered_by"


def utc(moment: datetime) -> datetime:
    """`moment` in UTC (a naive datetime is taken as UTC)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def moment(value: str | datetime) -> datetime:
    """A stored time in UTC: SQLite's ISO-8601 text, or PostgreSQL's datetime."""
    return datetime.fromisoformat(value) if isinstance(value, str) else utc(value)


def message_from_row(row: Sequence[Any]) -> Message:
    """A `Message` from a row of `MESSAGE_COLUMNS`. The data is JSON text on SQLite, a jsonb
    object on PostgreSQL, or there a string: the JSON text of the data, or of
    `[data, content, role]` when they hold NUL (`storage.postgres.conversation.message_row`)."""
    message_id, thread_id, seq, role, text, content, data, recorded_at, tokens, metadata = row
    content = text if content is None else content
    if isinstance(data, str):
        data = json.loads(data)
        if isinstance(data, list):
            data, content, role = data
    return Message(
        id=message_id,
        thread_id=thread_id,
        seq=seq,
        role=role,
        content=content,
        data=data,
        recorded_at=moment(recorded_at),
        tokens=tokens,
        metadata=json.loads(metadata) if isinstance(metadata, str) else dict(metadata or {}),
    )


def snapshot_from_row(row: Sequence[Any]) -> Snapshot:
    sid, thread_id, level, start, end, text, created_at, covered_by = row
    return Snapshot(sid, thread_id, level, start, end, text, moment(created_at), covered_by)


async def read_state(sql: Statements, thread_id: str, lock: str = "") -> ThreadState | None:
    """The thread's counters; with `lock` (the backend's `SqlThreads.LOCK`), the thread's row
    stays locked until the transaction ends, so writers of one thread take turns."""
    row = await sql.row(
        "SELECT next_seq, history_len, boundary_seq, history_hash FROM threads WHERE id = ?"
        + lock,
        (thread_id,),
    )
    return None if row is None else ThreadState(*row)


async def read_messages(
    sql: Statements, thread_id: str, *, from_seq: int = 0, where: str = "", order: str = "ASC",
    params: Sequence[Any] = (), limit: int | None = None,
) -> list[Message]:
    """The thread's messages from `from_seq` on matching `where` (SQL after AND, with
    `params`), by seq in `order`, at most `limit`."""
    rows = await sql.rows(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread_id = ? AND seq >= ?{where}"
        f" ORDER BY seq {order}" + ("" if limit is None else " LIMIT ?"),
        (thread_id, from_seq, *params, *(() if limit is None else (limit,))),
    )
    return [message_from_row(row) for row in rows]


def stream_messages(
    sql: Statements, thread_id: str, *, from_seq: int, newest_first: bool
) -> AsyncGenerator[Row, None]:
    """The thread's messages' rows from `from_seq` on, oldest or newest first, read lazily
    (`Statements.stream`)."""
    return sql.stream(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread_id = ? AND seq >= ?"
        f" ORDER BY seq {'DESC' if newest_first else 'ASC'}",
        (thread_id, from_seq),
    )


async def read_snapshots(
    sql: Statements, thread_id: str, where: str, order: str, params: Sequence[Any] = ()
) -> list[Snapshot]:
    """The thread's snapshots matching `where` (SQL over the snapshot's columns), in `order`
    (`params`: those of both)."""
    rows = await sql.rows(
        f"SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE thread_id = ? AND {where}"
        f" ORDER BY {order}",
        (thread_id, *params),
    )
    return [snapshot_from_row(row) for row in rows]


async def read_uncovered_l1(sql: Statements, thread_id: str) -> list[Snapshot]:
    """The thread's level-1 snapshots no level-2 one covers, oldest first."""
    return await read_snapshots(sql, thread_id, "level = 1 AND covered_by IS NULL", "start_seq")


async def read_open_goals(sql: Statements, thread_id: str, byte_order: str) -> list[Goal]:
    """The thread's open goals, oldest first (ids tie-break in `byte_order`)."""
    rows = await sql.rows(
        "SELECT id, description, status, created_at FROM goals"
        f" WHERE thread_id = ? AND status = ? ORDER BY created_at, id{byte_order}",
        (thread_id, GOAL_OPEN),
    )
    return [
        Goal(gid, thread_id, description, status, moment(created_at))
        for gid, description, status, created_at in rows
    ]


async def delete_thread_rows(sql: Statements, thread_id: str) -> int:
    """Deletes everything a thread holds except its counter row; returns messages deleted.
    The search entries go with the messages (SQLite's by trigger, PostgreSQL's are a column
    of the row)."""
    for table in ("pins", "goals", "snapshots", "compactions", "message_vectors"):
        await sql.run(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))
    return await sql.run("DELETE FROM messages WHERE thread_id = ?", (thread_id,))

