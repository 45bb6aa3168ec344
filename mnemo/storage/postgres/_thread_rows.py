"""Rows of conversation memory in mnemo's PostgreSQL database, and the statements that several
of the `PgThreads` methods (and search) share.

The tables are SQLite's (migration `m004_conversation`): `threads`, `messages` (whose generated
`search` column is the row's own search vector), `message_vectors`, `compactions`, `snapshots`,
`goals` and `pins`. Message rows are inserted and deleted, never updated. Times go in as aware
datetimes and come back in UTC, as SQLite's ISO text reads back.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, cast

from psycopg.types.json import Jsonb

from mnemo.conversation.model import GOAL_OPEN, Compaction, Goal, Message, Snapshot
from mnemo.conversation.ports import ThreadState
from mnemo.storage.postgres.connection import Connection, Postgres

MESSAGE_COLUMNS = "id, thread_id, seq, role, text, content, data, recorded_at, tokens, metadata"
SNAPSHOT_COLUMNS = "id, thread_id, level, start_seq, end_seq, text, created_at, covered_by"

# A bounded read (the viewport's newest messages, the last k turns) fetches this many rows at
# a time from a server-side cursor, so a long backlog is never read whole.
PAGE = 64

# The driver types a row as a tuple of objects; a row's columns are known from its statement.
Row = tuple[Any, ...]


async def fetch(conn: Connection, query: str, params: Sequence[Any] = ()) -> list[Row]:
    """Every row of one statement."""
    cur = await conn.execute(query, params)
    return cast(list[Row], await cur.fetchall())


async def fetch_one(conn: Connection, query: str, params: Sequence[Any] = ()) -> Row | None:
    """The first row of one statement (None when there is none)."""
    cur = await conn.execute(query, params)
    return cast(Row | None, await cur.fetchone())


def utc(moment: datetime) -> datetime:
    """`moment` in UTC (a naive datetime is taken as UTC, as SQLite's `timestamp` does)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


@asynccontextmanager
async def reading(pg: Postgres) -> AsyncIterator[Connection]:
    """A connection inside one read-only REPEATABLE READ transaction: every statement of the
    block sees the same snapshot, as a read "together" promises."""
    async with pg.transaction() as conn:
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield conn


def _jsonb_keeps(value: object) -> bool:
    """Whether jsonb gives `value` back equal and of the same types: it refuses NUL in
    strings, stores numbers as `numeric` (1e16 comes back as the integer 10000000000000000,
    -0.0 as 0.0) and has no NaN or infinity."""
    if isinstance(value, str):
        return "\x00" not in value
    if isinstance(value, float):
        return math.isfinite(value) and "e+" not in repr(value) and math.copysign(1, value) > 0
    if isinstance(value, dict):
        return all(_jsonb_keeps(k) and _jsonb_keeps(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_jsonb_keeps(v) for v in value)
    return True


def message_row(
    message_id: str, thread_id: str, seq: int, role: str, text: str, content: str,
    data: dict[str, Any], recorded_at: datetime, tokens: int,
    metadata: Mapping[str, object] | None = None,
) -> tuple[Any, ...]:
    """The parameters of a row of `MESSAGE_COLUMNS` for a message (see `message_from_row`).

    A message's `data` is stored as a jsonb object, except when jsonb would not give it back
    exactly, or the role or content holds NUL (which no PostgreSQL text may): then the jsonb
    is a string, the JSON text of `data`, or of `[data, content, role]` (SQLite's text, which
    keeps everything). The search text has NUL as U+FFFD: it is only searched and quoted.
    """
    nul = "\x00" in content or "\x00" in role
    stored: object = data
    if nul or not _jsonb_keeps(data):
        stored = json.dumps([data, content, role] if nul else data, sort_keys=True,
                            ensure_ascii=False)
    kept = None if nul or content == text else content
    return (message_id, thread_id, seq, role.replace("\x00", "\ufffd"),
            text.replace("\x00", "\ufffd"), kept, Jsonb(stored), recorded_at, tokens,
            Jsonb(dict(metadata)) if metadata else None)


def message_from_row(row: Sequence[Any]) -> Message:
    """A `Message` from a row of `MESSAGE_COLUMNS`."""
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
        recorded_at=utc(recorded_at),
        tokens=tokens,
        metadata=dict(metadata or {}),
    )


def snapshot_from_row(row: Sequence[Any]) -> Snapshot:
    sid, thread_id, level, start, end, text, created_at, covered_by = row
    return Snapshot(sid, thread_id, level, start, end, text, utc(created_at), covered_by)


async def read_state(conn: Connection, thread_id: str, *, lock: bool = False) -> (
    ThreadState | None
):
    """The thread's counters; with `lock`, the thread's row stays locked until the
    transaction ends, so writers of one thread take turns (SQLite's single writer)."""
    row = await fetch_one(
        conn,
        "SELECT next_seq, history_len, boundary_seq, history_hash FROM threads WHERE id = %s"
        + (" FOR UPDATE" if lock else ""),
        (thread_id,),
    )
    return None if row is None else ThreadState(*row)


async def read_compactions(conn: Connection, thread_id: str) -> list[Compaction]:
    rows = await fetch(
        conn,
        "SELECT start_seq, end_seq, summary_text, created_at FROM compactions"
        " WHERE thread_id = %s ORDER BY start_seq",
        (thread_id,),
    )
    return [
        Compaction(thread_id, start, end, text, utc(created_at))
        for start, end, text, created_at in rows
    ]


async def read_messages(conn: Connection, thread_id: str, *, from_seq: int = 0) -> list[Message]:
    cur = await conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread_id = %s AND seq >= %s"
        " ORDER BY seq",
        (thread_id, from_seq),
    )
    return [message_from_row(row) for row in await cur.fetchall()]


