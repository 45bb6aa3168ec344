"""The state machine table: every (state, event) pair has a deliberate answer, given by the
`transitions` machine that moves the sessions' records."""

from __future__ import annotations

import pytest

from mnemo.config import Config
from mnemo.session.machine import (
    CALLS,
    REFUSALS,
    RESULTS,
    STALE,
    Runtime,
    SessionRecord,
    State,
    current_state,
    new_machine,
    refusal,
)
from tests.fakes import FakeEmbedder, FakeLLM

S = State

# The API contract's state table, cell by cell: a destination, or the reason of a refusal.
EXPECTED: dict[tuple[State, str], State | str] = {
    (S.IDLE, "start_episode"): S.COLLECTING,
    (S.IDLE, "append"): "not_collecting",
    (S.IDLE, "close"): "not_collecting",
    (S.IDLE, "commit"): "not_ready",
    (S.IDLE, "discard"): "not_discardable",
    (S.COLLECTING, "start_episode"): "not_idle",
    (S.COLLECTING, "append"): S.COLLECTING,
    (S.COLLECTING, "close"): S.EXTRACTING,
    (S.COLLECTING, "commit"): "not_ready",
    (S.COLLECTING, "discard"): "not_discardable",
    **{(S.EXTRACTING, call): "extraction_in_progress" for call in CALLS},
    (S.READY, "start_episode"): "not_idle",
    (S.READY, "append"): "not_idle",
    (S.READY, "close"): "not_idle",
    (S.READY, "commit"): S.IDLE,
    (S.READY, "discard"): S.IDLE,
    (S.FAILED, "start_episode"): "session_failed",
    (S.FAILED, "append"): "session_failed",
    (S.FAILED, "close"): "session_failed",
    (S.FAILED, "commit"): S.EXTRACTING,
    (S.FAILED, "discard"): S.IDLE,
}


def record(state: State) -> SessionRecord:
    session = SessionRecord("s", "r", Runtime(FakeLLM(), FakeEmbedder(), Config()), None,
                            Config())
    new_machine().add_model(session, initial=state)
    return session


@pytest.mark.parametrize(("state", "call"), list(EXPECTED))
def test_every_call_in_every_state_matches_the_api_table(state: State, call: str) -> None:
    """Each (state, call) cell answers as the API contract's state table says, and the
    machine fires exactly the moves it allows."""
    session = record(state)
    expected = EXPECTED[state, call]
    if isinstance(expected, State):
        assert refusal(session, call) is None
        session.trigger(call)
        assert session.state is expected
    else:
        assert refusal(session, call) == expected
        assert REFUSALS[state][call] == expected


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("result", RESULTS)
def test_background_results_are_answered_in_every_state(state: State, result: str) -> None:
    """A background result moves an extracting session and is stale anywhere else."""
    expected = {"extraction_succeeded": S.READY, "extraction_failed": S.FAILED,
                "auto_committed": S.IDLE}[result]
    session = record(state)
    if state is S.EXTRACTING:
        assert refusal(session, result) is None
        session.trigger(result)
        assert session.state is expected
    else:
        assert refusal(session, result) == STALE


def test_a_close_waits_for_the_appends_before_it() -> None:
    """The table's condition on `close`: refused `append_in_progress` while an append the
    caller counted runs, and allowed once none does."""
    session = record(S.COLLECTING)
    assert refusal(session, "close", appends=1) == "append_in_progress"
    assert refusal(session, "close", appends=0) is None
    session.trigger("close", appends=1)
    assert current_state(session) is S.COLLECTING
    session.trigger("close", appends=0)
    assert current_state(session) is S.EXTRACTING


def test_an_unknown_event_is_an_error() -> None:
    """An event outside the table is a programming error, not a silent no-op."""
    session = record(S.IDLE)
    with pytest.raises(ValueError, match="unknown session event"):
        refusal(session, "explode")
