from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, strategies as st

from mnemo.calls.schema import bounded, reply_schema
from mnemo.calls.tasks import task_inputs
from mnemo.extraction.contradiction import contradiction_request, parse_contradiction
from mnemo.extraction.prompts import (
    Fact,
    Instruction,
    MergedReply,
    ProceduralReply,
    ReturnReply,
    SemanticReply,
    merge_intent_request,
    merge_intents_request,
    parse_facts,
    parse_instructions,
    parse_merged_intent,
    parse_merged_intents,
    parse_returns,
    procedural_request,
    return_request,
    semantic_request,
)
from mnemo.graph.contradiction import Question
from mnemo.ports import LLMResponse
from tests.fakes import js

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)
FACT_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "proposition": JSON,
        "concepts": JSON,
        "confidence": JSON,
        "steps": JSON,
    },
)
STEPS = [{"index": 0, "observation": "o", "action": "a"}]


def test_semantic_request_carries_inputs() -> None:
    """The semantic request has its schema, asking for at most 5 facts of its one step, and
    round-trips goal, subgoal and steps."""
    request = semantic_request(goal="g", subgoal="s", steps=STEPS)
    assert request.task == "semantic"
    assert request.schema == bounded(reply_schema(SemanticReply), "facts", 5)[0]
    assert task_inputs(request) == {"goal": "g", "subgoal": "s", "steps": STEPS}


def test_procedural_request_carries_inputs() -> None:
    """The procedural request has its schema, asking for at most 3 instructions of its one
    step, and round-trips the rewarded steps."""
    steps = [dict(STEPS[0], reward=None)]
    request = procedural_request(goal="g", subgoal="s", steps=steps)
    assert request.task == "procedural"
    assert request.schema == bounded(reply_schema(ProceduralReply), "instructions", 3)[0]
    assert task_inputs(request) == {"goal": "g", "subgoal": "s", "steps": steps}


def test_return_request_carries_inputs() -> None:
    """The return request has its schema, one score for its one instruction, the rubric, and
    round-trips its inputs."""
    instructions = [
        {"index": 0, "intent": "i", "condition": "c", "instruction": "d", "expected_outcome": "e"}
    ]
    request = return_request(goal="g", subgoal="s", instructions=instructions, steps=STEPS)
    assert request.task == "return"
    assert request.schema == bounded(reply_schema(ReturnReply), "scores", 1)[0]
    assert task_inputs(request) == {
        "goal": "g",
        "subgoal": "s",
        "instructions": instructions,
        "steps": STEPS,
    }
    assert "10: it achieved the subgoal" in js(request.messages[0])["content"]


def test_merge_intent_request_carries_inputs() -> None:
    """The merge_intent request has its schema and round-trips both intents."""
    request = merge_intent_request(existing="restart nginx", new="reload nginx")
    assert request.task == "merge_intent"
    assert request.schema == reply_schema(MergedReply)
    assert task_inputs(request) == {"existing": "restart nginx", "new": "reload nginx"}


def test_parse_facts_reads_valid_reply() -> None:
    """Facts are read in order, with concepts cleaned, confidence clamped and steps kept."""
    data = {
        "facts": [
            {
                "proposition": " Nginx listens on port 8080. ",
                "concepts": ["nginx", " ", "Nginx", " ports "],
                "confidence": 1.7,
                "steps": [2, 0, 2],
            },
            {"proposition": "Backups run nightly.", "concepts": ["backups"]},
        ]
    }
    assert parse_facts(LLMResponse(data=data)) == [
        Fact("Nginx listens on port 8080.", ("nginx", "ports"), 1.0, (2, 0)),
        Fact("Backups run nightly.", ("backups",), 0.5, None),
    ]


def test_parse_facts_accepts_empty_list() -> None:
    """An empty fact list is a valid answer."""
    assert parse_facts(LLMResponse(data={"facts": []})) == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (None, "semantic reply must be a JSON object"),
        ({"fact": []}, "no 'facts' field"),
        ({"facts": {}}, "facts must be a list"),
        ({"facts": ["x"]}, r"facts\[0\] must be an object"),
        (
            {"facts": [{"proposition": "a b"}, {"proposition": "c d"}, {"proposition": " "}]},
            r"facts\[2\]\.proposition must be a non-empty string",
        ),
        ({"facts": [{"proposition": "p", "concepts": "x"}]}, r"facts\[0\]\.concepts must be"),
        ({"facts": [{"proposition": "p", "concepts": [1]}]}, r"facts\[0\]\.concepts\[0\]"),
        ({"facts": [{"proposition": "p", "confidence": "high"}]}, r"confidence must be a number"),
        ({"facts": [{"proposition": "p", "steps": [0.5]}]}, r"facts\[0\]\.steps\[0\]"),
        ({"facts": [{"proposition": "p", "steps": 1}]}, r"facts\[0\]\.steps must be a list"),
    ],
)
def test_parse_facts_rejects_garbage(data: Any, message: str) -> None:
    """A reply off the schema is a ValueError naming the offending field."""
    with pytest.raises(ValueError, match=message):
        parse_facts(LLMResponse(data=data))


@pytest.mark.slow
@given(st.one_of(JSON, st.fixed_dictionaries({"facts": st.lists(FACT_FIELDS | JSON)})))
def test_parse_facts_raises_only_value_error(data: Any) -> None:
    """On any JSON-like reply parse_facts returns facts or raises ValueError, nothing else."""
    try:
        facts = parse_facts(LLMResponse(data=data))
    except ValueError:
        return
    for fact in facts:
        assert fact.proposition.strip() == fact.proposition != ""
        assert 0.0 <= fact.confidence <= 1.0


