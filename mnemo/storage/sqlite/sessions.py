"""`SqliteSessions`: the `SessionStore` port over SQLite (times as UTC ISO-8601 text, JSON as
text, a list parameter a JSON array read by `json_each`)."""

from __future__ import annotations

from mnemo.storage.sessions import SqlSessions
from mnemo.storage.sqlite.database import Database


class SqliteSessions(SqlSessions):
    # The host's wall clock, in milliseconds, written as `_stamp` writes a time.
    NOW = "strftime('%Y-%m-%dT%H:%M:%f000+00:00', 'now')"

    def __init__(self, database: Database) -> None:
        super().__init__(database, database.clock)

