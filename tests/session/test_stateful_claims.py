"""Random programs of auto-commit sessions driven through two `Memory` objects on one store
(the API contract, "Storage backends and many processes": nothing is done twice or lost).

Appends through either Memory cross trajectory boundaries (each starts a background commit
there), flushes run on a short timeout in the session's driver, closes come through either
Memory, and either Memory's extraction may be held for a while, so that a boundary's commit,
a flush and a close of the same steps overlap in every order. Whatever the program, once every
session is closed and at rest, each appended step was asked of a model once, by one of the two
Memories, and is in the graph once (`step_claims`; before them, overlapping work asked about
the same steps twice).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, rule, run_state_machine_as_test

import mnemo
from mnemo import State
from tests.fakes import extracted_observations
from tests.session.two_memories import REPO, Worker, at_rest, let_go, store_per_example

AUTO = mnemo.Config(auto_commit=True, flush_timeout=0.2, session_timeout=None)
# The FakeLLM's subgoal is an observation's first word: a new word is a boundary.
WORDS = ["walk", "open", "look"]
SETTLE = 30.0
# What an append or a close may be refused while another call moved the session.
REFUSED = {"not_collecting", "extraction_in_progress", "append_in_progress", "not_idle"}


class TwoDrivers(RuleBasedStateMachine):
    sessions = Bundle("sessions")

    def __init__(self, store: str) -> None:
        super().__init__()
        self.count = itertools.count()
        self.appended: list[str] = []
        with ExitStack() as setup:
            self.portal = setup.enter_context(anyio.from_thread.start_blocking_portal())
            self.workers = [Worker(self.portal, store, AUTO), Worker(self.portal, store, AUTO)]
            for worker in self.workers:
                setup.callback(worker.stack.close)
            self.stack = setup.pop_all()

    def call(self, m: int, name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.workers[m].mem, name)
        return self.portal.call(lambda: method(*args, **kwargs))

    def tried(self, m: int, name: str, *args: Any) -> bool:
        """Calls Memory `m`; False when the session had moved under the call (refused)."""
        try:
            self.call(m, name, *args)
        except mnemo.SessionError as refused:
            reason = refused.reason
        else:
            return True
        assert reason in REFUSED
        return False

    @rule(target=sessions, m=st.integers(0, 1))
    def start_session(self, m: int) -> str:
        sid: str = self.call(m, "start_session", "explore the house", repo=REPO)
        return sid

    @rule(m=st.integers(0, 1), sid=sessions, word=st.sampled_from(WORDS))
    def append(self, m: int, sid: str, word: str) -> None:
        observation = f"{word} {next(self.count)}"
        if self.tried(m, "append", sid, observation, "act"):
            self.appended.append(observation)

    @rule(m=st.integers(0, 1), sid=sessions)
    def close(self, m: int, sid: str) -> None:
        self.tried(m, "close", sid)

    @rule(m=st.integers(0, 1), sid=sessions)
    def start_episode(self, m: int, sid: str) -> None:
        self.tried(m, "start_episode", sid, "explore again")

    @rule(m=st.integers(0, 1))
    def hold(self, m: int) -> None:
        """Memory `m`'s extractions wait at their semantic task until let go."""
        llm = self.workers[m].llm
        if "semantic" not in llm.holds:
            self.portal.call(lambda: llm.hold("semantic"))

    @rule(m=st.integers(0, 1))
    def let_go(self, m: int) -> None:
        self.portal.call(let_go, self.workers[m].llm)

    def teardown(self) -> None:
        """Every session closed and at rest: each appended step asked once, in the graph
        once."""
        try:
            for worker in self.workers:
                self.portal.call(let_go, worker.llm)
            for session in self.call(0, "list_sessions"):
                self.portal.call(self._closed, session.id)
            asked = Counter(o for w in self.workers for o in extracted_observations(w.llm))
            assert {o: n for o, n in asked.items() if n > 1} == {}
            assert sorted(asked) == sorted(self.appended)
            nodes = self.call(0, "get_nodes_by_type", REPO, [mnemo.NodeType.EPISODIC])
            assert sorted(n.text.split(" -> ")[0] for n in nodes) == sorted(self.appended)
        finally:
            self.stack.close()

    async def _closed(self, sid: str) -> None:
        """Closes the session whenever it collects, until it is idle (its extraction may
        run in either Memory: both are waited on)."""
        with anyio.fail_after(SETTLE):
            while (state := await self._at_rest(sid)) is not State.IDLE:
                assert state is State.COLLECTING, self._failures(sid)
                reason = None
                try:
                    await self.workers[0].mem.close(sid)
                except mnemo.SessionError as refused:
                    reason = refused.reason
                assert reason is None or reason in REFUSED

    def _failures(self, sid: str) -> list[object]:
        """What each Memory recorded as the session's failure (None where nothing)."""
        return [getattr(w.mem._live.by_id.get(sid), "failure", None) for w in self.workers]

    async def _at_rest(self, sid: str) -> State:
        """The session's state once no extraction runs, wherever it runs."""
        return await at_rest(self.workers, sid, State.IDLE, State.COLLECTING, State.FAILED,
                             within=SETTLE)


@pytest.mark.slow
def test_auto_commit_programs_through_two_memories_extract_each_step_once(
    fresh_stores: Callable[[], str], tmp_path: Path, sqlite_template: Path
) -> None:
    """Random auto-commit programs through two Memories, on each backend: every step is
    asked of a model once and is in the graph once."""
    new_store = store_per_example(fresh_stores, tmp_path, sqlite_template)

    class OnAFreshStore(TwoDrivers):
        def __init__(self) -> None:
            super().__init__(new_store())

    run_state_machine_as_test(
        OnAFreshStore, settings=settings(max_examples=15, stateful_step_count=25, deadline=None)
    )
