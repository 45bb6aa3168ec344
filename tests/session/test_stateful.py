"""Random call sequences against a model of the API contract's session state table."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import anyio.from_thread
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

import mnemo
from mnemo import State
from tests.fakes import EventLog, FakeLLM, invoke, open_test_memory

REPO = "r"

# The state table: which sync calls each state refuses, and with which reason. Extracting is
# never observed here: every rule that starts an extraction waits for it to end.
REFUSED: dict[State, dict[str, str]] = {
    State.IDLE: {
        "append": "not_collecting",
        "close": "not_collecting",
        "commit": "not_ready",
        "discard": "not_discardable",
    },
    State.COLLECTING: {
        "start_episode": "not_idle",
        "commit": "not_ready",
        "discard": "not_discardable",
    },
    State.READY: {"start_episode": "not_idle", "append": "not_idle", "close": "not_idle"},
    State.FAILED: {
        "start_episode": "session_failed",
        "append": "session_failed",
        "close": "session_failed",
    },
}

OBSERVATIONS = ["walk north", "walk south", "open door", "take key"]


class SessionRules(RuleBasedStateMachine):
    sessions = Bundle("sessions")

    def __init__(self, store: str = ":memory:") -> None:
        super().__init__()
        self.llm = FakeLLM()
        self.events = EventLog()
        self.stack = ExitStack()
        with ExitStack() as setup:
            self.portal = setup.enter_context(anyio.from_thread.start_blocking_portal())
            self.mem = setup.enter_context(
                self.portal.wrap_async_context_manager(
                    open_test_memory(store, llm=self.llm, on_event=self.events)
                )
            )
            self.call("open_repo", REPO)
            # Set up: from here on `teardown` closes the portal and the memory.
            self.stack = setup.pop_all()
        self.expected: dict[str, State] = {}
        self.steps: dict[str, int] = {}
        self.ended: set[str] = set()
        self.extraction_fails = False

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.portal.call(lambda: invoke(getattr(self.mem, name), *args, **kwargs))

    def settle(self, sid: str) -> State:
        """Waits for the extraction the last call started to end; returns where it landed."""
        return self.portal.call(
            lambda: self.events.wait_state(self.mem, sid, State.READY, State.FAILED)
        )

    def extraction_outcome(self, sid: str) -> State:
        # An episode without steps has no trajectory to extract, so nothing can fail.
        return State.FAILED if self.extraction_fails and self.steps[sid] else State.READY

    def attempt(self, sid: str, name: str, *args: Any) -> tuple[bool, Any]:
        """Makes the call; if the model says the state refuses it, checks the refusal instead."""
        if sid in self.ended:
            with pytest.raises(mnemo.NotFoundError) as unknown:
                self.call(name, sid, *args)
            assert (unknown.value.resource, unknown.value.id) == ("session", sid)
            return False, None
        state = self.expected[sid]
        reason = REFUSED[state].get(name)
        if reason is None:
            return True, self.call(name, sid, *args)
        with pytest.raises(mnemo.SessionError) as refused:
            self.call(name, sid, *args)
        assert (refused.value.reason, refused.value.state) == (reason, state)
        return False, None

    @rule(target=sessions, goal=st.sampled_from(["explore the house", "find the key"]))
    def start_session(self, goal: str) -> str:
        sid: str = self.call("start_session", goal, repo=REPO)
        assert sid.startswith("session_")
        self.expected[sid] = State.COLLECTING
        self.steps[sid] = 0
        return sid

    @rule(failing=st.booleans())
    def set_extraction_failure(self, failing: bool) -> None:
        self.extraction_fails = failing
        self.portal.call(self._fail_semantic, failing)

    def _fail_semantic(self, failing: bool) -> None:
        if failing:
            self.llm.fail_tasks.add("semantic")
        else:
            self.llm.fail_tasks.discard("semantic")

    @rule(sid=sessions, observation=st.sampled_from(OBSERVATIONS))
    def append(self, sid: str, observation: str) -> None:
        ran, info = self.attempt(sid, "append", observation, "act")
        if ran:
            assert info.index == self.steps[sid]
            self.steps[sid] += 1

    @rule(sid=sessions)
    def close(self, sid: str) -> None:
        ran, _ = self.attempt(sid, "close")
        if ran:
            expected = self.extraction_outcome(sid)
            assert self.settle(sid) == expected
            self.expected[sid] = expected

    @rule(sid=sessions)
    def commit(self, sid: str) -> None:
        was = self.expected.get(sid)
        ran, receipt = self.attempt(sid, "commit")
        if not ran:
            return
        if was is State.READY:
            assert isinstance(receipt.node_ids, list)
            self.expected[sid] = State.IDLE
        else:
            assert was is State.FAILED
            assert receipt is None
            expected = self.extraction_outcome(sid)
            assert self.settle(sid) == expected
            self.expected[sid] = expected

    @rule(sid=sessions)
    def discard(self, sid: str) -> None:
        ran, _ = self.attempt(sid, "discard")
        if ran:
            self.expected[sid] = State.IDLE

    @rule(sid=sessions, goal=st.sampled_from(["open the door", "read the note"]))
    def start_episode(self, sid: str, goal: str) -> None:
        ran, _ = self.attempt(sid, "start_episode", goal)
        if ran:
            self.expected[sid] = State.COLLECTING
            self.steps[sid] = 0

    @rule(sid=sessions)
    def end_session(self, sid: str) -> None:
        # The table leaves end_session open in ready and failed ("every other call" may or may
        # not cover it), so the model only ends sessions that are idle or collecting.
        if self.expected.get(sid) in (State.READY, State.FAILED):
            return
        ran, _ = self.attempt(sid, "end_session")
        if ran:
            del self.expected[sid]
            self.ended.add(sid)

    @invariant()
    def states_match_model(self) -> None:
        for sid, state in self.expected.items():
            assert self.call("session_state", sid) == state

    def teardown(self) -> None:
        self.stack.close()


@pytest.mark.slow
def test_session_rules(fresh_stores: Callable[[], str]) -> None:
    """Random programs of session calls keep the state table, on each backend (a new store
    per example)."""

    class OnAFreshStore(SessionRules):
        def __init__(self) -> None:
            super().__init__(fresh_stores())

    run_state_machine_as_test(
        OnAFreshStore, settings=settings(max_examples=50, stateful_step_count=30, deadline=None)
    )
