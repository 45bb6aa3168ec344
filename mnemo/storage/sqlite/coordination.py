"""`SqliteCoordination`: the `Coordination` port over SQLite, for Memory objects sharing a
file. The change token is `PRAGMA data_version` (moves on another connection's commit, no I/O)."""

from __future__ import annotations

from datetime import datetime

from mnemo.config import DEFAULT_IDLE_SESSION_TIMEOUT
from mnemo.storage.coordination import SqlCoordination
from mnemo.storage.row import Row
from mnemo.storage.sql import Statements, marks
from mnemo.storage.sqlite.database import Database


class SqliteCoordination(SqlCoordination):
    DISTINCT = " IS NOT "
    AUTO_COMMIT = "json_extract(config, '$.auto_commit')"
    IDLE_LEFT = (
        "(julianday(updated_at) - julianday(?)) * 86400.0 + coalesce("
        f"json_extract(config, '$.idle_session_timeout'), {DEFAULT_IDLE_SESSION_TIMEOUT})"
    )
    CHANGE_TOKEN = "PRAGMA data_version"
    _driver: Database

    def _idle_params(self, now: datetime) -> tuple[object, ...]:
        return (self._stamp(now),)

    async def _end_due(self, sql: Statements, due: list[str], now: datetime) -> list[Row]:
        at = self._stamp(now)
        return await sql.rows(
            "UPDATE sessions SET ended = 1, version = version + 1, holder = NULL,"
            " lease_until = NULL, updated_at = ? WHERE ended = 0 AND state = 'idle'"
            f" AND id IN ({marks(len(due))}) AND {self.IDLE_LEFT} <= 0 RETURNING id, repo",
            (at, *due, at),
        )
