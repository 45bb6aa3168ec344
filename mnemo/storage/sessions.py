"""`SqlSessions`: the `SessionStore` port and a commit's `side_writes`, once for both backends.
A write is one transaction, a read of several statements one snapshot; a session's version
moves on with every write of it (`bump`), checked against the version its writer read."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime

from mnemo.config import Config
from mnemo.episode import EpisodeLog, EpisodeRecord, StepRecord
from mnemo.extraction.memo import KeptResult
from mnemo.graph.model import Changeset
from mnemo.graph.ports import SideWrite, SourceRecorded, StepsCommitted
from mnemo.graph.scope import Where, matches
from mnemo.ports import vector_from_blob, vector_to_blob
from mnemo.session.machine import State
from mnemo.session.ports import LiveSession, RepoRow, StaleSession, StepsCommittedElsewhere
from mnemo.storage import coordination
from mnemo.storage.clock import Clock
from mnemo.storage.sql import Driver, SqlStore, Statements, marks, moment

STEP_COLUMNS = (
    "id, session_id, episode_id, idx, trajectory_id, observation, action, state_summary,"
    " subgoal, subgoal_vec, reward, metadata, recorded_at"
)
EPISODE = ("INSERT INTO episodes(id, session_id, goal, started_at, status)"
           " VALUES (?, ?, ?, ?, 'open')")
# A step's annotation, while its session still collects or extracts its episode.
ANNOTATE = (
    "UPDATE steps SET trajectory_id = ?, state_summary = ?, subgoal = ?, subgoal_vec = ?"
    " WHERE id = ? AND trajectory_id = '' AND EXISTS (SELECT 1 FROM sessions WHERE id = ?"
    " AND episode_id = ? AND ended = false AND state IN ('collecting', 'extracting'))"
)


def reward(value: float | None) -> float | None:
    """A reward as stored: a NaN is NULL (SQLite stores it so; PostgreSQL alike)."""
    return None if value is None or math.isnan(value) else value


class SqlSessions(SqlStore):
    # The time in a statement of a commit's side writes (the server's on PostgreSQL).
    NOW = ""

    def __init__(self, driver: Driver, clock: Clock) -> None:
        super().__init__(driver)
        self._clock = clock

    def _stamp(self, at: datetime) -> object:
        # `Dialect._stamp`, in this file: an append runs through few (test_append_path.py).
        return at.isoformat(timespec="microseconds")

    @classmethod
    async def _save_rewards(cls, sql: Statements, rewards: dict[str, float | None],
                            committed_in: str | None = None) -> bool:
        """Sets each step's reward (and its changeset, given `committed_in`); False when a
        step is missing or committed in another changeset (the caller must roll back)."""
        written = 0
        for step_id, value in rewards.items():
            written += await sql.run(
                "UPDATE steps SET reward = ?, committed_in = coalesce(?, committed_in) WHERE id = ?"
                " AND (committed_in IS NULL OR committed_in = coalesce(?, committed_in))",
                (value, committed_in, step_id, committed_in),
            )
        return written == len(rewards)

    def _now(self) -> object:
        return self._stamp(self._clock.now())

    def _step_row(self, session_id: str, episode_id: str, step: StepRecord,
                  now: object) -> tuple[object, ...]:
        return (
            step.id, session_id, episode_id, step.index, step.trajectory_id, step.observation,
            step.action, step.state_summary, step.subgoal, vector_to_blob(step.subgoal_vec),
            reward(step.reward), None if step.metadata is None else self._json(step.metadata),
            now,
        )

    @classmethod
    async def bump(cls, sql: Statements, session_id: str, version: int | None, *,
                   now: object = None, state: State | str | None = None,
                   model: str | None = None, expect: State | None = None,
                   episode_id: str | None = None, active: bool = False) -> int:
        """Moves the session's version on (and its state, model, activity as given) if it is
        still at `version` (any: None), not ended, in `expect` and on `episode_id`; returns the
        new version. Raises `StaleSession`, nothing written, otherwise."""
        at = cls.NOW if now is None else "?"
        query = (f"UPDATE sessions SET version = version + 1, updated_at = {at},"
                 f"{' active_at = ?,' if active else ''} state = coalesce(?, state),"
                 " model = coalesce(?, model) WHERE id = ?")
        params: list[object] = [
            *([] if now is None else [now]), *([now] if active else []),
            None if state is None else State(state).value, model, session_id,
        ]
        if version is not None:
            query += " AND ended = false"
        for column, value in (("version", version),
                              ("state", None if expect is None else expect.value),
                              ("episode_id", episode_id)):
            if value is not None:
                query += f" AND {column} = ?"
                params.append(value)
        row = await sql.row(query + " RETURNING version", params)
        if row is None:
            raise StaleSession(session_id)
        return int(row[0])

    async def load_repos(self) -> list[RepoRow]:
        rows = await self._rows(
            f"SELECT name, config{self.TEXT}, dim, embedder, llm, vectors_generation"
            f" FROM repos ORDER BY created_at, name{self.BYTE_ORDER}")
        return [
            RepoRow(name, Config.from_json(config), int(dim), embedder, llm, int(generation))
            for name, config, dim, embedder, llm, generation in rows
        ]

    async def save_repo(self, row: RepoRow) -> None:
        await self._driver.one(lambda sql: sql.run(
            "INSERT INTO repos(name, config, dim, embedder, llm, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)"
            # An embedder chosen before a re-embedding never overwrites the one after it.
            " ON CONFLICT (name) DO UPDATE SET config = excluded.config,"
            " embedder = CASE WHEN repos.vectors_generation = ? THEN excluded.embedder"
            " ELSE repos.embedder END, llm = excluded.llm",
            (row.name, self._json_text(row.config.to_json()), row.dim, row.embedder, row.llm,
             self._now(), row.generation),
        ))

    async def load_profile(self, repo: str, model: str) -> str | None:
        rows = await self._rows(
            f"SELECT profile{self.TEXT} FROM server_profiles WHERE repo = ? AND model = ?",
            (repo, model))
        return str(rows[0][0]) if rows else None

    async def save_profile(self, repo: str, model: str, profile: str) -> None:
        await self._driver.one(lambda sql: sql.run(
            "INSERT INTO server_profiles(repo, model, profile, updated_at)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (repo, model) DO UPDATE SET"
            " profile = excluded.profile, updated_at = excluded.updated_at",
            (repo, model, self._json_text(profile), self._now()),
        ))

    async def create_session(
        self, session_id: str, repo: str, config: Config, episode: EpisodeRecord, *,
        holder: str | None = None, lease_until: datetime | None = None,
        metadata: Mapping[str, str | int | float | bool] | None = None,
    ) -> None:
        now = self._now()

        async def write(sql: Statements) -> None:
            await sql.run(
                "INSERT INTO sessions(id, repo, state, config, episode_id, created_at,"
                " updated_at, active_at, holder, lease_until, metadata)"
                f" VALUES ({marks(11)})",
                (session_id, repo, State.COLLECTING.value, self._json_text(config.to_json()),
                 episode.id, now, now, now, holder,
                 None if lease_until is None else self._stamp(lease_until),
                 self._json(dict(metadata)) if metadata else None),
            )
            await sql.run(EPISODE, (episode.id, session_id, episode.goal, now))

        await self._driver.write(write)

    async def start_episode(
        self, session_id: str, episode: EpisodeRecord, *, version: int | None = None
    ) -> int:
        now = self._now()

        async def write(sql: Statements) -> int:
            moved = await self.bump(sql, session_id, version, now=now, state=State.COLLECTING)
            await sql.run("UPDATE sessions SET episode_id = ?, active_at = ? WHERE id = ?",
                          (episode.id, now, session_id))
            await sql.run(EPISODE, (episode.id, session_id, episode.goal, now))
            return moved

        return await self._driver.write(write)

    async def add_step(self, session_id: str, episode_id: str, step: StepRecord, *,
                       version: int | None = None, holder: str | None = None) -> int:
        now = self._now()
        row = self._step_row(session_id, episode_id, step, now)

        async def write(sql: Statements) -> int:
            moved = await self.bump(sql, session_id, version, now=now, expect=State.COLLECTING,
                                    episode_id=episode_id, active=True)
            await sql.run(f"INSERT INTO steps({STEP_COLUMNS}) VALUES ({marks(13)})", row)
            if holder is not None:
                await sql.run(
                    "INSERT INTO step_claims(step_id, session_id, holder) VALUES (?, ?, ?)",
                    (step.id, session_id, holder),
                )
            return moved

        return await self._driver.write(write)

    async def remove_step(self, session_id: str, episode_id: str, step_id: str) -> int | None:
        async def write(sql: Statements) -> int:
            await self._lock_claims(sql, session_id)
            moved = await self.bump(sql, session_id, None, now=self._now(),
                                    expect=State.COLLECTING, episode_id=episode_id)
            if not await sql.run(
                    "DELETE FROM steps WHERE id = ? AND session_id = ? AND episode_id = ?"
                    " AND trajectory_id = '' AND NOT EXISTS (SELECT 1 FROM steps later"
                    " WHERE later.episode_id = steps.episode_id AND later.idx > steps.idx)"
                    " AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = steps.session_id"
                    " AND s.ended = false)",
                    (step_id, session_id, episode_id)):
                raise StaleSession(session_id)  # the bump is rolled back with it
            await sql.run("DELETE FROM step_claims WHERE step_id = ?", (step_id,))
            return moved

        try:
            return await self._driver.write(write)
        except StaleSession:
            return None

    async def annotate_step(self, session_id: str, episode_id: str, step: StepRecord,
                            previous: StepRecord | None, *,
                            holder: str | None = None) -> int | None:
        async def write(sql: Statements) -> int | None:
            # The claims first, as an end takes them before the session's row.
            await self._lock_claims(sql, session_id)
            if holder is not None:
                await sql.run("DELETE FROM step_claims WHERE step_id = ? AND holder = ?",
                              (step.id, holder))
            moved = await self._annotate(sql, session_id, (
                step.trajectory_id, step.state_summary, step.subgoal,
                vector_to_blob(step.subgoal_vec), step.id, session_id, episode_id))
            if moved is not None and previous is not None:
                await self._save_rewards(sql, {previous.id: reward(previous.reward)})
            return moved

        return await self._driver.write(write)

    async def _annotate(self, sql: Statements, session_id: str,
                        params: tuple[object, ...]) -> int | None:
        """Writes a step's annotation and moves the session's version on; None, writing
        nothing, when already annotated or the session moved on."""
        if not await sql.run(ANNOTATE, params):
            return None
        return await self.bump(sql, session_id, None, now=self._now())

    async def set_state(self, session_id: str, state: State, *, model: str | None = None,
                        version: int | None = None) -> int:
        return await self._driver.one(
            lambda sql: self.bump(sql, session_id, version, now=self._now(), state=state,
                                 model=model)
        )

    async def save_extraction(self, session_id: str, changeset: Changeset,
                              scored: Sequence[StepRecord], *, version: int | None = None) -> int:
        payload = self._json_text(changeset.to_json())
        now = self._now()

        async def write(sql: Statements) -> int:
            moved = await self.bump(sql, session_id, version, now=now, state=State.READY)
            await sql.run("DELETE FROM changesets WHERE session_id = ?", (session_id,))
            await sql.run(
                "INSERT INTO changesets(id, repo, session_id, payload, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (changeset.id, changeset.repo, session_id, payload, now),
            )
            # Of a step listed twice, the last reward.
            await self._save_rewards(sql, {s.id: reward(s.reward) for s in scored})
            return moved

        return await self._driver.write(write)

    async def discard(
        self, session_id: str, episode_id: str | None, *, version: int | None = None
    ) -> int:
        now = self._now()

        async def write(sql: Statements) -> int:
            moved = await self.bump(sql, session_id, version, now=now, state=State.IDLE)
            await sql.run("DELETE FROM changesets WHERE session_id = ?", (session_id,))
            if episode_id is not None:  # the episode ended first: no reply is kept after
                await sql.run(
                    "UPDATE episodes SET status = 'discarded', closed_at = ? WHERE id = ?",
                    (now, episode_id),
                )
                await sql.run("DELETE FROM task_results WHERE episode_id = ?", (episode_id,))
            return moved

        return await self._driver.write(write)

    async def end(self, session_id: str, *, version: int | None = None) -> None:
        guard = "" if version is None else " AND ended = false AND version = ?"
        params = (self._now(), session_id, *(() if version is None else (version,)))

        async def write(sql: Statements) -> None:
            # Claims before the session's row, as a commit takes them (else a deadlock).
            await self._lock_claims(sql, session_id)
            ended = await sql.run(
                "UPDATE sessions SET ended = true, version = version + 1, holder = NULL,"
                f" lease_until = NULL, updated_at = ? WHERE id = ?{guard}",
                params,
            )
            if version is not None and not ended:
                raise StaleSession(session_id)  # nothing written
            await coordination.drop_ended_work(sql, [session_id])

        await self._driver.write(write)

    async def keep_result(self, episode_id: str, kept: KeptResult) -> None:
        params = (episode_id, kept.trajectory_id, kept.task, kept.digest,
                  self._json_text(kept.reply_json()), self._json_text(kept.cost_json()),
                  self._now())

        async def write(sql: Statements) -> None:
            # Only for an open episode, held so until the reply is in: a forget, discard or
            # commit that ends it meanwhile deletes the reply after, or finds none to keep.
            if not await sql.rows("SELECT 1 FROM episodes WHERE id = ? AND status = 'open'"
                                  f"{self.SHARE}", (episode_id,)):
                return
            # The last reply kept for a key wins.
            await sql.run(
                "INSERT INTO task_results(episode_id, trajectory_id, task, digest, reply,"
                " cost, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (episode_id, trajectory_id, task, digest) DO UPDATE SET"
                " reply = excluded.reply, cost = excluded.cost, created_at = excluded.created_at",
                params)

        await self._driver.write(write)

    async def kept_results(self, episode_id: str) -> list[KeptResult]:
        rows = await self._rows(
            f"SELECT trajectory_id, task, digest, reply{self.TEXT}, cost{self.TEXT}"
            f" FROM task_results WHERE episode_id = ? ORDER BY trajectory_id{self.BYTE_ORDER},"
            f" task{self.BYTE_ORDER}, digest{self.BYTE_ORDER}", (episode_id,))
        return [KeptResult.from_json(*row) for row in rows]

    async def version(self, session_id: str) -> int | None:
        row = await self._driver.read(lambda sql: sql.row(
            "SELECT version FROM sessions WHERE id = ? AND ended = false", (session_id,)
        ))
        return None if row is None else int(row[0])

    async def load_live(self) -> list[LiveSession]:
        return await self._driver.together(lambda sql: self._load(
            sql, f"s.ended = false ORDER BY s.created_at, s.id{self.BYTE_ORDER}", ()
        ))

    async def load_one(self, session_id: str) -> LiveSession | None:
        found = await self._driver.together(
            lambda sql: self._load(sql, "s.ended = false AND s.id = ?", (session_id,))
        )
        return found[0] if found else None

    async def episodes(self, session_id: str) -> list[EpisodeLog]:
        return await self._driver.together(lambda sql: self._load_episodes(
            sql, "session_id = ? ORDER BY started_at, rowid", session_id
        ))

    async def episode(self, episode_id: str) -> EpisodeLog | None:
        found = await self._driver.together(
            lambda sql: self._load_episodes(sql, "id = ?", episode_id)
        )
        return found[0] if found else None

    async def scoped(self, repo: str, where: Where) -> list[str]:
        rows = await self._rows(f"SELECT id, metadata{self.TEXT} FROM sessions WHERE repo = ?"
                                " AND metadata IS NOT NULL", (repo,))
        return [str(i) for i, metadata in rows if matches(json.loads(metadata), where)]

    async def _load(self, sql: Statements, where: str,
                    params: tuple[object, ...]) -> list[LiveSession]:
        sessions = await sql.rows(
            f"SELECT s.id, s.repo, s.state, s.config{self.TEXT}, e.id, e.goal,"
            " e.status, s.model, s.version, s.holder, s.lease_until, s.active_at,"
            f" s.metadata{self.TEXT}, (SELECT payload{self.TEXT} FROM changesets"
            " WHERE session_id = s.id LIMIT 1)"
            f" FROM sessions s LEFT JOIN episodes e ON e.id = s.episode_id WHERE {where}",
            params,
        )
        steps = await self._load_steps(
            sql, [row[4] for row in sessions if row[4] is not None and row[6] == "open"]
        )
        return [
            LiveSession(
                sid, repo, State(state), Config.from_json(config),
                None if episode_id is None or status != "open"
                else EpisodeRecord(episode_id, goal, steps.get(episode_id, [])),
                None if payload is None else Changeset.from_json(payload),
                model=model, version=int(version),
                holder=holder, lease_until=None if until is None else moment(until),
                active_at=None if active is None else moment(active), goal=goal,
                metadata={} if metadata is None else json.loads(metadata),
            )
            for (sid, repo, state, config, episode_id, goal, status, model, version,
                 holder, until, active, metadata, payload) in sessions
        ]

    async def _load_episodes(self, sql: Statements, where: str,
                             value: str) -> list[EpisodeLog]:
        rows = await sql.rows(
            "SELECT id, session_id, goal, status, started_at, closed_at FROM episodes"
            f" WHERE {where}",
            (value,),
        )
        steps = await self._load_steps(sql, [row[0] for row in rows])
        return [
            EpisodeLog(episode_id, session_id, goal, status, moment(started),
                       None if closed is None else moment(closed), steps.get(episode_id, []))
            for episode_id, session_id, goal, status, started, closed in rows
        ]

    async def _load_steps(self, sql: Statements,
                          episode_ids: list[str]) -> dict[str, list[StepRecord]]:
        """The steps of each of `episode_ids`, in index order (one query for all of them)."""
        found: dict[str, list[StepRecord]] = {}
        if not episode_ids:
            return found
        for (episode_id, sid, idx, trajectory, observation, action, summary, subgoal, vec,
             value, metadata, committed) in await sql.rows(
            "SELECT episode_id, id, idx, trajectory_id, observation, action, state_summary,"
            f" subgoal, subgoal_vec, reward, metadata{self.TEXT}, committed_in FROM steps"
            f" WHERE episode_id{self.ANY} ORDER BY episode_id, idx",
            (self._list(episode_ids),),
        ):
            found.setdefault(episode_id, []).append(StepRecord(
                id=sid, index=int(idx), trajectory_id=trajectory, observation=observation,
                action=action, state_summary=summary, subgoal=subgoal,
                subgoal_vec=vector_from_blob(bytes(vec)).copy(),
                reward=None if value is None else float(value),
                metadata=None if metadata is None else json.loads(metadata),
                committed_in=committed,
            ))
        return found

    @classmethod
    async def side_writes(cls, sql: Statements, writes: Sequence[SideWrite]) -> None:
        """Writes a commit's (or forget's) side effects inside its transaction."""
        for write in writes:
            if isinstance(write, StepsCommitted):
                # Of a step listed twice, the last reward.
                rewards = {step_id: reward(value) for step_id, value in write.steps}
                if not await cls._save_rewards(sql, rewards, write.changeset_id):
                    # Its steps gone with the session that moved (ended, forgotten): stale.
                    if write.version is not None and not await sql.rows(
                            "SELECT 1 FROM sessions WHERE id = ? AND version = ? AND ended = false",
                            (write.session_id, write.version)):
                        raise StaleSession(write.session_id)
                    raise StepsCommittedElsewhere(write.session_id)
                await cls._lock_claims(sql, write.session_id)
                await sql.run(f"DELETE FROM step_claims WHERE step_id{cls.ANY}",
                              (cls._list(list(rewards)),))
                if write.state is not None:
                    await sql.run("DELETE FROM changesets WHERE session_id = ?",
                                  (write.session_id,))
                    await cls.bump(sql, write.session_id, write.version, state=write.state)
                    if write.episode_id is not None:
                        await sql.run(
                            f"UPDATE episodes SET status = 'committed', closed_at = {cls.NOW}"
                            " WHERE id = ?",
                            (write.episode_id,),
                        )
                        await sql.run("DELETE FROM task_results WHERE episode_id = ?",
                                      (write.episode_id,))
            elif isinstance(write, SourceRecorded):
                await sql.run(
                    "INSERT INTO ingests(repo, source_id, payload_hash, changeset_id,"
                    " created_at) VALUES (?, ?, ?, ?, ?)",
                    (write.repo, write.source_id, write.payload_hash, write.changeset_id,
                     cls._time(write.created_at)),
                )
                # Recorded: no ingest of another Memory waits on its claim any more.
                await sql.run("DELETE FROM source_claims WHERE repo = ? AND source_id = ?",
                              (write.repo, write.source_id))
            else:
                await sql.run("DELETE FROM ingests WHERE repo = ? AND source_id = ?",
                              (write.repo, write.source_id))
