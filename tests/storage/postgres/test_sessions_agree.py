"""SQLite's and PostgreSQL's `SessionStore`s agree: random sequences of every write
of the port, and the commit's side writes, applied to both leave the same live sessions,
episode logs and kept results."""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar

import anyio.from_thread
import numpy as np
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.extra.numpy import arrays
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
    run_state_machine_as_test,
)

from mnemo.config import Config
from mnemo.episode import NO_VECTOR, EpisodeRecord, StepRecord
from mnemo.extraction.memo import KeptResult
from mnemo.graph.model import Changeset
from mnemo.graph.ports import SideWrite, StepsCommitted
from mnemo.ports import Usage
from mnemo.session.machine import State
from mnemo.session.ports import RepoRow, StaleSession, StepsCommittedElsewhere
from tests.pg import pg_clones, pg_server, pg_template, pg_url
from tests.storage.postgres.session_backends import (
    DIM,
    REPO,
    Backend,
    live_view,
    log_view,
    open_backend,
)
from tests.strategies import vector_components

__all__ = ["pg_clones", "pg_server", "pg_template", "pg_url"]

# PostgreSQL's text and jsonb hold no NUL character (SQLite's do), neither driver takes a lone
# surrogate, and jsonb keeps a number's decimal value, not its spelling: a float of 1e16 or more
# (`1e+16` in JSON) comes back as an int (docs/DECISIONS.md).
_chars = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
texts = st.text(_chars, max_size=12)
_scalars = (
    st.none() | st.booleans() | st.integers(-(2**53), 2**53)
    | st.floats(-1e15, 1e15) | texts
)
metadata = st.none() | st.dictionaries(
    st.text(_chars, max_size=6),
    st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=6),
    max_size=3,
)
rewards = st.none() | st.floats(-1.0, 1.0)
configs = st.sampled_from([Config(), Config(recall_candidates=7)])
states = st.sampled_from(list(State))
_TABLES = "repos, sessions, episodes, steps, changesets, task_results, ingests"


