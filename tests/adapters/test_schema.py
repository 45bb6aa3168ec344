"""The adapters' schema check: a walk of the replies' keywords says "valid" only where
jsonschema does, and leaves every other verdict (and its wording) to jsonschema."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from mnemo.adapters._schema import _plainly_valid, _unbounded, example_of, schema_problem
from mnemo.episode import prompts as episode_prompts
from mnemo.extraction import prompts

SCHEMAS: list[dict[str, Any]] = [
    prompts.SEMANTIC_SCHEMA, prompts.PROCEDURAL_SCHEMA, prompts.PROCEDURAL_SCORING_SCHEMA,
    prompts.RETURN_SCHEMA, prompts.MERGE_INTENT_SCHEMA, prompts.MERGE_INTENTS_SCHEMA,
    episode_prompts.SUBGOAL_SCHEMA, episode_prompts.REWARD_SCHEMA,
    # Keywords the replies' schemas do not use, and forms the walk leaves to jsonschema.
    {"type": "object", "properties": {"n": {"type": ["integer", "null"]},
                                      "kind": {"enum": ["a", 1, None]}},
     "additionalProperties": {"type": "string"}},
    {"type": "array", "items": {"anyOf": [{"type": "boolean"}, {"type": "number"}]}},
    {"type": "string", "pattern": "^a"},
    {"type": "object", "properties": {"x": True}, "required": ["x"]},
    {"enum": ["a", 1, None]},
]

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=8,
)


def near(schema: object) -> st.SearchStrategy[Any]:
    """Values shaped by `schema`, now and then wrong at one place or another: a float or a
    boolean for an integer, a number for a string, a key missing or extra, any other value."""
    if not isinstance(schema, dict):
        return JSON
    kind = schema.get("type")
    wrong: st.SearchStrategy[Any] = JSON
    if "enum" in schema:
        right = st.sampled_from(schema["enum"])
        wrong = st.sampled_from([1.0, 0, True, False, "b"])
    elif "anyOf" in schema:
        right = st.one_of([near(option) for option in schema["anyOf"]])
    elif kind == "object":
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        shaped = {name: near(properties.get(name)) for name in required}
        optional = {name: near(sub) for name, sub in properties.items() if name not in required}
        right = st.fixed_dictionaries(shaped, optional=optional)
        wrong = st.fixed_dictionaries(shaped, optional={**optional, "other": JSON}) \
            | st.fixed_dictionaries({}, optional=shaped) | JSON
    elif kind == "array":
        right = st.lists(near(schema.get("items")), max_size=3)
    elif kind == "integer":
        right = st.integers() | st.integers().map(float)
        wrong = st.floats() | st.booleans() | JSON
    elif kind == "number":
        right = st.integers() | st.floats(allow_nan=False)
        wrong = st.booleans() | JSON
    elif kind == "string":
        right = st.text(max_size=3)
        wrong = st.integers() | JSON
    else:
        right = JSON
    # One place in ten wrong (hypothesis's one_of draws its strategies alike, one repeated
    # or not).
    return st.integers(0, 9).flatmap(lambda k: wrong if k == 0 else right)


def valid(data: object, schema: dict[str, Any]) -> bool:
    return Draft202012Validator(_unbounded(schema)).is_valid(data)  # type: ignore[arg-type]


@pytest.mark.parametrize("schema", SCHEMAS[:8])
def test_a_reply_shaped_as_its_task_asks_passes_without_jsonschema(
        schema: dict[str, Any]) -> None:
    """Every task's example answer is judged valid by the walk itself."""
    assert _plainly_valid(example_of(schema), schema)
    assert schema_problem(example_of(schema), schema) is None


@pytest.mark.parametrize("schema", SCHEMAS)
@settings(max_examples=150)
@given(data=st.data())
def test_the_walk_says_valid_only_where_jsonschema_does(
        schema: dict[str, Any], data: st.DataObject) -> None:
    """Whatever the value, a "valid" from the walk is jsonschema's verdict too, and the
    check's answer is jsonschema's (bounds left out)."""
    value = data.draw(near(schema))
    if _plainly_valid(value, schema):
        assert valid(value, schema)
    assert (schema_problem(value, schema) is None) == valid(value, schema)


def test_what_the_walk_does_not_read_is_left_to_jsonschema() -> None:
    """A pattern, a boolean subschema and an enum's 1 against 1.0 are jsonschema's to judge,
    and a problem is worded by it."""
    assert not _plainly_valid("abc", SCHEMAS[10])
    assert schema_problem("abc", SCHEMAS[10]) is None
    assert schema_problem("b", SCHEMAS[10]) == "at $: 'b' does not match '^a'"
    assert schema_problem({"x": 1}, SCHEMAS[11]) is None
    assert schema_problem({"kind": 1.0}, SCHEMAS[8]) is None
    assert schema_problem({"kind": 2}, SCHEMAS[8]) is not None
