"""Task replies as msgspec structs: the schema sent and the reading of a reply."""

from __future__ import annotations

import pytest
from jsonschema import Draft202012Validator

from mnemo.extraction import prompts
from mnemo.reply import UNSET, Reply, UnsetType, read_reply, reply_schema

SCHEMAS = [prompts.SEMANTIC_SCHEMA, prompts.PROCEDURAL_SCHEMA,
           prompts.PROCEDURAL_SCORING_SCHEMA, prompts.RETURN_SCHEMA,
           prompts.MERGE_INTENT_SCHEMA, prompts.MERGE_INTENTS_SCHEMA]


class Item(Reply, frozen=True):
    name: str
    size: float | None = None
    note: str | UnsetType = UNSET


class Box(Reply, frozen=True):
    items: list[Item]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_generated_schemas_are_valid_and_self_contained(schema: dict[str, object]) -> None:
    """Each task schema is a valid JSON schema with no `$ref` and no msgspec title."""
    Draft202012Validator.check_schema(schema)
    text = str(schema)
    assert "$ref" not in text
    assert "'title'" not in text


def test_schema_asks_every_field_but_unset_ones() -> None:
    """A field defaulting to None is required in the schema; one defaulting to UNSET is not;
    every object refuses other properties."""
    item = reply_schema(Box)["properties"]["items"]["items"]  # type: ignore[index]
    assert item["required"] == ["name", "size"]
    assert item["additionalProperties"] is False


def test_read_reply_takes_numeric_strings_and_missing_optional_fields() -> None:
    """A numeric string reads as a number; a field with a default may be missing."""
    box = read_reply({"items": [{"name": "a", "size": "2.5"}, {"name": "b"}]}, Box, "box")
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
        read_reply(data, Box, "box")


def test_semantic_schema_is_the_shape_models_were_sent() -> None:
    """The generated "semantic" schema is the one written by hand before it: facts with a
    required proposition, concepts and bounded confidence, optional step indices."""
    assert prompts.SEMANTIC_SCHEMA == {
        "type": "object",
        "properties": {
            "facts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "proposition": {"type": "string"},
                        "concepts": {"type": "array", "items": {"type": "string"}},
                        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                        "steps": {
                            "type": "array",
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
