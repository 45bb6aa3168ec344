"""`SqliteSessions`: the `SessionStore` port over SQLite (times as UTC ISO-8601 text, JSON as
text, a list parameter a JSON array read by `json_each`)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.graph.ports import SideWrite
from mnemo.storage.sessions import SqlSessions
from mnemo.storage.sql import drive
from mnemo.storage.sqlite.database import Database, SqliteStatements


class SqliteSessions(SqlSessions):
    """`SessionStore` over mnemo's SQLite file."""

    # The host's wall clock, in milliseconds, written as `_stamp` writes a time.
    NOW = "strftime('%Y-%m-%dT%H:%M:%f000+00:00', 'now')"
    ANY = " IN (SELECT value FROM json_each(?))"

    def __init__(self, database: Database) -> None:
        super().__init__(database, database.clock)


def side_writes(db: SqliteUtilsDatabase, writes: Sequence[SideWrite]) -> None:
    """`SqlSessions.side_writes` in the connection's thread, inside its transaction."""
    drive(SqliteSessions.side_writes(SqliteStatements(db.conn), writes))


def side_writes_alone(db: SqliteUtilsDatabase, writes: Sequence[SideWrite]) -> None:
    with db.atomic():
        side_writes(db, writes)
