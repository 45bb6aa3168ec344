"""Both `SessionStore`s side by side: a fixture that gives each test SQLite's and then
PostgreSQL's, the side writes and raw reads each needs, and views of the rows that compare
equal when the two stores hold the same thing (times aside: each store takes its own)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mnemo.config import Config
from mnemo.episode import EpisodeLog, EpisodeRecord, StepRecord
from mnemo.graph.ports import SideWrite
from mnemo.session.ports import LiveSession, RepoRow, SessionStore
from mnemo.storage.postgres import sessions as pg_sessions
from mnemo.storage.postgres.connection import PgStatements, Postgres
from mnemo.storage.postgres.store import ServerClock
from mnemo.storage.sqlite.database import Database
from mnemo.storage.sqlite.graph import SqliteSessions

REPO = "repo"
DIM = 4


@dataclass
class Backend:
    """One store under test, with what the tests read or write beside its port."""

    name: str
    sessions: SessionStore
    database: Database | None = None
    pg: Postgres | None = None

    async def side_writes(self, writes: Sequence[SideWrite]) -> None:
        """Runs `writes` in one transaction, as a graph commit carries them."""
        if self.pg is not None:
            async with self.pg.transaction() as conn:
                await pg_sessions.PgSessions.side_writes(PgStatements(conn), writes)
            return
        assert self.database is not None
        await self.database.write(lambda sql: SqliteSessions.side_writes(sql, writes))

    async def rows(self, query: str, *params: object) -> list[tuple[Any, ...]]:
        """The rows of a read-only `query` written with `?` placeholders."""
        if self.pg is not None:
            async with self.pg.connection() as conn:
                cur = await conn.execute(query.replace("?", "%s"), params)
                return [tuple(row) for row in await cur.fetchall()]
        assert self.database is not None
        return await self.database.run(
            lambda db: [tuple(row) for row in db.conn.execute(query, params).fetchall()]
        )


@asynccontextmanager
async def open_backend(name: str, where: Path | str) -> AsyncIterator[Backend]:
    """SQLite's store in the folder `where`, or PostgreSQL's at the URL `where`."""
    if name == "sqlite":
        database = Database(Path(where) / "mnemo.db")
        await database.open()
        try:
            yield Backend(name, SqliteSessions(database, database.clock), database=database)
        finally:
            await database.close()
    else:
        async with Postgres(str(where)) as pg:
            yield Backend(name, pg_sessions.PgSessions(pg, ServerClock(pg)), pg=pg)


@pytest.fixture(params=["sqlite", "postgres"])
def backend_place(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path | str]:
    """Each backend's name in turn, and where its store lives (a folder, a database URL)."""
    # Resolved in a synchronous fixture: the PostgreSQL fixtures start their own event loop
    # on first use, which they cannot do from inside an async fixture.
    name = str(request.param)
    return name, tmp_path if name == "sqlite" else str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def backend(backend_place: tuple[str, Path | str]) -> AsyncIterator[Backend]:
    """Each store in turn, with the repo `REPO` recorded."""
    async with open_backend(*backend_place) as opened:
        await opened.sessions.save_repo(RepoRow(REPO, Config(), DIM, "hash:4"))
        yield opened


def step(step_id: str, index: int, *, reward: float | None = None,
         metadata: dict[str, Any] | None = None, trajectory: str = "t1") -> StepRecord:
    """A step whose texts and vector derive from its index."""
    return StepRecord(
        id=step_id, index=index, trajectory_id=trajectory, observation=f"obs {index}",
        action=f"act {index}", state_summary=f"state {index}", subgoal=f"goal {index}",
        subgoal_vec=np.arange(DIM, dtype=np.float32) + index, reward=reward,
        metadata=metadata,
    )


def step_view(s: StepRecord) -> tuple[object, ...]:
    return (s.id, s.index, s.trajectory_id, s.observation, s.action, s.state_summary,
            s.subgoal, np.asarray(s.subgoal_vec, dtype=np.float32).tolist(), s.reward,
            s.metadata, s.committed_in)


def episode_view(e: EpisodeRecord | None) -> tuple[object, ...] | None:
    return None if e is None else (e.id, e.goal, [step_view(s) for s in e.steps])


def live_view(live: LiveSession) -> tuple[object, ...]:
    """A live session's every field but its creation time."""
    return (live.id, live.repo, live.state, live.config, episode_view(live.episode),
            None if live.changeset is None else live.changeset.to_json(), live.model)


def log_view(log: EpisodeLog) -> tuple[object, ...]:
    """An episode log's every field but its times, and whether it closed."""
    return (log.id, log.session_id, log.goal, log.status, log.closed_at is None,
            [step_view(s) for s in log.steps])
