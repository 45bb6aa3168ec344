"""`SessionStore` method by method, the same assertions on SQLite's and PostgreSQL's stores:
what one stores, the other stores and returns alike."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from mnemo.config import Config
from mnemo.episode import NO_VECTOR, EpisodeRecord, StepRecord
from mnemo.errors import StorageError
from mnemo.extraction.memo import KeptResult
from mnemo.graph.model import Changeset, Link, LinkType, NodeDraft, NodeType
from mnemo.ports import Usage
from mnemo.session.machine import State
from mnemo.session.ports import RepoRow, StaleSession
from tests.pg import pg_clones, pg_server, pg_template, pg_url
from tests.storage.postgres.session_backends import (
    DIM,
    REPO,
    Backend,
    backend,
    backend_place,
    live_view,
    open_backend,
    step,
    step_view,
)

__all__ = ["backend", "backend_place", "pg_clones", "pg_server", "pg_template", "pg_url"]


def _changeset(changeset_id: str, step_ids: list[str]) -> Changeset:
    node = NodeDraft("n1", NodeType.SEMANTIC, "the door opens", {"weight": 0.5},
                     np.full(DIM, 0.25, dtype=np.float32), key=None, source_id="src")
    tag = NodeDraft("n2", NodeType.TAG, "doors", {}, np.ones(DIM, dtype=np.float32),
                    key="doors")
    return Changeset(changeset_id, REPO, [node, tag], [Link("n1", "n2", LinkType.MEMBERSHIP)],
                     step_ids)


def _kept(task: str, text: str, *, digest: str = "d1") -> KeptResult:
    return KeptResult("t1", task, digest, text, {"facts": [text]}, Usage(3, 4, calls=2))


async def _session(backend: Backend, sid: str = "s1", episode: str = "e1") -> None:
    await backend.sessions.create_session(sid, REPO, Config(), EpisodeRecord(episode, "goal"))


async def test_save_repo_upserts_models_and_keeps_the_dimension(backend: Backend) -> None:
    """A second save of a repo updates its config and models but not its dimension, and repos
    load in the order they were first saved."""
    store = backend.sessions
    await store.save_repo(RepoRow("b-repo", Config(), 8, "hash:8", "fake:llm"))
    changed = Config(recall_candidates=7)
    await store.save_repo(RepoRow(REPO, changed, 99, "minilm", "other:llm"))
    repos = await store.load_repos()
    assert repos == [
        RepoRow(REPO, changed, DIM, "minilm", "other:llm"),
        RepoRow("b-repo", Config(), 8, "hash:8", "fake:llm"),
    ]


async def test_create_session_is_live_collecting_its_empty_episode(backend: Backend) -> None:
    """A created session comes back live: COLLECTING, its config, an open empty episode, no
    changeset, no model."""
    await backend.sessions.create_session(
        "s1", REPO, Config(recall_candidates=9), EpisodeRecord("e1", "find the door")
    )
    [live] = await backend.sessions.load_live()
    assert live_view(live) == (
        "s1", REPO, State.COLLECTING, Config(recall_candidates=9), ("e1", "find the door", []),
        None, None,
    )


async def test_create_session_of_an_unknown_repo_is_a_storage_error(backend: Backend) -> None:
    """A session must belong to a recorded repo: nothing is written otherwise."""
    with pytest.raises(StorageError):
        await backend.sessions.create_session("s1", "nope", Config(), EpisodeRecord("e1", "g"))
    assert await backend.sessions.load_live() == []
    assert await backend.sessions.episode("e1") is None


async def test_a_step_stored_then_annotated_with_the_previous_reward(backend: Backend) -> None:
    """A step is stored before its annotation (empty trajectory, state, subgoal, vector),
    then annotated once, with the previous step's reward; steps come back by index with
    their vectors and metadata, and a second annotation of the same step writes nothing."""
    await _session(backend)
    store = backend.sessions
    first = step("st1", 0, metadata={"tool": "door", "n": [1, 2.5, None]})
    await store.add_step("s1", "e1", first)
    stored = StepRecord("st2", 1, "", "obs 1", "act 1", "", "", NO_VECTOR)
    before = await store.add_step("s1", "e1", stored)
    [live] = await store.load_live()
    assert live.episode is not None
    assert not live.episode.steps[1].annotated
    assert live.episode.steps[1].subgoal_vec.size == 0
    scored = step("st1", 0, reward=0.75, metadata={"tool": "door", "n": [1, 2.5, None]})
    second = step("st2", 1, trajectory="t2")
    assert await store.annotate_step("s1", "e1", second, scored) == before + 1
    assert await store.annotate_step("s1", "e1", step("st2", 1, trajectory="t9"), None) is None
    [live] = await store.load_live()
    assert live.episode is not None
    assert [step_view(s) for s in live.episode.steps] == [step_view(scored), step_view(second)]
    assert live.episode.steps[0].subgoal_vec.dtype == np.float32
    assert live.version == before + 1


async def test_add_step_to_another_episode_is_refused(backend: Backend) -> None:
    """A step must belong to the episode the session is collecting: else nothing is written
    and the writer learns that the session moved (StaleSession)."""
    await _session(backend)
    with pytest.raises(StaleSession):
        await backend.sessions.add_step("s1", "nope", step("st1", 0))
    assert [e.steps for e in await backend.sessions.episodes("s1")] == [[]]


async def test_set_state_records_the_model_only_when_given(backend: Backend) -> None:
    """`set_state` moves the state; a model given is kept by later calls that give none."""
    await _session(backend)
    store = backend.sessions
    await store.set_state("s1", State.EXTRACTING, model="fake:llm")
    await store.set_state("s1", State.FAILED)
    [live] = await store.load_live()
    assert (live.state, live.model) == (State.FAILED, "fake:llm")


async def test_save_extraction_keeps_one_changeset_rewards_and_ready(backend: Backend) -> None:
    """The changeset of the last save is the session's, scored rewards are stored, and the
    session is READY."""
    await _session(backend)
    store = backend.sessions
    await store.add_step("s1", "e1", step("st1", 0))
    await store.save_extraction("s1", _changeset("c0", []), [])
    await store.save_extraction("s1", _changeset("c1", ["st1"]), [step("st1", 0, reward=-0.5)])
    [live] = await store.load_live()
    assert live.state is State.READY
    assert live.changeset is not None
    assert live.changeset.to_json() == _changeset("c1", ["st1"]).to_json()
    assert live.episode is not None
    assert [s.reward for s in live.episode.steps] == [-0.5]
    assert await backend.rows("SELECT id FROM changesets") == [("c1",)]


async def test_discard_drops_changeset_kept_results_and_the_episode(backend: Backend) -> None:
    """Discarding closes the episode as discarded, drops its changeset and kept results, and
    leaves the session IDLE with no episode."""
    await _session(backend)
    store = backend.sessions
    await store.add_step("s1", "e1", step("st1", 0))
    await store.keep_result("e1", _kept("semantic", "a fact"))
    await store.save_extraction("s1", _changeset("c1", ["st1"]), [])
    await store.discard("s1", "e1")
    [live] = await store.load_live()
    assert (live.state, live.episode, live.changeset) == (State.IDLE, None, None)
    assert await store.kept_results("e1") == []
    log = await store.episode("e1")
    assert log is not None
    assert log.status == "discarded"
    assert log.closed_at is not None
    assert log.closed_at >= log.started_at


async def test_discard_without_an_episode_only_idles(backend: Backend) -> None:
    """A discard with no episode drops the changeset and leaves the episode alone."""
    await _session(backend)
    await backend.sessions.save_extraction("s1", _changeset("c1", []), [])
    await backend.sessions.discard("s1", None)
    [live] = await backend.sessions.load_live()
    assert (live.state, live.changeset) == (State.IDLE, None)
    log = await backend.sessions.episode("e1")
    assert log is not None
    assert (log.status, log.closed_at) == ("open", None)


async def test_end_hides_the_session_but_keeps_its_log(backend: Backend) -> None:
    """An ended session is not live any more; its episodes stay readable."""
    await _session(backend)
    await _session(backend, "s2", "e2")
    await backend.sessions.end("s1")
    assert [live.id for live in await backend.sessions.load_live()] == ["s2"]
    assert [log.id for log in await backend.sessions.episodes("s1")] == ["e1"]


async def test_load_live_orders_sessions_by_creation(backend: Backend) -> None:
    """Live sessions come back in the order they were created, each with its open episode."""
    for sid in ("zz", "aa", "mm"):
        await _session(backend, sid, f"e-{sid}")
    live = await backend.sessions.load_live()
    assert [(s.id, s.episode.id if s.episode else None) for s in live] == [
        ("zz", "e-zz"), ("aa", "e-aa"), ("mm", "e-mm")
    ]


async def test_start_episode_replaces_the_open_one_and_episodes_lists_all(
    backend: Backend,
) -> None:
    """A new episode becomes the session's (COLLECTING); `episodes` lists every episode oldest
    first, ending with the open one, with its steps; an unknown session has none."""
    await _session(backend)
    store = backend.sessions
    await store.add_step("s1", "e1", step("st1", 0))
    await store.discard("s1", "e1")
    await store.start_episode("s1", EpisodeRecord("e0-second", "second goal"))
    await store.add_step("s1", "e0-second", step("st2", 0))
    [live] = await store.load_live()
    assert live.state is State.COLLECTING
    assert live.episode is not None
    assert live.episode.id == "e0-second"
    logs = await store.episodes("s1")
    # Oldest first even though the ids sort the other way.
    assert [(log.id, log.status, [s.id for s in log.steps]) for log in logs] == [
        ("e1", "discarded", ["st1"]), ("e0-second", "open", ["st2"])
    ]
    assert logs[0].started_at <= logs[1].started_at
    assert all(log.started_at.utcoffset() == datetime.now(UTC).utcoffset() for log in logs)
    assert await store.episodes("nope") == []


async def test_episode_reads_one_log_or_none(backend: Backend) -> None:
    """`episode` returns a stored episode with its steps and None for an unknown id."""
    await _session(backend)
    await backend.sessions.add_step("s1", "e1", step("st1", 0))
    log = await backend.sessions.episode("e1")
    assert log is not None
    assert (log.id, log.session_id, log.goal, log.status) == ("e1", "s1", "goal", "open")
    assert [step_view(s) for s in log.steps] == [step_view(step("st1", 0))]
    assert await backend.sessions.episode("nope") is None


async def test_keep_result_is_idempotent_and_the_last_reply_wins(backend: Backend) -> None:
    """Keeping a result twice under one key stores one (the last); results come back in key
    order with their reply, data and cost."""
    await _session(backend)
    store = backend.sessions
    await store.keep_result("e1", _kept("semantic", "first"))
    await store.keep_result("e1", _kept("semantic", "second"))
    await store.keep_result("e1", _kept("procedural", "steps", digest="d0"))
    kept = await store.kept_results("e1")
    assert kept == [_kept("procedural", "steps", digest="d0"), _kept("semantic", "second")]
    assert [k.cost.calls for k in kept] == [2, 2]
    assert await store.kept_results("other") == []


async def test_a_nan_reward_reads_back_as_none(backend: Backend) -> None:
    """A NaN reward, appended or scored, is stored as no reward (SQLite's REAL keeps no NaN)."""
    await _session(backend)
    store = backend.sessions
    await store.add_step("s1", "e1", step("st1", 0, reward=float("nan")))
    await store.add_step("s1", "e1", StepRecord("st2", 1, "", "obs 1", "act 1", "", "", NO_VECTOR))
    await store.annotate_step("s1", "e1", step("st2", 1), step("st1", 0, reward=float("nan")))
    await store.save_extraction("s1", _changeset("c1", []), [step("st2", 1, reward=float("nan"))])
    [live] = await store.load_live()
    assert live.episode is not None
    assert [s.reward for s in live.episode.steps] == [None, None]


async def test_a_nul_character_is_a_storage_error_on_postgres(pg_url: str) -> None:
    """PostgreSQL's text holds no NUL character: a step with one is refused as a
    `StorageError` and nothing of it is written (SQLite stores it)."""
    async with open_backend("postgres", pg_url) as opened:
        store = opened.sessions
        await store.save_repo(RepoRow(REPO, Config(), DIM, "hash:4"))
        await store.create_session("s1", REPO, Config(), EpisodeRecord("e1", "goal"))
        bad = step("st1", 0)
        bad.observation = "a\x00b"
        with pytest.raises(StorageError):
            await store.add_step("s1", "e1", bad)
        assert await opened.rows("SELECT count(*) FROM steps") == [(0,)]