def test_parse_instructions_reads_valid_reply() -> None:
    """Instructions are read in order; condition and outcome may be empty."""
    data = {
        "instructions": [
            {
                "intent": "restart nginx",
                "condition": "When the config changed",
                "instruction": "Run sudo systemctl restart nginx",
                "expected_outcome": "nginx serves the new config",
                "steps": [1],
            },
            {
                "intent": "check logs",
                "condition": "",
                "instruction": "tail the error log",
                "expected_outcome": None,
            },
        ]
    }
    assert parse_instructions(LLMResponse(data=data)) == [
        Instruction(
            "restart nginx",
            "When the config changed",
            "Run sudo systemctl restart nginx",
            "nginx serves the new config",
            (1,),
        ),
        Instruction("check logs", "", "tail the error log", "", None),
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"instructions": None}, "instructions must be a list"),
        ({"instructions": [{"instruction": "do"}]}, r"instructions\[0\]\.intent must be"),
        ({"instructions": [{"intent": "i", "instruction": ""}]}, r"\.instruction must be"),
        (
            {"instructions": [{"intent": "i", "instruction": "d", "condition": 3}]},
            r"instructions\[0\]\.condition must be a string",
        ),
    ],
)
def test_parse_instructions_rejects_garbage(data: Any, message: str) -> None:
    """A malformed procedural reply is a ValueError naming the field."""
    with pytest.raises(ValueError, match=message):
        parse_instructions(LLMResponse(data=data))


def test_parse_returns_clamps_and_ignores_out_of_range() -> None:
    """Scores are rounded into 1..10; indices outside the instructions are ignored."""
    data = {
        "scores": [
            {"index": 0, "return_score": 12},
            {"index": 1, "return_score": 0},
            {"index": 2, "return_score": 6.6},
            {"index": 5, "return_score": 7},
            {"index": -1, "return_score": 7},
        ]
    }
    assert parse_returns(LLMResponse(data=data), 3) == {0: 10, 1: 1, 2: 7}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "return reply must be a JSON object"),
        ({"scores": "7"}, "scores must be a list"),
        ({"scores": [{"index": "first", "return_score": 5}]}, r"scores\[0\]\.index"),
        ({"scores": [{"index": 0}]}, r"scores\[0\]\.return_score must be a number"),
    ],
)
def test_parse_returns_rejects_wrong_shape(data: Any, message: str) -> None:
    """A return reply of the wrong shape is a ValueError."""
    with pytest.raises(ValueError, match=message):
        parse_returns(LLMResponse(data=data), 3)


def test_parse_merged_intent() -> None:
    """The merged intent is read stripped; a blank one is a ValueError."""
    assert parse_merged_intent(LLMResponse(data={"intent": " restart nginx "})) == "restart nginx"
    with pytest.raises(ValueError, match="intent must be a non-empty string"):
        parse_merged_intent(LLMResponse(data={"intent": "  "}))
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_merged_intent(LLMResponse(text="restart nginx"))


def test_contradiction_pairs_map_back_to_their_questions() -> None:
    """The "contradiction" task numbers every (existing, new) pair of the commit; the reply's
    indices come back as positions in each question, and unknown indices are ignored."""
    questions = [Question("Dana lives in Porto", ("Dana lives in Lisbon", "Dana likes tea")),
                 Question("the port is 8002", ("the port is 8001",))]
    request, pairs = contradiction_request(questions)
    assert request.task == "contradiction"
    assert [p["index"] for p in js(task_inputs(request))["pairs"]] == [0, 1, 2]
    reply = LLMResponse(data={"contradicted": [0, 2, 7]})
    assert parse_contradiction(reply, pairs, len(questions)) == [{0}, {0}]
    with pytest.raises(ValueError, match="contradicted"):
        parse_contradiction(LLMResponse(data={"contradicts": True}), pairs, 2)


def test_merged_intents_keep_only_answered_pairs() -> None:
    """A "merge_intents" reply maps pair indices to merged wordings; blank, repeated or
    unknown indices are left out (those pairs keep the existing wording)."""
    request = merge_intents_request([("restart nginx", "reload nginx"), ("a", "b")])
    assert request.task == "merge_intents"
    reply = LLMResponse(data={"intents": [
        {"index": 0, "intent": " restart or reload nginx "}, {"index": 0, "intent": "x"},
        {"index": 1, "intent": "  "}, {"index": 9, "intent": "y"}]})
    assert parse_merged_intents(reply, 2) == {0: "restart or reload nginx"}
    with pytest.raises(ValueError, match="intents"):
        parse_merged_intents(LLMResponse(data={"intent": "x"}), 2)


def test_what_says_nothing_is_left_out_of_facts_and_procedures() -> None:
    """Concepts that are JSON fragments or punctuation (a small model's `');{`), facts and
    procedures of punctuation or a copied placeholder ("...") are left out; the rest stays."""
    facts = parse_facts(LLMResponse(data={"facts": [
        {"proposition": "Dana lives in Porto.", "concepts": ["dana", "');{", "...", "porto",
                                                            '{"a": 1}', "x" * 65],
         "confidence": 0.9},
        {"proposition": "...", "concepts": ["dana"], "confidence": 0.9},
    ]}))
    assert [(f.proposition, f.concepts) for f in facts] == [
        ("Dana lives in Porto.", ("dana", "porto"))]
    instructions = parse_instructions(LLMResponse(data={"instructions": [
        {"intent": "...", "instruction": "...", "condition": "", "expected_outcome": ""},
        {"intent": "restart nginx", "instruction": "systemctl restart nginx"},
    ]}))
    assert [i.intent for i in instructions] == ["restart nginx"]
