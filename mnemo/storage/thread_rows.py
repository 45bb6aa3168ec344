"""Rows of conversation memory on both backends (`threads`, `messages` (never updated),
`message_vectors`, `compactions`, `snapshots`, `goals`, `pins`) and `SqlThreads`' reads."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from mnemo.conversation.model import (
    GOAL_OPEN,
    PREAMBLE_MESSAGES,
    PREAMBLE_ROLES,
    Compaction,
    Goal,
    Message,
    MessageView,
    Snapshot,
    compacted_floor,
    covered,
    untold,
)
from mnemo.conversation.ports import Shown, ThreadState
from mnemo.conversation.search import VIEW_SNAPSHOTS
from mnemo.errors import ConflictError, NotFoundError
from mnemo.graph.scope import Metadata, Where
from mnemo.storage.row import Row
from mnemo.storage.sql import Statements, moment, number

MESSAGE_COLUMNS = "id, thread_id, seq, role, text, content, data, recorded_at, tokens, metadata"
SNAPSHOT_COLUMNS = "id, thread_id, level, start_seq, end_seq, text, created_at, covered_by"
UNCOVERED = "level = 1 AND covered_by IS NULL"


def message_from_row(row: Sequence[Any]) -> Message:
    """A `Message` from a row of `MESSAGE_COLUMNS` (data as JSON text, jsonb, or PostgreSQL's
    NUL-escaped string: `postgres.store.message_row`)."""
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
        metadata=metadata_of(metadata),
    )


def metadata_of(stored: Any) -> Metadata:
    """A message's stored metadata (JSON text, jsonb or NULL) as a dict."""
    return json.loads(stored) if isinstance(stored, str) else dict(stored or {})


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """What a search asks a backend's full-text index for: the best `pool` candidates."""

    words: Sequence[str]
    pool: int
    thread_id: str | None
    exclude_viewport_of: str | None
    shown: Shown | None
    where: Where | None


_LOCK_ATTEMPTS = 3


async def lock_row(
    sql: Statements, thread_id: str, stamp: object, lock: str
) -> tuple[ThreadState, bool]:
    """Locks the thread's row until the transaction ends, creating it at `stamp` first when
    absent (True then), so saves and purges of a thread take turns. Raises `ConflictError`
    when purges deleted the row under each of `_LOCK_ATTEMPTS` waits."""
    for _ in range(_LOCK_ATTEMPTS):
        state = await read_state(sql, thread_id, lock)
        if state is not None:
            return state, False
        created = await sql.row(
            "INSERT INTO threads(id, next_seq, history_len, boundary_seq, created_at,"
            " history_hash) VALUES (?, 0, 0, 0, ?, '') ON CONFLICT (id) DO NOTHING"
            " RETURNING id",
            (thread_id, stamp),
        )
        state = await read_state(sql, thread_id, lock)
        if state is not None:
            return state, created is not None
    raise ConflictError(f"thread {thread_id!r} was purged while waiting for it, each time")


async def read_state(sql: Statements, thread_id: str, lock: str = "") -> ThreadState | None:
    """The thread's counters; with `lock`, its row stays locked until the transaction ends."""
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


async def read_preamble(sql: Statements, thread_id: str) -> list[Message]:
    """`ThreadStore.preamble`'s read."""
    roles = ", ".join(f"'{role}'" for role in PREAMBLE_ROLES)
    end = await sql.row(f"SELECT seq FROM messages WHERE thread_id = ? AND role NOT IN ({roles})"
                        " ORDER BY seq LIMIT 1", (thread_id,))
    return await read_messages(sql, thread_id, where=" AND seq < ?",
                               params=(end[0] if end else 2**62,), limit=PREAMBLE_MESSAGES)


def stream_messages(
    sql: Statements, thread_id: str, *, from_seq: int, newest_first: bool
) -> AsyncGenerator[Row, None]:
    return sql.stream(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread_id = ? AND seq >= ?"
        f" ORDER BY seq {'DESC' if newest_first else 'ASC'}",
        (thread_id, from_seq),
    )


async def read_snapshots(
    sql: Statements, thread_id: str, where: str, order: str = "ASC", params: Sequence[Any] = (),
    limit: int | None = None,
) -> list[Snapshot]:
    """The thread's first `limit` snapshots matching `where` (SQL over the snapshot's columns,
    `params` its parameters) by level, start and the order written, each in `order`."""
    rows = await sql.rows(
        f"SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE thread_id = ? AND {where}"
        f" ORDER BY level {order}, start_seq {order}, rowid {order}"
        + (" LIMIT ?" if limit is not None else ""),
        (thread_id, *params, *([] if limit is None else [limit])),
    )
    return [Snapshot(i, t, level, s, e, text, moment(at), by)
            for i, t, level, s, e, text, at, by in rows]


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


