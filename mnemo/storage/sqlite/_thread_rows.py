"""Rows of conversation memory in mnemo's SQLite file, and the statements that several of the
`SqliteThreads` methods (and search) share.

Tables (migration `m003_conversation`): `threads` (the seq counter, the caller's history
length and the eviction boundary), `messages` (+ the `messages_fts` index kept by triggers),
`message_vectors`, `compactions`, `snapshots`, `goals` and `pins`. Message rows are inserted
and deleted, never updated. Times are UTC ISO-8601 text (`timestamp`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.conversation.model import GOAL_OPEN, Compaction, Goal, Message, Snapshot
from mnemo.conversation.ports import ThreadState

MESSAGE_COLUMNS = "id, thread_id, seq, role, text, content, data, recorded_at, tokens, metadata"
SNAPSHOT_COLUMNS = "id, thread_id, level, start_seq, end_seq, text, created_at, covered_by"


def timestamp(moment: datetime) -> str:
    """UTC ISO-8601 text with microseconds, so that text order is time order (a naive
    datetime is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def message_from_row(row: Sequence[Any]) -> Message:
    """A `Message` from a row of `MESSAGE_COLUMNS`."""
    message_id, thread_id, seq, role, text, content, data, recorded_at, tokens, metadata = row
    return Message(
        id=message_id,
        thread_id=thread_id,
        seq=seq,
        role=role,
        content=text if content is None else content,
        data=json.loads(data),
        recorded_at=datetime.fromisoformat(recorded_at),
        tokens=tokens,
        metadata={} if metadata is None else json.loads(metadata),
    )


def compaction_from_row(thread_id: str, row: Sequence[Any]) -> Compaction:
    start, end, text, created_at = row
    return Compaction(thread_id, start, end, text, datetime.fromisoformat(created_at))


def snapshot_from_row(row: Sequence[Any]) -> Snapshot:
    sid, thread_id, level, start, end, text, created_at, covered_by = row
    return Snapshot(
        sid, thread_id, level, start, end, text, datetime.fromisoformat(created_at), covered_by
    )


def read_state(db: SqliteUtilsDatabase, thread_id: str) -> ThreadState | None:
    row = db.conn.execute(
        "SELECT next_seq, history_len, boundary_seq, history_hash FROM threads WHERE id = ?",
        (thread_id,),
    ).fetchone()
    return None if row is None else ThreadState(*row)


def read_compactions(db: SqliteUtilsDatabase, thread_id: str) -> list[Compaction]:
    return [
        compaction_from_row(thread_id, row)
        for row in db.conn.execute(
            "SELECT start_seq, end_seq, summary_text, created_at FROM compactions"
            " WHERE thread_id = ? ORDER BY start_seq",
            (thread_id,),
        )
    ]


def iter_messages(
    db: SqliteUtilsDatabase, thread_id: str, *, from_seq: int = 0, newest_first: bool = False
) -> Iterator[Message]:
    order = "DESC" if newest_first else "ASC"
    for row in db.conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE thread_id = ? AND seq >= ?"
        f" ORDER BY seq {order}",
        (thread_id, from_seq),
    ):
        yield message_from_row(row)


def read_open_goals(db: SqliteUtilsDatabase, thread_id: str) -> list[Goal]:
    return [
        Goal(gid, thread_id, description, status, datetime.fromisoformat(created_at))
        for gid, description, status, created_at in db.conn.execute(
            "SELECT id, description, status, created_at FROM goals"
            " WHERE thread_id = ? AND status = ? ORDER BY created_at, id",
            (thread_id, GOAL_OPEN),
        )
    ]


def write_pins(
    db: SqliteUtilsDatabase, thread_id: str, pins: Sequence[tuple[str, str]], now: datetime
) -> int:
    """Inserts (message_id, goal_id) pins whose message and open goal belong to the thread;
    returns how many are new. Call inside a transaction."""
    stamp = timestamp(now)
    added = 0
    for message_id, goal_id in pins:
        added += db.conn.execute(
            "INSERT OR IGNORE INTO pins(message_id, goal_id, thread_id, created_at)"
            " SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM messages WHERE id = ? AND"
            " thread_id = ?) AND EXISTS (SELECT 1 FROM goals WHERE id = ? AND thread_id = ?"
            " AND status = ?)",
            (message_id, goal_id, thread_id, stamp, message_id, thread_id, goal_id, thread_id,
             GOAL_OPEN),
        ).rowcount
    return added


def read_uncovered_l1(db: SqliteUtilsDatabase, thread_id: str) -> list[Snapshot]:
    """The thread's level-1 snapshots no level-2 one covers, oldest first."""
    return [
        snapshot_from_row(row)
        for row in db.conn.execute(
            f"SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE thread_id = ? AND level = 1"
            " AND covered_by IS NULL ORDER BY start_seq",
            (thread_id,),
        )
    ]


def insert_snapshot(db: SqliteUtilsDatabase, s: Snapshot) -> None:
    db.conn.execute(
        f"INSERT INTO snapshots({SNAPSHOT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (s.id, s.thread_id, s.level, s.start_seq, s.end_seq, s.text, timestamp(s.created_at),
         s.covered_by),
    )


def delete_thread_rows(db: SqliteUtilsDatabase, thread_id: str) -> int:
    """Deletes everything a thread holds except its counter row; returns messages deleted."""
    conn = db.conn
    for table in ("pins", "goals", "snapshots", "compactions", "message_vectors"):
        conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))
    gone: int = conn.execute("DELETE FROM messages WHERE thread_id = ?", (thread_id,)).rowcount
    return gone
