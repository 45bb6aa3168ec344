"""The snapshot store: writing an eviction's outcome and folding level-1 snapshots.

Each write is one transaction that first checks nothing moved under it (the boundary, or the
snapshots to fold), so a write computed from a stale read changes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.conversation.goals import read_open_goals, write_pins
from mnemo.conversation.log import iter_messages, read_state, timestamp
from mnemo.conversation.model import Message, Snapshot
from mnemo.conversation.viewport import FOLD_AFTER, SNAPSHOT_COLUMNS, snapshot_from_row
from mnemo.errors import ConflictError, NotFoundError


def read_zone_inputs(
    db: SqliteUtilsDatabase, thread_id: str
) -> tuple[int, list[Message], list[dict[str, str]], str]:
    """What an eviction starts from: the boundary, the messages past it, the open goals
    ({id, description}) and the newest uncovered level-1 snapshot's text ("" if none).

    Raises:
        NotFoundError: the thread was never saved.
    """
    state = read_state(db, thread_id)
    if state is None:
        raise NotFoundError("thread", thread_id)
    past = list(iter_messages(db, thread_id, from_seq=state.boundary_seq))
    goals = [{"id": g.id, "description": g.description} for g in read_open_goals(db, thread_id)]
    last = uncovered_l1(db, thread_id)
    return state.boundary_seq, past, goals, last[-1].text if last else ""


def commit_eviction(
    db: SqliteUtilsDatabase,
    thread_id: str,
    *,
    boundary_before: int,
    boundary_after: int,
    zone: tuple[int, int],
    snapshot_text: str,
    pins: Sequence[tuple[str, str]],
    now: datetime,
) -> Snapshot | None:
    """Writes the level-1 snapshot and pins and moves the boundary, in one transaction.

    Raises:
        ConflictError: the boundary moved meanwhile (or the thread is gone); nothing written.
    """
    stamp = timestamp(now)
    with db.atomic():
        state = read_state(db, thread_id)
        if state is None or state.boundary_seq != boundary_before:
            raise ConflictError(f"thread {thread_id!r} changed during eviction")
        db.conn.execute(
            "UPDATE threads SET boundary_seq = ? WHERE id = ?", (boundary_after, thread_id)
        )
        write_pins(db, thread_id, pins, now)
        if not snapshot_text.strip():
            return None
        snapshot = Snapshot(
            f"snap_{uuid.uuid4().hex}", thread_id, 1, zone[0], zone[1], snapshot_text,
            datetime.fromisoformat(stamp),
        )
        _insert_snapshot(db, snapshot)
    return snapshot


def uncovered_l1(db: SqliteUtilsDatabase, thread_id: str) -> list[Snapshot]:
    """The thread's level-1 snapshots no level-2 one covers, oldest first."""
    return [
        snapshot_from_row(row)
        for row in db.conn.execute(
            f"SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE thread_id = ? AND level = 1"
            " AND covered_by IS NULL ORDER BY start_seq",
            (thread_id,),
        )
    ]


def commit_fold(
    db: SqliteUtilsDatabase, thread_id: str, covered: Sequence[Snapshot], text: str, now: datetime
) -> Snapshot | None:
    """Writes the level-2 snapshot over `covered` and marks them covered, unless one of them
    was covered (or deleted) meanwhile; then returns None and writes nothing."""
    stamp = timestamp(now)
    level2 = Snapshot(
        f"snap_{uuid.uuid4().hex}", thread_id, 2, min(s.start_seq for s in covered),
        max(s.end_seq for s in covered), text, datetime.fromisoformat(stamp),
    )
    with db.atomic():
        marks = ",".join("?" * len(covered))
        still = db.conn.execute(
            f"SELECT count(*) FROM snapshots WHERE id IN ({marks}) AND covered_by IS NULL",
            [s.id for s in covered],
        ).fetchone()[0]
        if still != len(covered):
            return None
        _insert_snapshot(db, level2)
        db.conn.execute(
            f"UPDATE snapshots SET covered_by = ? WHERE id IN ({marks})",
            [level2.id, *[s.id for s in covered]],
        )
    return level2


def fold_inputs(snapshots: Sequence[Snapshot]) -> list[dict[str, Any]]:
    return [{"start_seq": s.start_seq, "end_seq": s.end_seq, "text": s.text} for s in snapshots]


def due_for_fold(snapshots: Sequence[Snapshot]) -> list[Snapshot]:
    """The oldest `FOLD_AFTER` uncovered level-1 snapshots, once there are that many."""
    return list(snapshots[:FOLD_AFTER]) if len(snapshots) >= FOLD_AFTER else []


def _insert_snapshot(db: SqliteUtilsDatabase, s: Snapshot) -> None:
    db.conn.execute(
        f"INSERT INTO snapshots({SNAPSHOT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (s.id, s.thread_id, s.level, s.start_seq, s.end_seq, s.text, timestamp(s.created_at),
         s.covered_by),
    )
