"""The state machine table: every (state, event) pair has a deliberate answer, and the
`transitions` machine agrees with it."""

from __future__ import annotations

import pytest

from mnemo.session.machine import (
    CALLS,
    REFUSALS,
    RESULTS,
    Move,
    Refuse,
    SessionModel,
    SharedMachine,
    Stale,
    State,
    answer,
)

S = State

# The API contract's state table, cell by cell.
EXPECTED: dict[tuple[State, str], Move | Refuse] = {
    (S.IDLE, "start_episode"): Move(S.COLLECTING),
    (S.IDLE, "append"): Refuse("not_collecting"),
    (S.IDLE, "close"): Refuse("not_collecting"),
    (S.IDLE, "commit"): Refuse("not_ready"),
    (S.IDLE, "discard"): Refuse("not_discardable"),
    (S.COLLECTING, "start_episode"): Refuse("not_idle"),
    (S.COLLECTING, "append"): Move(S.COLLECTING),
    (S.COLLECTING, "close"): Move(S.EXTRACTING),
    (S.COLLECTING, "commit"): Refuse("not_ready"),
    (S.COLLECTING, "discard"): Refuse("not_discardable"),
    **{(S.EXTRACTING, call): Refuse("extraction_in_progress") for call in CALLS},
    (S.READY, "start_episode"): Refuse("not_idle"),
    (S.READY, "append"): Refuse("not_idle"),
    (S.READY, "close"): Refuse("not_idle"),
    (S.READY, "commit"): Move(S.IDLE),
    (S.READY, "discard"): Move(S.IDLE),
    (S.FAILED, "start_episode"): Refuse("session_failed"),
    (S.FAILED, "append"): Refuse("session_failed"),
    (S.FAILED, "close"): Refuse("session_failed"),
    (S.FAILED, "commit"): Move(S.EXTRACTING),
    (S.FAILED, "discard"): Move(S.IDLE),
}


@pytest.mark.parametrize(("state", "call"), list(EXPECTED))
def test_every_call_in_every_state_matches_the_api_table(state: State, call: str) -> None:
    """Each (state, call) cell answers as the API contract's state table says."""
    assert answer(state, call) == EXPECTED[state, call]


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("result", RESULTS)
def test_background_results_are_answered_in_every_state(state: State, result: str) -> None:
    """A background result moves an extracting session and is stale anywhere else."""
    expected = {
        "extraction_succeeded": Move(S.READY),
        "extraction_failed": Move(S.FAILED),
        "auto_committed": Move(S.IDLE),
    }[result]
    assert answer(state, result) == (expected if state is S.EXTRACTING else Stale())


MOVES = [
    (s, e, verdict.dest)
    for s in State
    for e in CALLS + RESULTS
    if isinstance(verdict := answer(s, e), Move)
]


@pytest.mark.parametrize(("state", "event", "dest"), MOVES)
def test_the_machine_fires_exactly_the_moves(state: State, event: str, dest: State) -> None:
    """The transitions machine reaches the table's destination for every allowed move."""
    machines = SharedMachine()
    model = SessionModel("s")
    machines.add(model, state)
    assert SharedMachine.fire(model, event) is dest


def test_an_unknown_event_is_an_error() -> None:
    """An event outside the table is a programming error, not a silent no-op."""
    with pytest.raises(ValueError, match="unknown session event"):
        answer(S.IDLE, "explode")


@pytest.mark.parametrize("state", list(State))
def test_the_refusals_read_as_data_agree_with_the_table(state: State) -> None:
    """`REFUSALS`, which a call's check reads without asking `answer`, holds a reason for a
    call exactly where the API contract's table refuses it, and that reason."""
    for event in CALLS:
        expected = EXPECTED[(state, event)]
        refused = REFUSALS[state].get(event)
        assert refused == (expected.reason if isinstance(expected, Refuse) else None)
