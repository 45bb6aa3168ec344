from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

from mnemo.calls.schema import most_tokens
from mnemo.calls.tasks import task_inputs
from mnemo.episode import (
    REWARD_SCHEMA,
    SUBGOAL_SCHEMA,
    parse_reward,
    parse_state,
    parse_subgoal,
    reward_request,
    state_request,
    subgoal_request,
)
from mnemo.ports import LLMResponse
from tests.fakes import js

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=10,
)


def test_state_request_carries_inputs() -> None:
    """The state request is task "state", its reply one string of at most 400 characters
    (the `max_tokens` that holds it), and round-trips its inputs."""
    request = state_request(goal="g", observation="o", action="a", previous_state=None)
    assert request.task == "state"
    assert request.schema is not None
    assert js(request.schema)["properties"]["state"]["maxLength"] == 400
    assert request.max_tokens == most_tokens(request.schema)
    assert task_inputs(request) == {
        "goal": "g",
        "observation": "o",
        "action": "a",
        "previous_state": None,
    }
    assert request.system


def test_subgoal_request_carries_inputs() -> None:
    """The subgoal request has its schema and round-trips its inputs."""
    request = subgoal_request(
        goal="g", observation="o", action="a", previous_subgoal="p", recent_steps=["x -> y"]
    )
    assert request.task == "subgoal"
    assert request.schema == SUBGOAL_SCHEMA
    assert task_inputs(request) == {
        "goal": "g",
        "observation": "o",
        "action": "a",
        "previous_subgoal": "p",
        "recent_steps": ["x -> y"],
    }
    assert "exactly" in js(request.messages[0])["content"]


def test_reward_request_carries_inputs() -> None:
    """The reward request has its schema and round-trips its inputs, None included."""
    request = reward_request(
        goal="g", subgoal="s", observation="o", action="a", next_observation=None
    )
    assert request.task == "reward"
    assert request.schema == REWARD_SCHEMA
    assert task_inputs(request) == {
        "goal": "g",
        "subgoal": "s",
        "observation": "o",
        "action": "a",
        "next_observation": None,
    }


@pytest.mark.parametrize(
    "response",
    [
        LLMResponse(text="  The server is up.  "),
        LLMResponse(data="The server is up."),
        LLMResponse(data={"state": " The server is up."}),
        LLMResponse(text='{"state": "The server is up."}'),
    ],
)
def test_parse_state_accepts_text_or_data(response: LLMResponse) -> None:
    """The state is read from text, a data string, or data["state"] (also as JSON in text),
    stripped."""
    assert parse_state(response) == "The server is up."


def test_a_state_paragraph_holding_a_json_object_is_the_paragraph() -> None:
    """A paragraph in text that quotes a JSON object (a step's payload) is the summary: the
    object is not taken for the reply."""
    text = 'The webhook got `{"text": "CI failed"}` and answered HTTP 400.'
    assert parse_state(LLMResponse(text=text)) == text


@pytest.mark.parametrize(
    "response", [LLMResponse(), LLMResponse(text="   "), LLMResponse(data={"state": 3})]
)
def test_parse_state_rejects_empty(response: LLMResponse) -> None:
    """A reply without a summary is a ValueError saying so."""
    with pytest.raises(ValueError, match="no summary"):
        parse_state(response)


def test_parse_subgoal_accepts_valid_reply() -> None:
    """The subgoal is data["subgoal"], stripped; a JSON text also works."""
    assert parse_subgoal(LLMResponse(data={"reasoning": "r", "subgoal": " fix nginx "})) == (
        "fix nginx"
    )
    assert parse_subgoal(LLMResponse(text='{"reasoning": "r", "subgoal": "fix nginx"}')) == (
        "fix nginx"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (None, "JSON object"),
        (["fix nginx"], "JSON object"),
        ({"reasoning": "r"}, "no 'subgoal'"),
        ({"subgoal": 3}, "must be a string"),
        ({"subgoal": "  "}, "blank"),
    ],
)
def test_parse_subgoal_rejects_garbage(data: object, message: str) -> None:
    """A malformed subgoal reply is a ValueError saying what was wrong."""
    with pytest.raises(ValueError, match=message):
        parse_subgoal(LLMResponse(data=data))


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (LLMResponse(data={"reward": 0.8}), 0.8),
        (LLMResponse(data={"reward": 1}), 1.0),
        (LLMResponse(data={"reward": 7}), 1.0),
        (LLMResponse(data={"reward": -2}), 0.0),
        (LLMResponse(data=0.3), 0.3),
        (LLMResponse(data={"reward": "0.25"}), 0.25),
        (LLMResponse(text='{"reward": 0.4}'), 0.4),
        (LLMResponse(text="0.7"), 0.7),
    ],
)
def test_parse_reward_reads_and_clamps(response: LLMResponse, expected: float) -> None:
    """A numeric reward is read from data or text and clamped to [0, 1]."""
    assert parse_reward(response) == pytest.approx(expected)


@pytest.mark.parametrize(
    "response",
    [
        LLMResponse(),
        LLMResponse(text="great step!"),
        LLMResponse(data={"reward": None}),
        LLMResponse(data={"reward": True}),
        LLMResponse(data={"reward": math.nan}),
        LLMResponse(data={"score": 0.9}),
        LLMResponse(data=["0.9"]),
    ],
)
def test_parse_reward_defaults_to_neutral(response: LLMResponse) -> None:
    """An unreadable reward is 0.5, never an exception."""
    assert parse_reward(response) == 0.5


@given(data=JSON, text=st.text())
def test_parse_reward_never_raises(data: object, text: str) -> None:
    """parse_reward returns a value in [0, 1] for any reply."""
    assert 0.0 <= parse_reward(LLMResponse(text=text, data=data)) <= 1.0