class SessionStoresAgree(RuleBasedStateMachine):
    """The same calls on both stores; after each, both read back the same."""

    pg_url: ClassVar[str] = ""
    sessions = Bundle("sessions")

    def __init__(self) -> None:
        super().__init__()
        self.stack = ExitStack()
        self.portal = self.stack.enter_context(anyio.from_thread.start_blocking_portal())
        folder = self.stack.enter_context(tempfile.TemporaryDirectory())
        self.backends: list[Backend] = [
            self.stack.enter_context(self.portal.wrap_async_context_manager(
                open_backend("sqlite", Path(folder)))),
            self.stack.enter_context(self.portal.wrap_async_context_manager(
                open_backend("postgres", self.pg_url))),
        ]
        # One database serves every example: each starts from empty tables.
        self.portal.call(self._truncate)
        self._each(lambda b: b.sessions.save_repo(RepoRow(REPO, Config(), DIM, "hash:4")))
        self.counter = 0
        self.episode: dict[str, str] = {}
        self.steps: dict[str, list[StepRecord]] = {}

    async def _truncate(self) -> None:
        pg = self.backends[1].pg
        assert pg is not None
        async with pg.connection() as conn:
            await conn.execute(f"TRUNCATE {_TABLES}")

    def _each(self, call: Any) -> None:
        """Runs `call` on both backends; either both refuse it (the same exception type) or
        neither does."""
        refused: list[type[BaseException] | None] = []
        for backend in self.backends:
            try:
                self.portal.call(call, backend)
            except StepsCommittedElsewhere as exc:
                refused.append(type(exc))
            else:
                refused.append(None)
        assert refused[0] == refused[1]

    def _next(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    @rule(target=sessions, config=configs, goal=texts)
    def create(self, config: Config, goal: str) -> str:
        sid, episode = self._next("s"), self._next("e")
        self._each(lambda b: b.sessions.create_session(
            sid, REPO, config, EpisodeRecord(episode, goal)))
        self.episode[sid], self.steps[episode] = episode, []
        return sid

    @rule(sid=sessions, goal=texts)
    def start_episode(self, sid: str, goal: str) -> None:
        episode = self._next("e")
        self._each(lambda b: b.sessions.start_episode(sid, EpisodeRecord(episode, goal)))
        self.episode[sid], self.steps[episode] = episode, []

    @rule(sid=sessions, texts=st.lists(texts, min_size=5, max_size=5), meta=metadata,
          vec=arrays(np.float32, (DIM,), elements=vector_components), reward=rewards,
          score_previous=st.booleans())
    def add_step(self, sid: str, texts: list[str], meta: dict[str, Any] | None,
                 vec: Any, reward: float | None, score_previous: bool) -> None:
        episode = self.episode[sid]
        steps = self.steps[episode]
        new = StepRecord(self._next("st"), len(steps), texts[0], texts[1], texts[2], texts[3],
                         texts[4], vec, None, meta)
        previous = None
        if score_previous and steps:
            last = steps[-1]
            previous = StepRecord(last.id, last.index, last.trajectory_id, last.observation,
                                  last.action, last.state_summary, last.subgoal,
                                  last.subgoal_vec, reward, last.metadata)
        stored = StepRecord(new.id, new.index, "", new.observation, new.action, "", "",
                            NO_VECTOR, metadata=meta)
        refused = []
        for backend in self.backends:
            try:
                self.portal.call(backend.sessions.add_step, sid, episode, stored)
            except StaleSession:
                refused.append(backend)
        # A step lands only while the session collects that episode: on both or on neither.
        assert len(refused) in (0, len(self.backends))
        if refused:
            return
        steps.append(stored)
        # Then its annotation, with the previous step's reward.
        versions = [self.portal.call(b.sessions.annotate_step, sid, episode, new, previous)
                    for b in self.backends]
        assert [v is None for v in versions] == [False, False]
        steps[-1] = new
        if previous is not None:
            steps[-2] = previous

    @rule(sid=sessions, state=states, model=st.none() | st.sampled_from(["a:llm", "b:llm"]))
    def set_state(self, sid: str, state: State, model: str | None) -> None:
        self._each(lambda b: b.sessions.set_state(sid, state, model=model))

    @rule(sid=sessions, scores=st.lists(rewards, max_size=4))
    def save_extraction(self, sid: str, scores: list[float | None]) -> None:
        steps = self.steps[self.episode[sid]]
        scored = [StepRecord(s.id, s.index, s.trajectory_id, s.observation, s.action,
                             s.state_summary, s.subgoal, s.subgoal_vec, reward)
                  for s, reward in zip(steps, scores, strict=False)]
        changeset = Changeset(self._next("c"), REPO, step_ids=[s.id for s in steps])
        self._each(lambda b: b.sessions.save_extraction(sid, changeset, scored))

    @rule(sid=sessions, with_episode=st.booleans())
    def discard(self, sid: str, with_episode: bool) -> None:
        episode = self.episode[sid] if with_episode else None
        self._each(lambda b: b.sessions.discard(sid, episode))

    # An ended session leaves the bundle: the service never writes to one again, and the
    # other rules then work on sessions that `load_live` still shows.
    @rule(sid=consumes(sessions))
    def end(self, sid: str) -> None:
        self._each(lambda b: b.sessions.end(sid))

    @rule(sid=sessions, task=st.sampled_from(["semantic", "procedural"]),
          digest=st.sampled_from(["d1", "d2"]), text=texts)
    def keep_result(self, sid: str, task: str, digest: str, text: str) -> None:
        kept = KeptResult("t1", task, digest, text, {"facts": [text]}, Usage(1, 2, calls=1))
        self._each(lambda b: b.sessions.keep_result(self.episode[sid], kept))

    @rule(sid=sessions, reward=rewards, state=st.none() | st.just(State.IDLE.value),
          with_episode=st.booleans())
    def commit(self, sid: str, reward: float | None, state: str | None,
               with_episode: bool) -> None:
        """The session side of a graph commit, in a transaction of its own (refused alike
        when a step is already committed in another changeset)."""
        steps = self.steps[self.episode[sid]]
        writes: list[SideWrite] = [StepsCommitted(
            sid, self.episode[sid] if with_episode else None, self._next("c"),
            tuple((s.id, reward) for s in steps), state)]
        self._each(lambda b: b.side_writes(writes))

    @invariant()
    def both_read_the_same(self) -> None:
        """Live sessions, every session's episodes and every episode's kept results agree."""
        views = []
        for backend in self.backends:
            store = backend.sessions
            live = [live_view(s) for s in self.portal.call(store.load_live)]
            logs = {sid: [log_view(e) for e in self.portal.call(store.episodes, sid)]
                    for sid in self.episode}
            one = {e: self.portal.call(store.episode, e) for e in self.steps}
            kept = {e: self.portal.call(store.kept_results, e) for e in self.steps}
            views.append((live, logs, {e: log and log_view(log) for e, log in one.items()},
                          {e: [(k, k.cost.calls) for k in ks] for e, ks in kept.items()}))
        assert views[0] == views[1]

    def teardown(self) -> None:
        self.stack.close()


def test_sqlite_and_postgres_sessions_agree(pg_url: str) -> None:
    """Any sequence of session writes leaves SQLite's and PostgreSQL's stores reading alike."""
    SessionStoresAgree.pg_url = pg_url
    run_state_machine_as_test(
        SessionStoresAgree,
        settings=settings(max_examples=20, stateful_step_count=15, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )
