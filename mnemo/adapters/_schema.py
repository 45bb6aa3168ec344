"""What the chat adapters share: reading a structured reply, checking it, tools and prices.

A model's structured reply is decoded leniently (a ```json fence or prose around one JSON object
is tolerated, since local models add them even when asked not to) and then validated strictly
against the request's JSON schema: a walk of the few keywords replies' schemas use says when it
plainly matches, and `jsonschema` judges the rest. The problem found is phrased for two
readers: the model, in the one re-ask (`reask_text`), and the user, in the `LLMError` raised
when the re-ask fails too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from functools import lru_cache

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from partial_json_parser import Allow
from partial_json_parser import loads as parse_partial

from mnemo.errors import InvalidInputError
from mnemo.ports import Usage

# Prices in US dollars per million tokens (input, output), as published by the providers in
# 2025. A model matches its own name or the longest entry it starts with followed by "-"
# ("gpt-4o-mini-2024-07-18" is priced as "gpt-4o-mini"). Pass `prices=` to correct or extend.
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "text-embedding-3-small": (0.02, 0.0),
    "text-embedding-3-large": (0.13, 0.0),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-3-5-sonnet": (3.00, 15.00),
    "claude-3-7-sonnet": (3.00, 15.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-opus-4": (15.00, 75.00),
}

_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?```\s*$", re.DOTALL)
_MAX_PROBLEM = 400
_LENIENT = json.JSONDecoder(strict=False)
# The adapters' default `max_tokens`: the most tokens any reply may use, and what a request
# that sets none gets. mnemo's own tasks ask for less, sized to their schemas.
DEFAULT_MAX_TOKENS = 4096


def checked_max_tokens(value: int) -> int:
    """`value`, an adapter's `max_tokens`.

    Raises:
        InvalidInputError: it is not an integer >= 1.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"max_tokens must be an integer >= 1, got {value!r}")
    return value


def reply_cap(requested: int | None, ceiling: int) -> int:
    """The `max_tokens` to send: the request's own, at most the adapter's `ceiling`."""
    return ceiling if requested is None else max(1, min(requested, ceiling))


def cut_note(problem: str, max_tokens: int) -> str:
    """`problem`, saying the reply stopped at the token cap (so it is incomplete)."""
    return f"{problem} (the reply was cut short at max_tokens={max_tokens}, so it is incomplete)"


def decode_json(text: str) -> object:
    """The JSON value in a model's reply text.

    Accepts the bare value, the value in a Markdown code fence, or prose around one object, and
    raw control characters (a newline, a tab) inside strings, which small local models write
    and strict JSON forbids.

    Raises:
        ValueError: saying why no JSON value could be read.
    """
    stripped = text.strip()
    if not stripped:
        raise ValueError("the reply is empty, expected a JSON object")
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1).strip()
    try:
        return json.loads(stripped, strict=False)
    except json.JSONDecodeError as exc:
        start = stripped.find("{")
        if start >= 0:
            try:
                value, _ = _LENIENT.raw_decode(stripped[start:])
                return value
            except json.JSONDecodeError:
                pass
        raise ValueError(f"the reply is not valid JSON ({exc.msg} at char {exc.pos})") from exc


def is_cut(text: str) -> bool:
    """Whether `text` is the start of a JSON value that stopped before its end (a reply cut
    short), rather than JSON with a mistake in it."""
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1).strip()
    start = stripped.find("{")
    if start < 0:
        return False
    try:
        _LENIENT.raw_decode(stripped[start:])
    except json.JSONDecodeError as exc:
        # The decoder ran out of text: what came was well formed, only unfinished.
        return exc.pos >= len(stripped) - start - 1 or exc.msg.startswith("Unterminated")
    return False


def salvage(text: str, schema: Mapping[str, object]) -> object | None:
    """What a cut reply holds that is whole: its JSON value with every list of objects kept
    to the items that match the schema's item schema (an item cut midway is dropped, never a
    string cut midway kept), when the result then matches `schema`; else None."""
    stripped = text.strip()
    fenced = re.match(r"^```[a-zA-Z0-9_-]*\s*\n?(.*)$", stripped, re.DOTALL)
    if fenced:
        stripped = fenced.group(1).strip().removesuffix("```")
    start = stripped.find("{")
    if start < 0:
        return None
    try:
        partial = parse_partial(stripped[start:], Allow.OBJ | Allow.ARR)
    except Exception:  # the parser's own errors: nothing whole in it
        return None
    return whole_items(partial, schema)


def whole_items(data: object, schema: Mapping[str, object]) -> object | None:
    """`data` (a JSON object) with each list of it kept to the items that match the schema's
    item schema, when the result matches `schema` and kept an item; else None."""
    if not isinstance(data, dict):
        return None
    properties = schema.get("properties", {})
    kept: dict[str, object] = {}
    for key, value in data.items():
        items = properties.get(key, {}).get("items") if isinstance(properties, Mapping) else None
        if isinstance(value, list) and isinstance(items, Mapping):
            kept[key] = [item for item in value if schema_problem(item, items) is None]
        else:
            kept[key] = value
    if not any(isinstance(v, list) and v for v in kept.values()):
        return None  # nothing whole was kept: no better than no reply
    return kept if schema_problem(kept, schema) is None else None


def example_of(schema: Mapping[str, object]) -> object:
    """A value shaped as `schema` says, to show a model what an answer looks like (a small
    model shown only the schema answered with the schema itself): an object with its
    required properties (all of them when it lists none), a list of one item, "..." for a
    string, the minimum (or 0.5 between 0 and 1) for a number, the first alternative but
    null of an `anyOf`."""
    choices = schema.get("anyOf")
    if isinstance(choices, list):
        # The first alternative that is not null: a model shown null copies it.
        shown = [c for c in choices if isinstance(c, Mapping) and c.get("type") != "null"]
        return example_of(shown[0]) if shown else None
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = schema.get("required")
        wanted = required if isinstance(required, list) and required else list(properties)
        return {key: example_of(_mapping(properties.get(key))) for key in wanted}
    if kind == "array":
        items = schema.get("items")
        return [example_of(items)] if isinstance(items, Mapping) else []
    if kind == "string":
        return "..."
    low, high = schema.get("minimum"), schema.get("maximum")
    low = low if isinstance(low, int | float) else None
    high = high if isinstance(high, int | float) else None
    if kind == "integer":
        return int(low or 0)
    if kind == "number":
        return (low + high) / 2 if low is not None and high is not None else low or 0.5
    if kind == "boolean":
        return False
    return None


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def schema_problem(data: object, schema: Mapping[str, object]) -> str | None:
    """What is wrong with `data` against `schema`, in one line; None when it matches.

    The most relevant error is named with its location ("at $.facts[0].confidence: 1.5 is
    greater than the maximum of 1"), then how many others there are.
    """
    if _plainly_valid(data, schema):
        return None
    errors = list(_validator(_key(schema)).iter_errors(data))
    if not errors:
        return None
    worst = best_match(errors)
    text = f"at {_where(worst)}: {worst.message}"
    if len(text) > _MAX_PROBLEM:
        text = text[: _MAX_PROBLEM - 3] + "..."
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return text


def reask_text(problem: str) -> str:
    """The message that shows the model what was wrong with its reply."""
    return f"Your reply did not match the schema: {problem}. Reply again with JSON only."


def tool_spec(tool: Mapping[str, object]) -> tuple[str, str, dict[str, object]]:
    """(name, description, parameters schema) of a tool given in any usual shape.

    Accepts mnemo's neutral {"name", "description", "parameters"}, OpenAI's
    {"type": "function", "function": {...}} and Anthropic's {"name", "input_schema"}.

    Raises:
        ValueError: the tool has no name.
    """
    inner = tool.get("function") if tool.get("type") == "function" else tool
    if not isinstance(inner, Mapping) or not isinstance(inner.get("name"), str):
        raise ValueError(f"a tool needs a name, got {tool!r}")
    parameters = inner.get("parameters", inner.get("input_schema"))
    if not isinstance(parameters, dict):
        parameters = {"type": "object", "properties": {}}
    description = inner.get("description")
    return inner["name"], description if isinstance(description, str) else "", parameters


