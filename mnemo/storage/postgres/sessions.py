"""`PgSessions`: the `SessionStore` port (`mnemo.session.ports`) over PostgreSQL, and
`side_writes`, the session and ingest side of a graph commit.

The rows and their meaning are SQLite's (`mnemo.storage.sqlite.sessions`): the same upserts,
the same orders (insertion order through the `rowid` identity where SQLite uses its rowid,
byte order of text where SQLite compares text), and what a `str` field of a row held there
(`LiveSession.created_at`: the ISO text of a UTC time) it holds here. Times are written as
aware datetimes taken in this process, as SQLite's are, so both order sessions alike.

A write of one statement runs alone in autocommit (one transaction, no BEGIN/COMMIT round
trips); every other write runs in `Postgres.transaction()`. A read of several statements runs
in one REPEATABLE READ transaction, so it sees one snapshot even while other tasks write.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from psycopg.types.json import Jsonb

from mnemo.config import Config
from mnemo.episode.model import EpisodeLog, EpisodeRecord, StepRecord
from mnemo.extraction.memo import KeptResult
from mnemo.graph.model import Changeset, vector_from_blob, vector_to_blob
from mnemo.graph.ports import SideWrite, SourceRecorded, StepsCommitted
from mnemo.ports import JSONObject
from mnemo.session.machine import State
from mnemo.session.ports import LiveSession, RepoRow, StaleSession, StepsCommittedElsewhere
from mnemo.storage.postgres.clock import ServerClock
from mnemo.storage.postgres.connection import Connection, Postgres
from mnemo.storage.postgres.coordination import drop_ended_work, lock_claims

__all__ = ["PgSessions", "side_writes"]

_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"

# One row of a step, typed: a NULL reward or metadata must not make its VALUES column text.
_STEP_VALUES = (
    "(%s::text, %s::text, %s::text, %s::integer, %s::text, %s::text, %s::text, %s::text,"
    " %s::text, %s::bytea, %s::double precision, %s::jsonb, %s::timestamptz)"
)

_STEP_COLUMNS = (
    "id, idx, trajectory_id, observation, action, state_summary, subgoal, subgoal_vec,"
    " reward, metadata, committed_in"
)


class PgSessions:
    """`SessionStore` over a PostgreSQL database (its schema applied)."""

    def __init__(self, pg: Postgres, clock: ServerClock) -> None:
        self._pg = pg
        self._clock = clock

    async def load_repos(self) -> list[RepoRow]:
        async with self._pg.connection() as conn:
            cur = await conn.execute(
                "SELECT name, config::text, dim, embedder, llm, vectors_generation FROM repos"
                ' ORDER BY created_at, name COLLATE "C"'
            )
            rows = await cur.fetchall()
        return [
            RepoRow(str(name), Config.from_json(str(config)), _int(dim), str(embedder),
                    _str_or_none(llm), _int(generation))
            for name, config, dim, embedder, llm, generation in rows
        ]

    async def save_repo(self, row: RepoRow) -> None:
        async with self._pg.connection() as conn:
            await conn.execute(
                "INSERT INTO repos(name, config, dim, embedder, llm, created_at)"
                " VALUES (%s, %s, %s, %s, %s, %s)"
                # The dimension changes only with the vectors (`Memory.reembed`); the models
                # may change (an embedder of the same dimension, another LLM) and the record
                # follows, but an embedder chosen before the vectors were made again is not
                # recorded over the one that made them.
                " ON CONFLICT (name) DO UPDATE SET config = excluded.config,"
                " embedder = CASE WHEN repos.vectors_generation = %s THEN excluded.embedder"
                " ELSE repos.embedder END, llm = excluded.llm",
                (row.name, _jsonb(row.config.to_json()), row.dim, row.embedder, row.llm,
                 self._clock.now(), row.generation),
            )

    async def load_profile(self, repo: str, model: str) -> str | None:
        async with self._pg.connection() as conn:
            cur = await conn.execute(
                "SELECT profile::text FROM server_profiles WHERE repo = %s AND model = %s",
                (repo, model),
            )
            row = await cur.fetchone()
        return None if row is None else str(row[0])

    async def save_profile(self, repo: str, model: str, profile: str) -> None:
        async with self._pg.connection() as conn:
            await conn.execute(
                "INSERT INTO server_profiles(repo, model, profile, updated_at)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (repo, model) DO UPDATE SET"
                " profile = excluded.profile, updated_at = excluded.updated_at",
                (repo, model, _jsonb(profile), self._clock.now()),
            )

    async def create_session(
        self, session_id: str, repo: str, config: Config, episode: EpisodeRecord, *,
        holder: str | None = None, lease_until: datetime | None = None,
        metadata: Mapping[str, str | int | float | bool] | None = None,
    ) -> None:
        now = self._clock.now()
        async with self._pg.transaction() as conn:
            await conn.execute(
                "INSERT INTO sessions(id, repo, state, config, episode_id, created_at,"
                " updated_at, active_at, holder, lease_until, metadata)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (session_id, repo, State.COLLECTING.value, _jsonb(config.to_json()),
                 episode.id, now, now, now, holder, lease_until,
                 Jsonb(dict(metadata)) if metadata else None),
            )
            await _insert_episode(conn, session_id, episode, now)

    async def start_episode(
        self, session_id: str, episode: EpisodeRecord, *, version: int | None = None
    ) -> int:
        now = self._clock.now()
        async with self._pg.transaction() as conn:
            moved = await bump(conn, session_id, version, state=State.COLLECTING.value)
            await conn.execute(
                "UPDATE sessions SET episode_id = %s, active_at = %s WHERE id = %s",
                (episode.id, now, session_id),
            )
            await _insert_episode(conn, session_id, episode, now)
            return moved

    async def add_step(
        self,
        session_id: str,
        episode_id: str,
        step: StepRecord,
        *,
        version: int | None = None,
        holder: str | None = None,
    ) -> int:
        now = self._clock.now()
        guard = " AND NOT ended AND version = %s" if version is not None else ""
        claim = (
            ", claimed AS (INSERT INTO step_claims(step_id, session_id, holder)"
            " SELECT %s, %s, %s FROM moved)" if holder is not None else ""
        )
        # One statement in autocommit, so one round trip (a transaction of two cost the
        # append 40 % more, BENCHMARKS.md): the session's version moves on, checked to be
        # still collecting this episode at the version the caller read, and only then the
        # new step goes in (claimed for its annotation by `holder`).
        statement = (
            "WITH moved AS (UPDATE sessions SET version = version + 1, updated_at = %s,"
            " active_at = %s"
            f" WHERE id = %s AND state = 'collecting' AND episode_id = %s{guard}"
            f" RETURNING version){claim}"
            " INSERT INTO steps(id, session_id, episode_id, idx, trajectory_id, observation,"
            " action, state_summary, subgoal, subgoal_vec, reward, metadata, recorded_at)"
            f" SELECT v.* FROM (VALUES {_STEP_VALUES}) AS v, moved"
            " RETURNING (SELECT version FROM moved)"
        )
        params: list[object] = [now, now, session_id, episode_id]
        if version is not None:
            params.append(version)
        if holder is not None:
            params.extend((step.id, session_id, holder))
        params.extend(_step_row(session_id, episode_id, step, now))
        async with self._pg.connection() as conn:
            cur = await conn.execute(statement, params)
            row = await cur.fetchone()
        if row is None:
            raise StaleSession(session_id)
        return int(str(row[0]))

    async def annotate_step(
        self,
        session_id: str,
        episode_id: str,
        step: StepRecord,
        previous: StepRecord | None,
        *,
        holder: str | None = None,
    ) -> int | None:
        async with self._pg.transaction() as conn:
            # The claims first, as an end takes them before the session's row.
            await lock_claims(conn, session_id)
            if holder is not None:
                await conn.execute(
                    "DELETE FROM step_claims WHERE step_id = %s AND holder = %s",
                    (step.id, holder),
                )
            cur = await conn.execute(
                "WITH done AS (UPDATE steps SET trajectory_id = %s, state_summary = %s,"
                " subgoal = %s, subgoal_vec = %s WHERE id = %s AND trajectory_id = ''"
                " AND EXISTS (SELECT 1 FROM sessions WHERE id = %s AND episode_id = %s"
                " AND NOT ended AND state IN ('collecting', 'extracting')) RETURNING id)"
                " UPDATE sessions SET version = version + 1, updated_at = clock_timestamp()"
                " WHERE id = %s AND EXISTS (SELECT 1 FROM done) RETURNING version",
                (step.trajectory_id, step.state_summary, step.subgoal,
                 vector_to_blob(step.subgoal_vec), step.id, session_id, episode_id,
                 session_id),
            )
            row = await cur.fetchone()
            if row is None:
                return None
            if previous is not None:
                await _save_rewards(conn, [(previous.id, previous.reward)])
            return int(str(row[0]))

    async def set_state(
        self,
        session_id: str,
        state: State,
        *,
        model: str | None = None,
        version: int | None = None,
    ) -> int:
        """Moves the session to `state`; `model` records the model its extraction starts with."""
        async with self._pg.connection() as conn:
            # One statement: the model only changes when one is given.
            return await bump(conn, session_id, version, state=state.value, model=model)

    async def save_extraction(
        self,
        session_id: str,
        changeset: Changeset,
        scored: Sequence[StepRecord],
        *,
        version: int | None = None,
    ) -> int:
        """Keeps a ready session's changeset, the rewards scored at close, and the READY state."""
        payload = _jsonb(changeset.to_json())
        now = self._clock.now()
        async with self._pg.transaction() as conn:
            moved = await bump(conn, session_id, version, state=State.READY.value)
            await conn.execute("DELETE FROM changesets WHERE session_id = %s", (session_id,))
            await conn.execute(
                "INSERT INTO changesets(id, repo, session_id, payload, created_at)"
                " VALUES (%s, %s, %s, %s, %s)",
                (changeset.id, changeset.repo, session_id, payload, now),
            )
            await _save_rewards(conn, ((s.id, s.reward) for s in scored))
            return moved

    async def discard(
        self, session_id: str, episode_id: str | None, *, version: int | None = None
    ) -> int:
        now = self._clock.now()
        async with self._pg.transaction() as conn:
            moved = await bump(conn, session_id, version, state=State.IDLE.value)
            await conn.execute("DELETE FROM changesets WHERE session_id = %s", (session_id,))
            if episode_id is not None:
                await conn.execute(
                    "DELETE FROM task_results WHERE episode_id = %s", (episode_id,)
                )
                await conn.execute(
                    "UPDATE episodes SET status = 'discarded', closed_at = %s WHERE id = %s",
                    (now, episode_id),
                )
            return moved

    async def end(self, session_id: str, *, version: int | None = None) -> None:
        guard = "" if version is None else " AND NOT ended AND version = %s"
        params: tuple[object, ...] = (self._clock.now(), session_id)
        if version is not None:
            params += (version,)
        async with self._pg.transaction() as conn:
            # The claims lock before the session's row, as a commit takes them (its steps,
            # the claims, then the row): the other order deadlocked against a close's commit.
            await lock_claims(conn, session_id)
            cur = await conn.execute(
                "UPDATE sessions SET ended = true, version = version + 1, holder = NULL,"
                f" lease_until = NULL, updated_at = %s WHERE id = %s{guard}",
                params,
            )
            if version is not None and not cur.rowcount:
                raise StaleSession(session_id)
            await drop_ended_work(conn, [session_id])

    async def keep_result(self, episode_id: str, kept: KeptResult) -> None:
        # SQLite's INSERT OR REPLACE: the last reply kept for a key wins.
        async with self._pg.connection() as conn:
            await conn.execute(
                "INSERT INTO task_results(episode_id, trajectory_id, task, digest, reply,"
                " cost, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (episode_id, trajectory_id, task, digest) DO UPDATE SET"
                " reply = excluded.reply, cost = excluded.cost,"
                " created_at = excluded.created_at",
                (episode_id, kept.trajectory_id, kept.task, kept.digest,
                 _jsonb(kept.reply_json()), _jsonb(kept.cost_json()), self._clock.now()),
            )

    async def kept_results(self, episode_id: str) -> list[KeptResult]:
        async with self._pg.connection() as conn:
            # SQLite's table is WITHOUT ROWID: its rows come in key order, bytewise.
            cur = await conn.execute(
                "SELECT trajectory_id, task, digest, reply::text, cost::text FROM task_results"
                ' WHERE episode_id = %s ORDER BY trajectory_id COLLATE "C",'
                ' task COLLATE "C", digest COLLATE "C"',
                (episode_id,),
            )
            rows = await cur.fetchall()
        return [
            KeptResult.from_json(str(trajectory), str(task), str(digest), str(reply),
                                 str(cost))
            for trajectory, task, digest, reply, cost in rows
        ]

    async def load_live(self) -> list[LiveSession]:
        # The id breaks a tie of creation times, which SQLite leaves to its scan.
        return await self._load('NOT s.ended ORDER BY s.created_at, s.id COLLATE "C"', ())

    async def version(self, session_id: str) -> int | None:
        rows = await self._pg.fetch_all(
            "SELECT version FROM sessions WHERE id = %s AND NOT ended", (session_id,)
        )
        return int(rows[0][0]) if rows else None

    async def load_one(self, session_id: str) -> LiveSession | None:
        """The live session as `load_live` would bring it back (None: unknown or ended)."""
        found = await self._load("NOT s.ended AND s.id = %s", (session_id,))
        return found[0] if found else None

    async def _load(self, where: str, params: tuple[object, ...]) -> list[LiveSession]:
        async with self._pg.transaction() as conn:
            await conn.execute(_SNAPSHOT)
            cur = await conn.execute(
                "SELECT s.id, s.repo, s.state, s.config::text, s.created_at, e.id, e.goal,"
                " e.status, s.model, c.payload::text, s.version, s.holder, s.lease_until,"
                " s.active_at, s.metadata"
                " FROM sessions s LEFT JOIN episodes e ON e.id = s.episode_id"
                " LEFT JOIN LATERAL (SELECT payload FROM changesets"
                "   WHERE session_id = s.id LIMIT 1) c ON true"
                f" WHERE {where}",
                params,
            )
            sessions = await cur.fetchall()
            open_ids = [str(row[5]) for row in sessions if row[5] is not None
                        and row[7] == "open"]
            steps = await _load_steps(conn, open_ids)
        live: list[LiveSession] = []
        for (sid, repo, state, config, created, episode_id, goal, status, model,
             payload, version, holder, until, active, metadata) in sessions:
            episode = None
            if episode_id is not None and status == "open":
                episode = EpisodeRecord(str(episode_id), str(goal),
                                        steps.get(str(episode_id), []))
            live.append(
                LiveSession(
                    str(sid), str(repo), State(str(state)), Config.from_json(str(config)),
                    episode, None if payload is None else Changeset.from_json(str(payload)),
                    _utc(created).isoformat(), model=_str_or_none(model),
                    version=_int(version), holder=_str_or_none(holder),
                    lease_until=until if isinstance(until, datetime) else None,
                    active_at=None if active is None else _utc(active),
                    goal=None if goal is None else str(goal),
                    metadata=metadata if isinstance(metadata, dict) else {},
                )
            )
        return live

    async def episodes(self, session_id: str) -> list[EpisodeLog]:
        """Every episode of the session (ended or not), oldest first, with its steps; [] for
        an unknown session. Reads only."""
        return await self._load_episodes(
            "session_id = %s ORDER BY started_at, rowid", session_id
        )

    async def episode(self, episode_id: str) -> EpisodeLog | None:
        """The episode with its steps, None if no session stored it (an ingest's episodes
        live only in the graph). Reads only."""
        found = await self._load_episodes("id = %s", episode_id)
        return found[0] if found else None

    async def _load_episodes(self, where: str, value: str) -> list[EpisodeLog]:
        async with self._pg.transaction() as conn:
            await conn.execute(_SNAPSHOT)
            cur = await conn.execute(
                "SELECT id, session_id, goal, status, started_at, closed_at FROM episodes"
                f" WHERE {where}",
                (value,),
            )
            rows = await cur.fetchall()
            steps = await _load_steps(conn, [str(row[0]) for row in rows])
        return [
            EpisodeLog(
                str(episode_id), str(session_id), str(goal), str(status), _utc(started),
                None if closed is None else _utc(closed), steps.get(str(episode_id), []),
            )
            for episode_id, session_id, goal, status, started, closed in rows
        ]


