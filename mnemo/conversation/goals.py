"""Goals and pins: messages pinned to a thread's open goals stay visible word for word.

A message may be pinned to several goals; completing a goal deletes its pins, so a message
is released when the last goal it was pinned to completes. Pins are made only to open goals
of the message's own thread.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.conversation.log import timestamp
from mnemo.conversation.model import Goal
from mnemo.errors import NotFoundError
from mnemo.storage.sqlite.database import Database

OPEN, COMPLETED = "open", "completed"


def read_open_goals(db: SqliteUtilsDatabase, thread_id: str) -> list[Goal]:
    return [
        Goal(gid, thread_id, description, status, datetime.fromisoformat(created_at))
        for gid, description, status, created_at in db.conn.execute(
            "SELECT id, description, status, created_at FROM goals"
            " WHERE thread_id = ? AND status = ? ORDER BY created_at, id",
            (thread_id, OPEN),
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
             OPEN),
        ).rowcount
    return added


class GoalStore:
    """The goals of every thread and the pins that hang on them."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def add(self, thread_id: str, description: str, now: datetime) -> str:
        """Adds an open goal to the thread; returns its id ("goal_<hex>")."""
        goal_id = f"goal_{uuid.uuid4().hex}"

        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.execute(
                    "INSERT INTO goals(id, thread_id, description, status, created_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (goal_id, thread_id, description, OPEN, timestamp(now)),
                )

        await self._database.run(write)
        return goal_id

    async def complete(self, goal_id: str, now: datetime) -> int:
        """Marks the goal completed and releases its pins; returns how many pins went.
        Completing a completed goal does nothing.

        Raises:
            NotFoundError: no such goal.
        """

        def write(db: SqliteUtilsDatabase) -> int:
            with db.atomic():
                updated = db.conn.execute(
                    "UPDATE goals SET status = ?, completed_at = ? WHERE id = ? AND status = ?",
                    (COMPLETED, timestamp(now), goal_id, OPEN),
                ).rowcount
                if not updated:
                    known = db.conn.execute(
                        "SELECT 1 FROM goals WHERE id = ?", (goal_id,)
                    ).fetchone()
                    if known is None:
                        raise NotFoundError("goal", goal_id)
                released: int = db.conn.execute(
                    "DELETE FROM pins WHERE goal_id = ?", (goal_id,)
                ).rowcount
                return released

        return await self._database.run(write)

    async def open_goals(self, thread_id: str) -> list[Goal]:
        """The thread's open goals, oldest first."""
        return await self._database.run(lambda db: read_open_goals(db, thread_id))
