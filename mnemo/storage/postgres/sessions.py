"""`PgSessions`: the `SessionStore` port over PostgreSQL. A session's step claims are
serialised by an advisory lock (`connection.PgDialect._lock_claims`)."""

from __future__ import annotations

from mnemo.episode import StepRecord
from mnemo.session.ports import StaleSession
from mnemo.storage.postgres.connection import PgDialect
from mnemo.storage.sessions import ANNOTATE, STEP_COLUMNS, SqlSessions
from mnemo.storage.sql import Statements

# One row of a step, typed: a NULL reward or metadata must not make its VALUES column text.
_STEP_VALUES = (
    "(?::text, ?::text, ?::text, ?::integer, ?::text, ?::text, ?::text, ?::text,"
    " ?::text, ?::bytea, ?::double precision, ?::jsonb, ?::timestamptz)"
)


class PgSessions(PgDialect, SqlSessions):
    NOW = "clock_timestamp()"

    @classmethod
    async def _save_rewards(cls, sql: Statements, rewards: dict[str, float | None],
                            committed_in: str | None = None) -> bool:
        if not rewards:
            return True
        written = await sql.run(
            "UPDATE steps SET reward = v.reward, committed_in = coalesce(?::text, committed_in)"
            " FROM unnest(?::text[], ?::float8[]) AS v(id, reward) WHERE steps.id = v.id"
            " AND (committed_in IS NULL OR committed_in = coalesce(?::text, committed_in))",
            (committed_in, list(rewards), list(rewards.values()), committed_in),
        )
        return written == len(rewards)

    async def _annotate(self, sql: Statements, session_id: str,
                        params: tuple[object, ...]) -> int | None:
        # One statement: the version moves on only when the step was written.
        row = await sql.row(
            f"WITH done AS ({ANNOTATE} RETURNING id) UPDATE sessions SET version = version + 1,"
            " updated_at = clock_timestamp() WHERE id = ? AND EXISTS (SELECT 1 FROM done)"
            " RETURNING version",
            (*params, session_id),
        )
        return None if row is None else int(row[0])

    async def add_step(self, session_id: str, episode_id: str, step: StepRecord, *,
                       version: int | None = None, holder: str | None = None) -> int:
        now = self._now()
        guard = " AND ended = false AND version = ?" if version is not None else ""
        claim = (
            ", claimed AS (INSERT INTO step_claims(step_id, session_id, holder)"
            " SELECT ?, ?, ? FROM moved)" if holder is not None else ""
        )
        # One autocommit statement: the version moves on if still collecting this episode at
        # the caller's version, and only then the step goes in (claimed by `holder`).
        statement = (
            "WITH moved AS (UPDATE sessions SET version = version + 1, updated_at = ?,"
            " active_at = ?"
            f" WHERE id = ? AND state = 'collecting' AND episode_id = ?{guard}"
            f" RETURNING version){claim}"
            f" INSERT INTO steps({STEP_COLUMNS})"
            f" SELECT v.* FROM (VALUES {_STEP_VALUES}) AS v, moved"
            " RETURNING (SELECT version FROM moved)"
        )
        params = [now, now, session_id, episode_id, *([] if version is None else [version]),
                  *([] if holder is None else [step.id, session_id, holder]),
                  *self._step_row(session_id, episode_id, step, now)]
        row = await self._driver.one(lambda sql: sql.row(statement, params))
        if row is None:
            raise StaleSession(session_id)
        return int(row[0])
