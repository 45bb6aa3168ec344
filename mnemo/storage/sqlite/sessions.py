"""`SqliteSessions`: the `SessionStore` port (`mnemo.session.ports`) over mnemo's SQLite file.

Every statement runs in the database's own thread (see `mnemo.storage.sqlite.database`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import numpy as np
from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.config import Config
from mnemo.episode.model import EpisodeLog, EpisodeRecord, StepRecord
from mnemo.extraction.memo import KeptResult
from mnemo.graph.model import Changeset, Vector, now_utc, vector_from_blob
from mnemo.graph.ports import SideWrite, SourceRecorded, StepsCommitted
from mnemo.graph.scope import canonical
from mnemo.session.machine import State
from mnemo.session.ports import LiveSession, RepoRow, StaleSession, StepsCommittedElsewhere
from mnemo.storage.sqlite.coordination import drop_ended_work
from mnemo.storage.sqlite.database import Database


class SqliteSessions:
    """`SessionStore` over mnemo's SQLite file."""

    def __init__(self, database: Database) -> None:
        self._database = database

    def _now(self) -> str:
        """The store's time (`HostClock`): a session's last use is judged by other Memories."""
        return self._database.clock.now().isoformat()

    async def load_repos(self) -> list[RepoRow]:
        rows = await self._database.run(
            lambda db: db.conn.execute(
                "SELECT name, config, dim, embedder, llm, vectors_generation FROM repos"
                " ORDER BY created_at, name"
            ).fetchall()
        )
        return [
            RepoRow(name, Config.from_json(config), dim, embedder, llm, generation)
            for name, config, dim, embedder, llm, generation in rows
        ]

    async def save_repo(self, row: RepoRow) -> None:
        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.execute(
                    "INSERT INTO repos(name, config, dim, embedder, llm, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)"
                    # The dimension changes only with the vectors (`Memory.reembed`); the
                    # models may change (an embedder of the same dimension, another LLM) and
                    # the record follows, but an embedder chosen before the vectors were made
                    # again is not recorded over the one that made them.
                    " ON CONFLICT(name) DO UPDATE SET config = excluded.config,"
                    " embedder = CASE WHEN vectors_generation = ? THEN excluded.embedder"
                    " ELSE embedder END, llm = excluded.llm",
                    (row.name, row.config.to_json(), row.dim, row.embedder, row.llm, self._now(),
                     row.generation),
                )

        await self._database.run(write)

    async def load_profile(self, repo: str, model: str) -> str | None:
        rows = await self._database.run(
            lambda db: db.conn.execute(
                "SELECT profile FROM server_profiles WHERE repo = ? AND model = ?",
                (repo, model),
            ).fetchall()
        )
        return str(rows[0][0]) if rows else None

    async def save_profile(self, repo: str, model: str, profile: str) -> None:

        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.execute(
                    "INSERT INTO server_profiles(repo, model, profile, updated_at)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT(repo, model) DO UPDATE SET"
                    " profile = excluded.profile, updated_at = excluded.updated_at",
                    (repo, model, profile, self._now()),
                )

        await self._database.run(write)

    async def create_session(
        self, session_id: str, repo: str, config: Config, episode: EpisodeRecord, *,
        holder: str | None = None, lease_until: datetime | None = None,
        metadata: Mapping[str, str | int | float | bool] | None = None,
    ) -> None:
        now = self._now()
        until = None if lease_until is None else lease_until.isoformat(timespec="microseconds")

        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.execute(
                    "INSERT INTO sessions(id, repo, state, config, episode_id, created_at,"
                    " updated_at, active_at, holder, lease_until, metadata)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (session_id, repo, State.COLLECTING.value, config.to_json(), episode.id,
                     now, now, now, holder, until, canonical(metadata or {})),
                )
                _insert_episode(db, session_id, episode, now)

        await self._database.run(write)

    async def start_episode(
        self, session_id: str, episode: EpisodeRecord, *, version: int | None = None
    ) -> int:
        now = self._now()

        def write(db: SqliteUtilsDatabase) -> int:
            with db.atomic():
                moved = bump(db, now, session_id, version, state=State.COLLECTING)
                db.conn.execute(
                    "UPDATE sessions SET episode_id = ?, active_at = ? WHERE id = ?",
                    (episode.id, now, session_id),
                )
                _insert_episode(db, session_id, episode, now)
                return moved

        return await self._database.run(write)

    async def add_step(
        self,
        session_id: str,
        episode_id: str,
        step: StepRecord,
        *,
        version: int | None = None,
        holder: str | None = None,
    ) -> int:
        now = self._now()
        row = _step_row(session_id, episode_id, step, now)

        def write(db: SqliteUtilsDatabase) -> int:
            with db.atomic():
                # Checked first: the session is still collecting this episode at the version
                # the caller read.
                moved = bump(db, now, session_id, version, expect=State.COLLECTING,
                             episode_id=episode_id, active=True)
                db.conn.execute(
                    "INSERT INTO steps(id, session_id, episode_id, idx, trajectory_id,"
                    " observation, action, state_summary, subgoal, subgoal_vec, reward,"
                    " metadata, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    row,
                )
                if holder is not None:
                    db.conn.execute(
                        "INSERT INTO step_claims(step_id, session_id, holder) VALUES (?, ?, ?)",
                        (step.id, session_id, holder),
                    )
                return moved

        return await self._database.run(write)

    async def annotate_step(
        self,
        session_id: str,
        episode_id: str,
        step: StepRecord,
        previous: StepRecord | None,
        *,
        holder: str | None = None,
    ) -> int | None:
        now = self._now()
        annotation = (step.trajectory_id, step.state_summary, step.subgoal,
                      _blob(step.subgoal_vec), step.id, session_id, episode_id)

        def write(db: SqliteUtilsDatabase) -> int | None:
            with db.atomic():
                written = db.conn.execute(
                    "UPDATE steps SET trajectory_id = ?, state_summary = ?, subgoal = ?,"
                    " subgoal_vec = ? WHERE id = ? AND trajectory_id = '' AND EXISTS (SELECT 1"
                    " FROM sessions WHERE id = ? AND episode_id = ? AND ended = 0"
                    " AND state IN ('collecting', 'extracting'))",
                    annotation,
                ).rowcount
                if holder is not None:
                    db.conn.execute(
                        "DELETE FROM step_claims WHERE step_id = ? AND holder = ?",
                        (step.id, holder),
                    )
                if not written:
                    return None
                if previous is not None:
                    _save_rewards(db, [previous])
                return bump(db, now, session_id, None)

        return await self._database.run(write)

    async def set_state(
        self,
        session_id: str,
        state: State,
        *,
        model: str | None = None,
        version: int | None = None,
    ) -> int:
        """Moves the session to `state`; `model` records the model its extraction starts with."""
        now = self._now()

        def write(db: SqliteUtilsDatabase) -> int:
            with db.atomic():
                moved = bump(db, now, session_id, version, state=state)
                if model is not None:
                    db.conn.execute(
                        "UPDATE sessions SET model = ? WHERE id = ?", (model, session_id)
                    )
                return moved

        return await self._database.run(write)

    async def save_extraction(
        self,
        session_id: str,
        changeset: Changeset,
        scored: Sequence[StepRecord],
        *,
        version: int | None = None,
    ) -> int:
        """Keeps a ready session's changeset, the rewards scored at close, and the READY state."""
        payload = changeset.to_json()
        now = self._now()

        def write(db: SqliteUtilsDatabase) -> int:
            with db.atomic():
                moved = bump(db, now, session_id, version, state=State.READY)
                db.conn.execute("DELETE FROM changesets WHERE session_id = ?", (session_id,))
                db.conn.execute(
                    "INSERT INTO changesets(id, repo, session_id, payload, created_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (changeset.id, changeset.repo, session_id, payload, now),
                )
                _save_rewards(db, scored)
                return moved

        return await self._database.run(write)

    async def discard(
        self, session_id: str, episode_id: str | None, *, version: int | None = None
    ) -> int:
        now = self._now()

        def write(db: SqliteUtilsDatabase) -> int:
            with db.atomic():
                moved = bump(db, now, session_id, version, state=State.IDLE)
                db.conn.execute("DELETE FROM changesets WHERE session_id = ?", (session_id,))
                if episode_id is not None:
                    db.conn.execute(
                        "DELETE FROM task_results WHERE episode_id = ?", (episode_id,)
                    )
                    db.conn.execute(
                        "UPDATE episodes SET status = 'discarded', closed_at = ? WHERE id = ?",
                        (now, episode_id),
                    )
                return moved

        return await self._database.run(write)

    async def end(self, session_id: str, *, version: int | None = None) -> None:
        guard = "" if version is None else " AND ended = 0 AND version = ?"
        params: tuple[object, ...] = (self._now(), session_id)
        if version is not None:
            params += (version,)

        def write(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                ended = db.conn.execute(
                    "UPDATE sessions SET ended = 1, version = version + 1, holder = NULL,"
                    f" lease_until = NULL, updated_at = ? WHERE id = ?{guard}",
                    params,
                ).rowcount
                if version is not None and not ended:
                    raise StaleSession(session_id)  # nothing written
                drop_ended_work(db, [session_id])

        await self._database.run(write)

    async def keep_result(self, episode_id: str, kept: KeptResult) -> None:
        row = (episode_id, kept.trajectory_id, kept.task, kept.digest, kept.reply_json(),
               kept.cost_json(), self._now())
        await self._database.run(
            lambda db: db.conn.execute(
                "INSERT OR REPLACE INTO task_results(episode_id, trajectory_id, task, digest,"
                " reply, cost, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                row,
            )
        )

    async def kept_results(self, episode_id: str) -> list[KeptResult]:
        rows = await self._database.run(
            lambda db: db.conn.execute(
                "SELECT trajectory_id, task, digest, reply, cost FROM task_results"
                " WHERE episode_id = ?",
                (episode_id,),
            ).fetchall()
        )
        return [KeptResult.from_json(*row) for row in rows]

    async def load_live(self) -> list[LiveSession]:
        return await self._database.run(_load_live)

    async def version(self, session_id: str) -> int | None:
        rows = await self._database.run(
            lambda db: db.conn.execute(
                "SELECT version FROM sessions WHERE id = ? AND NOT ended", (session_id,)
            ).fetchall()
        )
        return int(rows[0][0]) if rows else None

    async def load_one(self, session_id: str) -> LiveSession | None:
        """The live session as `load_live` would bring it back (None: unknown or ended)."""
        found = await self._database.run(
            lambda db: _load_live(db, "s.ended = 0 AND s.id = ?", (session_id,))
        )
        return found[0] if found else None

    async def episodes(self, session_id: str) -> list[EpisodeLog]:
        """Every episode of the session (ended or not), oldest first, with its steps; [] for
        an unknown session. Reads only."""
        return await self._database.run(
            lambda db: _load_episodes(db, "session_id = ? ORDER BY started_at, rowid", session_id)
        )

    async def episode(self, episode_id: str) -> EpisodeLog | None:
        """The episode with its steps, None if no session stored it (an ingest's episodes
        live only in the graph). Reads only."""
        found = await self._database.run(lambda db: _load_episodes(db, "id = ?", episode_id))
        return found[0] if found else None




def _utc(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _blob(vector: Vector) -> bytes:
    """A step's subgoal vector as the float32 bytes the `steps` table holds (as
    `graph.model.vector_to_blob`, here so that storing a step reads no other module)."""
    return np.asarray(vector, dtype=np.float32).tobytes()


def _json_or_none(value: object) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


def _step_row(
    session_id: str, episode_id: str, step: StepRecord, now: str
) -> tuple[object, ...]:
    return (
        step.id, session_id, episode_id, step.index, step.trajectory_id, step.observation,
        step.action, step.state_summary, step.subgoal, _blob(step.subgoal_vec),
        step.reward, _json_or_none(step.metadata), now,
    )


def _insert_episode(db: SqliteUtilsDatabase, session_id: str, episode: EpisodeRecord,
                    now: str) -> None:
    db.conn.execute(
        "INSERT INTO episodes(id, session_id, goal, status, started_at) VALUES (?, ?, ?, ?, ?)",
        (episode.id, session_id, episode.goal, "open", now),
    )


def bump(
    db: SqliteUtilsDatabase,
    now: str,
    session_id: str,
    version: int | None,
    *,
    state: State | str | None = None,
    expect: State | None = None,
    episode_id: str | None = None,
    active: bool = False,
) -> int:
    """Moves the session's version on at `now` (and its state to `state`, its last activity to
    `now` when `active`), when it is still at `version` and not ended (any, when None), in
    state `expect` and on episode `episode_id` when given. Returns the new version.

    Raises:
        StaleSession: the session moved (or ended, or is unknown); nothing was written.
    """
    sql = "UPDATE sessions SET version = version + 1, updated_at = ?"
    params: list[object] = [now]
    if active:
        sql += ", active_at = ?"
        params.append(now)
    if state is not None:
        sql += ", state = ?"
        params.append(State(state).value)
    sql += " WHERE id = ?"
    params.append(session_id)
    if version is not None:
        # A write that read the session refuses an ended one; one that did not keeps
        # today's unconditional behaviour.
        sql += " AND ended = 0"
    for column, value in (("version", version), ("state", None if expect is None else
                                                   expect.value), ("episode_id", episode_id)):
        if value is not None:
            sql += f" AND {column} = ?"
            params.append(value)
    row = db.conn.execute(sql + " RETURNING version", params).fetchone()
    if row is None:
        raise StaleSession(session_id)
    return int(row[0])


def _save_rewards(db: SqliteUtilsDatabase, steps: Sequence[StepRecord]) -> None:
    db.conn.executemany(
        "UPDATE steps SET reward = ? WHERE id = ?", [(s.reward, s.id) for s in steps]
    )


def _load_live(
    db: SqliteUtilsDatabase, where: str = "s.ended = 0 ORDER BY s.created_at",
    params: tuple[object, ...] = (),
) -> list[LiveSession]:
    live: list[LiveSession] = []
    sessions = db.conn.execute(
        "SELECT s.id, s.repo, s.state, s.config, s.created_at, e.id, e.goal, e.status, s.model,"
        " s.version, s.holder, s.lease_until, s.active_at, s.metadata"
        " FROM sessions s LEFT JOIN episodes e ON e.id = s.episode_id"
        f" WHERE {where}",
        params,
    ).fetchall()
    for (sid, repo, state, config, created, episode_id, goal, status, model, version, holder,
         until, active, metadata) in sessions:
        episode = None
        if episode_id is not None and status == "open":
            episode = EpisodeRecord(episode_id, goal, _load_steps(db, episode_id))
        changeset = None
        row = db.conn.execute(
            "SELECT payload FROM changesets WHERE session_id = ?", (sid,)
        ).fetchone()
        if row is not None:
            changeset = Changeset.from_json(row[0])
        live.append(
            LiveSession(sid, repo, State(state), Config.from_json(config), episode, changeset,
                        created, model=model, version=int(version), holder=holder,
                        lease_until=None if until is None else datetime.fromisoformat(until),
                        active_at=None if active is None else _utc(active), goal=goal,
                        metadata={} if metadata is None else json.loads(metadata))
        )
    return live


def _load_steps(db: SqliteUtilsDatabase, episode_id: str) -> list[StepRecord]:
    return [
        StepRecord(
            id=sid,
            index=idx,
            trajectory_id=trajectory,
            observation=observation,
            action=action,
            state_summary=summary,
            subgoal=subgoal,
            subgoal_vec=vector_from_blob(vec).copy(),
            reward=reward,
            metadata=None if metadata is None else json.loads(metadata),
            committed_in=committed,
        )
        for (sid, idx, trajectory, observation, action, summary, subgoal, vec, reward,
             metadata, committed) in db.conn.execute(
            "SELECT id, idx, trajectory_id, observation, action, state_summary, subgoal,"
            " subgoal_vec, reward, metadata, committed_in FROM steps WHERE episode_id = ?"
            " ORDER BY idx",
            (episode_id,),
        )
    ]


def _load_episodes(db: SqliteUtilsDatabase, where: str, value: str) -> list[EpisodeLog]:
    rows = db.conn.execute(
        f"SELECT id, session_id, goal, status, started_at, closed_at FROM episodes WHERE {where}",
        (value,),
    ).fetchall()
    return [
        EpisodeLog(
            episode_id, session_id, goal, status, datetime.fromisoformat(started),
            None if closed is None else datetime.fromisoformat(closed),
            _load_steps(db, episode_id),
        )
        for episode_id, session_id, goal, status, started, closed in rows
    ]


def side_writes_alone(db: SqliteUtilsDatabase, writes: Sequence[SideWrite]) -> None:
    with db.atomic():
        side_writes(db, writes)


def side_writes(db: SqliteUtilsDatabase, writes: Sequence[SideWrite]) -> None:
    """Writes a commit's (or a forget's) side effects on other stores, inside its transaction."""
    conn = db.conn
    for write in writes:
        if isinstance(write, StepsCommitted):
            rewards = dict(write.steps)  # of a step listed twice, the last reward
            marked = conn.executemany(
                "UPDATE steps SET committed_in = ?, reward = ? WHERE id = ?"
                " AND (committed_in IS NULL OR committed_in = ?)",
                [(write.changeset_id, reward, step_id, write.changeset_id)
                 for step_id, reward in rewards.items()],
            ).rowcount
            if marked < len(rewards):
                # Committed in another changeset (another Memory's auto-commit of the same
                # steps) or gone: this commit writes nothing.
                raise StepsCommittedElsewhere(write.session_id)
            # Committed: nobody extracts them again, so nobody needs to claim them.
            conn.executemany(
                "DELETE FROM step_claims WHERE step_id = ?", [(i,) for i in rewards]
            )
            if write.state is not None:
                now = now_utc().isoformat()
                conn.execute("DELETE FROM changesets WHERE session_id = ?", (write.session_id,))
                bump(db, now, write.session_id, write.version, state=write.state)
                if write.episode_id is not None:
                    conn.execute(
                        "UPDATE episodes SET status = 'committed', closed_at = ? WHERE id = ?",
                        (now, write.episode_id),
                    )
                    # What the extraction kept for a retry is no longer needed.
                    conn.execute(
                        "DELETE FROM task_results WHERE episode_id = ?", (write.episode_id,)
                    )
        elif isinstance(write, SourceRecorded):
            # The receipt itself is the commit's, in applied_changesets: one source of truth.
            conn.execute(
                "INSERT INTO ingests(repo, source_id, payload_hash, changeset_id, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (write.repo, write.source_id, write.payload_hash, write.changeset_id,
                 write.created_at),
            )
        else:
            conn.execute(
                "DELETE FROM ingests WHERE repo = ? AND source_id = ?",
                (write.repo, write.source_id),
            )
