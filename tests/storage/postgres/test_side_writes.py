"""A commit's side writes (`StepsCommitted`, `SourceRecorded`, `SourceForgotten`) written inside
the commit's transaction, the same on SQLite's `side_writes` and PostgreSQL's."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mnemo.config import Config
from mnemo.episode import EpisodeRecord
from mnemo.errors import StorageError
from mnemo.extraction.memo import KeptResult
from mnemo.graph.model import Changeset
from mnemo.graph.ports import SourceForgotten, SourceRecorded, StepsCommitted
from mnemo.ports import Usage
from mnemo.session.machine import State
from mnemo.session.ports import RepoRow, StepsCommittedElsewhere
from mnemo.storage.postgres.connection import PgStatements, Postgres
from mnemo.storage.postgres.sessions import PgSessions
from mnemo.storage.postgres.store import ServerClock
from tests.pg import pg_clones, pg_server, pg_template, pg_url
from tests.storage.postgres.session_backends import (
    DIM,
    REPO,
    Backend,
    backend,
    backend_place,
    step,
)

__all__ = ["backend", "backend_place", "pg_clones", "pg_server", "pg_template", "pg_url"]

WHEN = "2026-01-02T03:04:05.123456+00:00"


async def _collected(backend: Backend) -> None:
    """A READY session with two steps, a changeset and a kept result."""
    store = backend.sessions
    await store.create_session("s1", REPO, Config(), EpisodeRecord("e1", "goal"))
    await store.add_step("s1", "e1", step("st1", 0))
    await store.add_step("s1", "e1", step("st2", 1))
    await store.keep_result(
        "e1", KeptResult("t1", "semantic", "d", "fact", None, Usage(1, 1, calls=1))
    )
    await store.save_extraction("s1", Changeset("c1", REPO, step_ids=["st1", "st2"]), [])


async def test_steps_committed_closes_the_episode(backend: Backend) -> None:
    """Steps get the changeset and their final rewards (the last of a repeated step wins); the
    episode is committed, the changeset and kept results are dropped, the state moves."""
    await _collected(backend)
    await backend.side_writes([
        StepsCommitted("s1", "e1", "c1", (("st1", 0.5), ("st2", None), ("st1", 1.0)),
                       State.IDLE.value)
    ])
    log = await backend.sessions.episode("e1")
    assert log is not None
    assert (log.status, log.closed_at is not None) == ("committed", True)
    assert [(s.id, s.reward, s.committed_in) for s in log.steps] == [
        ("st1", 1.0, "c1"), ("st2", None, "c1")
    ]
    [live] = await backend.sessions.load_live()
    assert (live.state, live.changeset, live.episode) == (State.IDLE, None, None)
    assert await backend.sessions.kept_results("e1") == []


async def test_steps_committed_without_a_state_only_marks_steps(backend: Backend) -> None:
    """With no state (an auto-commit mid-episode) only the steps change: the episode stays
    open and the session keeps its state and changeset."""
    await _collected(backend)
    await backend.side_writes([StepsCommitted("s1", "e1", "c1", (("st1", 0.25),), None)])
    [live] = await backend.sessions.load_live()
    assert live.state is State.READY
    assert live.changeset is not None
    assert live.episode is not None
    assert [(s.reward, s.committed_in) for s in live.episode.steps] == [
        (0.25, "c1"), (None, None)
    ]
    assert len(await backend.sessions.kept_results("e1")) == 1


async def test_steps_committed_in_another_changeset_refuse_the_commit(backend: Backend) -> None:
    """A step already committed in another changeset (two Memory objects' auto-commits of the
    same steps: a boundary's in one, a flush in the other) refuses the commit with
    StepsCommittedElsewhere, and nothing of the transaction is written; the same changeset
    again is no conflict (a commit applied twice). Both commits used to mark the steps, and
    the nodes were in the graph twice."""
    await _collected(backend)
    await backend.side_writes([StepsCommitted("s1", "e1", "c1", (("st1", 0.25),), None)])
    with pytest.raises(StepsCommittedElsewhere):
        await backend.side_writes([
            StepsCommitted("s1", "e1", "c2", (("st2", 0.5), ("st1", 0.5)), None),
            SourceRecorded(REPO, "doc-1", "hash1", "c2", WHEN),
        ])
    await backend.side_writes([StepsCommitted("s1", "e1", "c1", (("st1", 0.25),), None)])
    [live] = await backend.sessions.load_live()
    assert live.episode is not None
    assert [(s.reward, s.committed_in) for s in live.episode.steps] == [
        (0.25, "c1"), (None, None)
    ]
    assert await backend.rows("SELECT count(*) FROM ingests") == [(0,)]


async def test_steps_committed_without_an_episode_moves_the_state(backend: Backend) -> None:
    """With a state but no episode, the session moves and its changeset goes; the episode
    and the kept results stay."""
    await _collected(backend)
    await backend.side_writes([StepsCommitted("s1", None, "c1", (), State.IDLE.value)])
    [live] = await backend.sessions.load_live()
    assert (live.state, live.changeset) == (State.IDLE, None)
    log = await backend.sessions.episode("e1")
    assert log is not None
    assert log.status == "open"
    assert len(await backend.sessions.kept_results("e1")) == 1


async def test_source_recorded_then_forgotten(backend: Backend) -> None:
    """A recorded source is one `ingests` row with its time; forgetting it deletes only it."""
    await backend.side_writes([
        SourceRecorded(REPO, "doc-1", "hash1", "c1", WHEN),
        SourceRecorded(REPO, "doc-2", "hash2", "c2", WHEN),
    ])
    await backend.side_writes([SourceForgotten(REPO, "doc-1")])
    [(source, payload, changeset, created)] = await backend.rows(
        "SELECT source_id, payload_hash, changeset_id, created_at FROM ingests"
    )
    assert (source, payload, changeset) == ("doc-2", "hash2", "c2")
    if isinstance(created, str):  # SQLite keeps the text it was given
        created = datetime.fromisoformat(created)
    assert created == datetime.fromisoformat(WHEN).astimezone(UTC)


async def test_a_source_recorded_twice_fails_the_commit(backend: Backend) -> None:
    """Recording a source already recorded is a `StorageError` and writes nothing of the
    transaction's other side writes."""
    await _collected(backend)
    await backend.side_writes([SourceRecorded(REPO, "doc-1", "hash1", "c1", WHEN)])
    with pytest.raises(StorageError):
        await backend.side_writes([
            StepsCommitted("s1", "e1", "c2", (("st1", 0.5),), State.IDLE.value),
            SourceRecorded(REPO, "doc-1", "hash2", "c2", WHEN),
        ])
    log = await backend.sessions.episode("e1")
    assert log is not None
    assert log.status == "open"
    assert [s.committed_in for s in log.steps] == [None, None]


async def _commit_that_fails(pg: Postgres) -> None:
    """Side writes, then a graph write that breaks a constraint, in one transaction."""
    async with pg.transaction() as conn:
        await PgSessions.side_writes(PgStatements(conn), [
            StepsCommitted("s1", "e1", "c1", (("st1", 0.5),), State.IDLE.value),
            SourceRecorded(REPO, "doc-1", "hash1", "c1", WHEN),
        ])
        await conn.execute("INSERT INTO nodes(id) VALUES ('broken')")


async def test_side_writes_roll_back_with_the_graph_transaction(pg_url: str) -> None:
    """On PostgreSQL the side writes are the caller's transaction: a failure after them in the
    same block (the graph's own writes) leaves none of them."""
    async with Postgres(pg_url) as pg:
        backend = Backend("postgres", PgSessions(pg, ServerClock(pg)), pg=pg)
        await backend.sessions.save_repo(RepoRow(REPO, Config(), DIM, "hash:4"))
        await _collected(backend)
        with pytest.raises(StorageError):
            await _commit_that_fails(pg)
        [live] = await backend.sessions.load_live()
        assert live.state is State.READY
        assert await backend.rows("SELECT count(*) FROM ingests") == [(0,)]
        assert len(await backend.sessions.kept_results("e1")) == 1