async def iter_messages(
    conn: Connection, thread_id: str, *, from_seq: int, newest_first: bool = True
) -> AsyncIterator[Message]:
    """The thread's messages from `from_seq` on, newest first (or oldest first), a page at a
    time (call inside a transaction: the cursor is the server's)."""
    async with conn.cursor(name="mnemo_messages") as cur:
        cur.itersize = PAGE
        await cur.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread_id = %s AND seq >= %s"
            f" ORDER BY seq {'DESC' if newest_first else 'ASC'}",
            (thread_id, from_seq),
        )
        async for row in cur:
            yield message_from_row(row)


async def read_open_goals(conn: Connection, thread_id: str) -> list[Goal]:
    # COLLATE "C": ids tie-break in byte order, as SQLite compares text.
    rows = await fetch(
        conn,
        "SELECT id, description, status, created_at FROM goals"
        ' WHERE thread_id = %s AND status = %s ORDER BY created_at, id COLLATE "C"',
        (thread_id, GOAL_OPEN),
    )
    return [
        Goal(gid, thread_id, description, status, utc(created_at))
        for gid, description, status, created_at in rows
    ]


async def write_pins(
    conn: Connection, thread_id: str, pins: Sequence[tuple[str, str]], now: datetime
) -> int:
    """Inserts (message_id, goal_id) pins whose message and open goal belong to the thread;
    returns how many are new. Call inside a transaction."""
    added = 0
    for message_id, goal_id in pins:
        cur = await conn.execute(
            "INSERT INTO pins(message_id, goal_id, thread_id, created_at)"
            " SELECT %s, %s, %s, %s WHERE EXISTS (SELECT 1 FROM messages WHERE id = %s AND"
            " thread_id = %s) AND EXISTS (SELECT 1 FROM goals WHERE id = %s AND thread_id = %s"
            " AND status = %s) ON CONFLICT DO NOTHING",
            (message_id, goal_id, thread_id, utc(now), message_id, thread_id, goal_id,
             thread_id, GOAL_OPEN),
        )
        added += max(cur.rowcount, 0)
    return added


async def read_snapshots(conn: Connection, thread_id: str, where: str, order: str) -> (
    list[Snapshot]
):
    """The thread's snapshots matching `where` (SQL over the snapshot's columns, no
    parameters), in `order`."""
    cur = await conn.execute(
        f"SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE thread_id = %s AND {where}"
        f" ORDER BY {order}",
        (thread_id,),
    )
    return [snapshot_from_row(row) for row in await cur.fetchall()]


async def read_uncovered_l1(conn: Connection, thread_id: str) -> list[Snapshot]:
    """The thread's level-1 snapshots no level-2 one covers, oldest first."""
    return await read_snapshots(conn, thread_id, "level = 1 AND covered_by IS NULL", "start_seq")


async def insert_snapshot(conn: Connection, s: Snapshot) -> None:
    await conn.execute(
        f"INSERT INTO snapshots({SNAPSHOT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
        (s.id, s.thread_id, s.level, s.start_seq, s.end_seq, s.text, utc(s.created_at),
         s.covered_by),
    )


async def delete_thread_rows(conn: Connection, thread_id: str) -> int:
    """Deletes everything a thread holds except its counter row; returns messages deleted.
    The search vector is a column of the message row: it goes with the row."""
    for table in ("pins", "goals", "snapshots", "compactions", "message_vectors"):
        await conn.execute(f"DELETE FROM {table} WHERE thread_id = %s", (thread_id,))
    cur = await conn.execute("DELETE FROM messages WHERE thread_id = %s", (thread_id,))
    return max(cur.rowcount, 0)