async def side_writes(conn: Connection, writes: Sequence[SideWrite]) -> None:
    """Writes a commit's (or a forget's) side effects on other stores, inside its transaction:
    `conn` is the connection of the graph's open transaction (`Postgres.transaction()`)."""
    for write in writes:
        if isinstance(write, StepsCommitted):
            if not await _save_rewards(conn, write.steps, committed_in=write.changeset_id):
                # Committed in another changeset (another Memory's auto-commit of the same
                # steps) or gone: the commit's transaction writes nothing.
                raise StepsCommittedElsewhere(write.session_id)
            # Committed: nobody extracts them again, so nobody needs to claim them.
            await lock_claims(conn, write.session_id)
            await conn.execute(
                "DELETE FROM step_claims WHERE step_id = ANY(%s)",
                ([step_id for step_id, _ in write.steps],),
            )
            if write.state is not None:
                await conn.execute(
                    "DELETE FROM changesets WHERE session_id = %s", (write.session_id,)
                )
                await bump(conn, write.session_id, write.version, state=write.state)
                if write.episode_id is not None:
                    await conn.execute(
                        "UPDATE episodes SET status = 'committed', closed_at = clock_timestamp()"
                        " WHERE id = %s",
                        (write.episode_id,),
                    )
                    # What the extraction kept for a retry is no longer needed.
                    await conn.execute(
                        "DELETE FROM task_results WHERE episode_id = %s", (write.episode_id,)
                    )
        elif isinstance(write, SourceRecorded):
            # The receipt itself is the commit's, in applied_changesets: one source of truth.
            await conn.execute(
                "INSERT INTO ingests(repo, source_id, payload_hash, changeset_id, created_at)"
                " VALUES (%s, %s, %s, %s, %s::timestamptz)",
                (write.repo, write.source_id, write.payload_hash, write.changeset_id,
                 write.created_at),
            )
        else:
            await conn.execute(
                "DELETE FROM ingests WHERE repo = %s AND source_id = %s",
                (write.repo, write.source_id),
            )


def _jsonb(text: str) -> Jsonb:
    # The text is already JSON (written with sort_keys, as SQLite keeps it): sent as it is,
    # not parsed and dumped again.
    return Jsonb(text, dumps=str)


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise TypeError(f"expected an integer column, got {value!r}")
    return value


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def _float_or_none(value: object) -> float | None:
    if value is None:
        return None
    if not isinstance(value, float | int):
        raise TypeError(f"expected a double precision column, got {value!r}")
    return float(value)


def _bytes(value: object) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"expected a bytea column, got {value!r}")
    return bytes(value)


def _dict_or_none(value: object) -> JSONObject | None:
    # jsonb comes back parsed; a step's metadata is always an object.
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"expected a jsonb object, got {value!r}")
    return value


def _utc(value: object) -> datetime:
    # timestamptz comes back in the connection's TimeZone; SQLite's rows hold UTC.
    if not isinstance(value, datetime):
        raise TypeError(f"expected a timestamptz column, got {value!r}")
    return value.astimezone(UTC)


def _reward(value: float | None) -> float | None:
    # SQLite stores a NaN as NULL, so a NaN reward reads back as None there; the same here.
    return None if value is None or math.isnan(value) else value


def _step_row(
    session_id: str, episode_id: str, step: StepRecord, now: datetime
) -> tuple[object, ...]:
    return (
        step.id, session_id, episode_id, step.index, step.trajectory_id, step.observation,
        step.action, step.state_summary, step.subgoal, vector_to_blob(step.subgoal_vec),
        _reward(step.reward), None if step.metadata is None else Jsonb(step.metadata), now,
    )


async def _insert_episode(
    conn: Connection, session_id: str, episode: EpisodeRecord, now: datetime
) -> None:
    await conn.execute(
        "INSERT INTO episodes(id, session_id, goal, status, started_at)"
        " VALUES (%s, %s, %s, 'open', %s)",
        (episode.id, session_id, episode.goal, now),
    )


async def bump(
    conn: Connection,
    session_id: str,
    version: int | None,
    *,
    state: str | None = None,
    model: str | None = None,
    expect: str | None = None,
    episode_id: str | None = None,
) -> int:
    """Moves the session's version on (its state to `state`, its model to `model` when
    given), when it is still at `version` and not ended (any, when None), in state `expect`
    and on episode `episode_id` when given. Returns the new version.

    Raises:
        StaleSession: the session moved (or ended, or is unknown); nothing was written.
    """
    sql = ("UPDATE sessions SET version = version + 1, updated_at = clock_timestamp(),"
           " state = coalesce(%s, state), model = coalesce(%s, model) WHERE id = %s")
    params: list[object] = [state, model, session_id]
    if version is not None:
        sql += " AND NOT ended"
    for column, value in (("version", version), ("state", expect), ("episode_id", episode_id)):
        if value is not None:
            sql += f" AND {column} = %s"
            params.append(value)
    cur = await conn.execute(sql + " RETURNING version", params)
    row = await cur.fetchone()
    if row is None:
        raise StaleSession(session_id)
    return int(str(row[0]))


