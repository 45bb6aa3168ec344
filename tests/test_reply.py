"""Task replies as msgspec structs: the schema sent and the reading of a reply."""

from __future__ import annotations

import pytest

from mnemo.calls.schema import UNSET, Reply, UnsetType, most_tokens, reply_schema
from mnemo.calls.tasks import read_reply
from mnemo.extraction import prompts
from mnemo.ports import LLMResponse
from tests.fakes import js

SCHEMAS = [reply_schema(kind) for kind in (
    prompts.SemanticReply, prompts.ProceduralReply, prompts.ScoringReply, prompts.ReturnReply,
    prompts.MergedReply, prompts.MergedPairsReply)]


class Item(Reply, frozen=True):
    name: str
    size: float | None = None
    note: str | UnsetType = UNSET


class Box(Reply, frozen=True):
    items: list[Item]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_generated_schemas_are_self_contained(schema: dict[str, object]) -> None:
    """Each task schema has no `$ref` and no msgspec title."""
    text = str(schema)
    assert "$ref" not in text
    assert "'title'" not in text


def test_schema_asks_every_field_but_unset_ones() -> None:
    """A field defaulting to None is required in the schema; one defaulting to UNSET is not;
    every object refuses other properties."""
    item = js(reply_schema(Box))["properties"]["items"]["items"]
    assert item["required"] == ["name", "size"]
    assert item["additionalProperties"] is False


def test_read_reply_takes_numeric_strings_and_missing_optional_fields() -> None:
    """A numeric string reads as a number; a field with a default may be missing."""
    data = {"items": [{"name": "a", "size": "2.5"}, {"name": "b"}]}
    box = read_reply(LLMResponse(data=data), Box, "box")
    assert [(i.name, i.size, i.note) for i in box.items] == [("a", 2.5, UNSET), ("b", None, UNSET)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], r"^box reply must be a JSON object, got \[\]$"),
        ({}, r"^box reply has no 'items' field \(items must be a list\): \{\}$"),
        ({"items": [{"name": 3}]}, r"^items\[0\]\.name must be a string, got 3$"),
        ({"items": [{}]}, r"^items\[0\]\.name must be a string, got nothing$"),
        ({"items": [{"name": "a", "size": "big"}]},
         r"^items\[0\]\.size must be a number or null, got 'big'$"),
    ],
)
def test_read_reply_names_the_field(data: object, message: str) -> None:
    """A reply off its struct is a ValueError naming the field, what it must be, what it is."""
    with pytest.raises(ValueError, match=message):
        read_reply(LLMResponse(data=data), Box, "box")


def test_semantic_schema_is_the_shape_models_were_sent() -> None:
    """The generated "semantic" schema is the one written by hand before it (facts with a
    required proposition, concepts and bounded confidence, optional step indices), with the
    bounds that keep a grammar-bound model's reply within max_tokens."""
    assert reply_schema(prompts.SemanticReply) == {
        "type": "object",
        "properties": {
            "facts": {
                "type": "array",
                "maxItems": 6,
                "items": {
                    "type": "object",
                    "properties": {
                        "proposition": {"type": "string", "maxLength": 200},
                        "concepts": {"type": "array", "maxItems": 5,
                                     "items": {"type": "string", "maxLength": 24}},
                        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                        "steps": {
                            "type": "array",
                            "maxItems": 6,
                            "items": {"type": "integer"},
                            "description": "The indices of the steps this came from.",
                        },
                    },
                    "required": ["proposition", "concepts", "confidence"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["facts"],
        "additionalProperties": False,
    }


@pytest.mark.parametrize(
    ("schema", "tokens"),
    [
        ({"type": "string", "maxLength": 30}, 12),
        ({"type": "string"}, None),
        ({"type": "array", "maxItems": 3, "items": {"type": "integer"}}, 2 + 3 * 5),
        ({"type": "array", "items": {"type": "integer"}}, None),
        ({"type": "object", "properties": {"ab": {"type": "number"}}}, 2 + 4 + 6),
        ({"anyOf": [{"type": "number"}, {"type": "string", "maxLength": 60}]}, 22),
        ({"anyOf": [{"type": "number"}, {"type": "string"}]}, None),
    ],
)
def test_most_tokens_counts_the_longest_reply_a_schema_allows(
    schema: dict[str, object], tokens: int | None
) -> None:
    """A bounded schema's longest reply in tokens (three characters a token, keys and
    punctuation counted); None as soon as one string or list is unbounded."""
    assert most_tokens(schema) == tokens


def test_every_task_asks_for_room_enough_for_its_longest_bounded_reply() -> None:
    """The semantic and procedural tasks' max_tokens hold the longest reply their schema
    allows, so a model kept within the schema by a grammar is never cut short."""
    steps = [{"index": 0, "observation": "o", "action": "a"}]
    semantic = prompts.semantic_request(goal="g", subgoal="s", steps=steps)
    procedural = prompts.procedural_request(goal="g", subgoal="s", steps=steps, score_last=True)
    for request in (semantic, procedural):
        assert request.schema is not None
        longest = most_tokens(request.schema)
        assert longest is not None
        assert request.max_tokens is not None
        assert longest <= request.max_tokens <= 4096


def test_a_reply_past_the_bounds_is_read_all_the_same() -> None:
    """The bounds guide generation only: seven facts, one of 500 characters, are read
    whole."""
    fact = {"proposition": "x" * 500, "concepts": ["a"], "confidence": 0.9}
    data = {"facts": [fact] * 7}
    reply = read_reply(LLMResponse(data=data), prompts.SemanticReply, "semantic")
    assert len(reply.facts) == 7
    assert len(reply.facts[0].proposition) == 500


def test_a_number_out_of_its_range_is_clamped_not_refused() -> None:
    """A confidence of 4.5 (llama.cpp's grammar does not hold numbers to a range) is read
    as 1; a fact repeated in one reply is kept once."""
    said = "The staging database runs on port 5433."
    fact = {"proposition": said, "concepts": ["db"], "confidence": 4.5}
    data = {"facts": [fact, {**fact, "proposition": said.upper()}]}
    (read,) = prompts.parse_facts(LLMResponse(data=data))
    assert read.confidence == 1.0


def test_a_procedure_repeated_is_kept_once_and_the_last_score_is_asked_for() -> None:
    """A procedural reply's repeated instruction is kept once; the scoring schema requires
    `last_reward`, so a grammar-bound model writes it instead of leaving it out."""
    said = "Run systemctl reload nginx."
    item = {"intent": "restart nginx", "condition": "after a config change",
            "instruction": said, "expected_outcome": "200 OK"}
    data = {"instructions": [item, {**item, "instruction": said.lower()}]}
    assert len(prompts.parse_instructions(LLMResponse(data=data))) == 1
    assert "last_reward" in js(reply_schema(prompts.ScoringReply))["required"]
