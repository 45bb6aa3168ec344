"""`PgCoordination`: the `Coordination` port over PostgreSQL, for Memory objects on any hosts.
The change token is the server's next transaction id: a wake-up may be spurious, never missed."""

from __future__ import annotations

from datetime import datetime

from mnemo.config import DEFAULT_IDLE_SESSION_TIMEOUT
from mnemo.storage.coordination import SqlCoordination
from mnemo.storage.postgres.clock import ServerClock
from mnemo.storage.postgres.connection import PgDialect
from mnemo.storage.row import Row
from mnemo.storage.sql import Statements


class PgCoordination(PgDialect, SqlCoordination):
    AUTO_COMMIT = "(config->>'auto_commit')::boolean"
    # By the server's clock.
    IDLE_LEFT = (
        "extract(epoch FROM updated_at - clock_timestamp()) + coalesce("
        f"(config->>'idle_session_timeout')::float8, {DEFAULT_IDLE_SESSION_TIMEOUT})"
    )
    CHANGE_TOKEN = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"

    _clock: ServerClock

    async def sync_clock(self) -> None:
        await self._clock.sync()

    async def _end_due(self, sql: Statements, due: list[str], now: datetime) -> list[Row]:
        # A row another writer holds is left for the next sweep: it may be moving on.
        return await sql.rows(
            "UPDATE sessions SET ended = true, version = version + 1, holder = NULL,"
            " lease_until = NULL, updated_at = clock_timestamp() WHERE id IN (SELECT id"
            " FROM sessions WHERE id = ANY(?) AND NOT ended AND state = 'idle'"
            f" AND {self.IDLE_LEFT} <= 0 FOR UPDATE SKIP LOCKED) RETURNING id, repo",
            (due,),
        )