async def _save_rewards(
    conn: Connection,
    steps: Iterable[tuple[str, float | None]],
    *,
    committed_in: str | None = None,
) -> bool:
    """Sets each step's reward (and, given `committed_in`, the changeset that committed it)
    in one statement; of a step listed twice the last reward wins, as in SQLite's loop.
    False when a step is missing or, given `committed_in`, committed in another changeset
    (it is then left as it was: the caller's transaction must not commit)."""
    rewards = {step_id: _reward(reward) for step_id, reward in steps}
    if not rewards:
        return True
    assignments, uncommitted = "reward = v.reward", ""
    if committed_in is not None:
        assignments += ", committed_in = %(changeset)s"
        uncommitted = " AND (committed_in IS NULL OR committed_in = %(changeset)s)"
    cur = await conn.execute(
        f"UPDATE steps SET {assignments}"
        " FROM unnest(%(ids)s::text[], %(rewards)s::float8[]) AS v(id, reward)"
        f" WHERE steps.id = v.id{uncommitted}",
        {"ids": list(rewards), "rewards": list(rewards.values()), "changeset": committed_in},
    )
    return cur.rowcount == len(rewards)


async def _load_steps(conn: Connection, episode_ids: list[str]) -> dict[str, list[StepRecord]]:
    """The steps of each of `episode_ids`, in index order (one query for all of them)."""
    if not episode_ids:
        return {}
    cur = await conn.execute(
        f"SELECT episode_id, {_STEP_COLUMNS} FROM steps WHERE episode_id = ANY(%s)"
        " ORDER BY episode_id, idx",
        (episode_ids,),
    )
    found: dict[str, list[StepRecord]] = {}
    for (episode_id, sid, idx, trajectory, observation, action, summary, subgoal, vec,
         reward, metadata, committed) in await cur.fetchall():
        found.setdefault(str(episode_id), []).append(
            StepRecord(
                id=str(sid),
                index=_int(idx),
                trajectory_id=str(trajectory),
                observation=str(observation),
                action=str(action),
                state_summary=str(summary),
                subgoal=str(subgoal),
                subgoal_vec=vector_from_blob(_bytes(vec)).copy(),
                reward=_float_or_none(reward),
                metadata=_dict_or_none(metadata),
                committed_in=_str_or_none(committed),
            )
        )
    return found