async def delete_thread_rows(sql: Statements, thread_id: str) -> tuple[int, int]:
    """Deletes a thread's rows but its counter row (search entries too): (messages deleted,
    rows deleted in all)."""
    rows = 0
    for table in ("pins", "goals", "snapshots", "compactions", "message_vectors"):
        rows += await sql.run(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))
    messages = await sql.run("DELETE FROM messages WHERE thread_id = ?", (thread_id,))
    return messages, rows + messages


async def unsnapshot(sql: Statements, thread_id: str, seq: int) -> None:
    """Erases every snapshot (of any level) that tells the message `seq` or a later one,
    uncovers what an erased fold covered, and moves the eviction boundary back to the first
    message an erased level-1 snapshot told: those messages are shown as messages again."""
    back = min(seq, await number(
        sql, "SELECT coalesce(min(start_seq), ?) FROM snapshots WHERE thread_id = ? AND level = 1"
        " AND end_seq >= ?", seq, thread_id, seq))
    await _drop_snapshots(sql, thread_id, "end_seq >= ?", seq)
    await sql.run("UPDATE threads SET boundary_seq = ? WHERE id = ? AND boundary_seq > ?",
                  (back, thread_id, back))


async def untell(sql: Statements, thread_id: str, first: int) -> list[Snapshot]:
    """Erases what told messages before `first` (a ttl erased them): compactions and snapshots
    reaching before it, a fold's covering undone. A level-1 snapshot that also tells messages
    from `first` on goes too; returned, to be written again as a pointer to those (`untold`)."""
    straddling = await read_snapshots(
        sql, thread_id, "level = 1 AND start_seq < ? AND end_seq >= ?", params=(first, first))
    await _drop_snapshots(sql, thread_id, "start_seq < ?", first)
    await sql.run("DELETE FROM compactions WHERE thread_id = ? AND start_seq < ?",
                  (thread_id, first))
    return [Snapshot(f"snap_{uuid.uuid4().hex}", thread_id, 1, first, s.end_seq,
                     untold(first, s.end_seq), s.created_at) for s in straddling]


async def _drop_snapshots(sql: Statements, thread_id: str, where: str, seq: int) -> None:
    """Erases the thread's snapshots matching `where` (SQL whose one parameter is `seq`), and
    uncovers what an erased fold covered."""
    await sql.run("UPDATE snapshots SET covered_by = NULL WHERE thread_id = ? AND covered_by IN"
                  f" (SELECT id FROM snapshots WHERE thread_id = ? AND {where})",
                  (thread_id, thread_id, seq))
    await sql.run(f"DELETE FROM snapshots WHERE thread_id = ? AND {where}", (thread_id, seq))


async def read_compactions(sql: Statements, thread_id: str) -> list[Compaction]:
    rows = await sql.rows(
        "SELECT start_seq, end_seq, summary_text, created_at FROM compactions"
        " WHERE thread_id = ? ORDER BY start_seq",
        (thread_id,),
    )
    return [Compaction(thread_id, start, end, text, moment(created))
            for start, end, text, created in rows]


async def read_uncompacted(
    sql: Statements, thread_id: str
) -> tuple[list[Compaction], list[Message]]:
    """The thread's compactions and the messages none of them covers, oldest first."""
    compactions = await read_compactions(sql, thread_id)
    messages = await read_messages(sql, thread_id, from_seq=compacted_floor(compactions))
    return compactions, [m for m in messages if not covered(m.seq, compactions)]


async def read_recent_turns(
    sql: Statements, thread_id: str, k: int
) -> tuple[list[Compaction], list[Message]]:
    """The thread's compactions and its last `k` turns of messages no compaction covers
    (a turn starts at a user message), oldest first."""
    compactions = await read_compactions(sql, thread_id)
    picked: list[Message] = []
    turns = 0
    rows = stream_messages(sql, thread_id, from_seq=compacted_floor(compactions),
                           newest_first=True)
    async with aclosing(rows):
        async for row in rows:
            message = message_from_row(row)
            if covered(message.seq, compactions):
                continue
            picked.append(message)
            if message.starts_turn:
                turns += 1
                if turns == k:
                    break
    picked.reverse()
    return compactions, picked


async def read_view(sql: Statements, message_id: str, radius: int) -> MessageView:
    """`ThreadStore.view`'s read: the message, its neighbours and the snapshots around it."""
    row = await sql.row(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,))
    if row is None:
        raise NotFoundError("message", message_id)
    target = message_from_row(row)
    near = [
        await read_messages(sql, target.thread_id, where=f" AND seq {op} ?", order=order,
                            params=(target.seq,), limit=radius)
        if radius else []
        for op, order in (("<", "DESC"), (">", "ASC"))
    ]
    snapshots = [
        await read_snapshots(sql, target.thread_id, f"level = 1 AND start_seq {op} ?", order,
                             (target.seq,), VIEW_SNAPSHOTS)
        for op, order in (("<=", "DESC"), (">", "ASC"))
    ]
    return MessageView(
        target=target,
        messages=[*reversed(near[0]), target, *near[1]],
        snapshots_before=list(reversed(snapshots[0])),
        snapshots_after=snapshots[1],
    )