def price_of(model: str, prices: Mapping[str, tuple[float, float]]) -> tuple[float, float] | None:
    """The (input, output) $/Mtok of `model`: its own entry or its longest "-" prefix."""
    if model in prices:
        return prices[model]
    matches = [name for name in prices if model.startswith(name + "-")]
    return prices[max(matches, key=len)] if matches else None


def usage_of(
    input_tokens: object, output_tokens: object, price: tuple[float, float] | None
) -> Usage | None:
    """A `Usage` from a reply's token counts (None when the reply gave none), priced if known."""
    if not isinstance(input_tokens, int) and not isinstance(output_tokens, int):
        return None
    inp = input_tokens if isinstance(input_tokens, int) else 0
    out = output_tokens if isinstance(output_tokens, int) else 0
    cost = None if price is None else (inp * price[0] + out * price[1]) / 1_000_000
    return Usage(inp, out, cost)


def add_usage(total: Usage | None, more: Usage | None) -> Usage | None:
    """`total + more`, where None means "not reported"."""
    if total is None:
        return more
    return total if more is None else total + more


def _key(schema: Mapping[str, object]) -> str:
    return json.dumps(schema, sort_keys=True)


@lru_cache(maxsize=64)
def _validator(key: str) -> Draft202012Validator:
    # Keyed by the schema's JSON text: mnemo's schemas are a handful of constants, so the
    # compiled validators are built once each.
    schema = _unbounded(json.loads(key))
    return Draft202012Validator(schema if isinstance(schema, dict) else {})


# Bounds that guide a reply and are not checked: lengths and counts (`mnemo.reply.text`,
# `items`) shape generation, and every reader clamps a number into its range (a confidence of
# 4.5 is read as 1, a return score of 0 as 1). Refusing them cost a re-ask that a small model
# answered the same way, and then the whole task.
_GUIDES = frozenset({"maxLength", "maxItems", "minimum", "maximum"})


# The keywords `_plainly_valid` reads (the guides it leaves out as `_unbounded` does, and
# annotations): a schema with any other is for jsonschema to judge.
_PLAIN = frozenset({"type", "properties", "required", "additionalProperties", "items", "enum",
                    "anyOf", "description", "title"}) | _GUIDES
_TYPES: dict[str, Callable[[object], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool))
    or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _plainly_valid(value: object, schema: object) -> bool:
    """Whether `value` matches `schema` (bounds left out, as `_unbounded`), judged by a walk
    of the keywords replies' schemas use: True only when it surely does; False when it does
    not or when the schema says something the walk does not read (jsonschema then judges,
    and words the problem). jsonschema took 60-200 us of the event loop for a two-fact
    semantic reply (load 5-11), the walk 15 us: 48 replies a 16-trajectory close."""
    if not isinstance(schema, dict) or not schema.keys() <= _PLAIN:
        return False
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(k in _TYPES and _TYPES[k](value) for k in kinds if isinstance(k, str)):
            return False
    options = schema.get("enum")
    if options is not None and not (isinstance(options, list) and any(
            type(option) is type(value) and option == value for option in options
            if isinstance(option, str | int | float | bool | None))):
        return False
    alternatives = schema.get("anyOf")
    if alternatives is not None and not (isinstance(alternatives, list) and any(
            _plainly_valid(value, alternative) for alternative in alternatives)):
        return False
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        others = schema.get("additionalProperties", True)
        if not isinstance(properties, dict) or not isinstance(required, list) \
                or any(not isinstance(name, str) or name not in value for name in required):
            return False
        for name, item in value.items():
            known = properties.get(name)
            if known is None and others is True:
                continue
            if not _plainly_valid(item, others if known is None else known):
                return False
    elif isinstance(value, list) and "items" in schema:
        each = schema["items"]
        return isinstance(each, dict) and all(_plainly_valid(item, each) for item in value)
    return True


def _unbounded(node: object) -> object:
    """`node` (a schema) without the bounds that only guide a reply."""
    if isinstance(node, dict):
        return {k: _unbounded(v) for k, v in node.items() if k not in _GUIDES}
    if isinstance(node, list):
        return [_unbounded(v) for v in node]
    return node


def _where(error: ValidationError) -> str:
    path = "$"
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path
