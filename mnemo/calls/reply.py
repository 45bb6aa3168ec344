"""A task's reply, from the schema a model is sent to the typed value read back: both come
from one msgspec struct per task (`Reply`), and this module is the only place a reply is
checked.

`reply_schema` turns a `Reply` subclass into a self-contained JSON schema (no `$ref`: a server's
grammar and the JSON mode's example read it whole). Every field is required in the schema except
one that defaults to `UNSET` (the model may leave it out), and null is never offered: a field
that takes None (and defaults to it) is still asked for, and read as None when a model forgets
it or sends null. A schema asks; it never refuses: a reply is whatever its struct reads.

`text(n)` and `items(n)` bound a string's length and a list's items in the schema
(`maxLength`, `maxItems`), where a server that turns the schema into a grammar (llama.cpp,
vLLM, Ollama) keeps the model within them: a small model that rambles ends its reply instead
of running into `max_tokens`. They bound generation only: a reply past them is read all the
same (msgspec does not check `extra_json_schema`). `most_tokens` is the longest reply a bounded
schema allows, for the task's `max_tokens`.

`read_reply` reads a reply (its `data`, else its text as JSON, `decode_json`) into the class
leniently (`strict=False`: a numeric string reads as a number, which small models write), and
phrases a mismatch as a `ValueError` naming the field ("facts[2].proposition must be a string,
got 3"). A reply cut short is `Cut`, raised by an adapter; `salvage` keeps what it holds whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from typing import TypeVar

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType
from msgspec import inspect as mi
from partial_json_parser import Allow, fix_fast

from mnemo.errors import LLMContextError, LLMReplyError
from mnemo.ports import JSONObject, JSONValue, LLMResponse

__all__ = [
    "UNSET", "Cut", "Meta", "Reply", "UnsetType", "bounded", "decode_json", "items",
    "most_tokens", "preview", "read_reply", "reply_data", "reply_schema", "salvage", "text",
    "with_most_items",
]

# The most items a reply's list may hold, whatever its task's inputs.
MOST_ITEMS = 16

# Characters a token stands for, counted low (JSON escapes, digits, short words) so that
# `most_tokens` errs long.
_CHARS_PER_TOKEN = 3


def text(at_most: int, description: str | None = None) -> Meta:
    """A string field's bound: at most `at_most` characters in the schema (`maxLength`)."""
    return Meta(description=description, extra_json_schema={"maxLength": at_most})


def items(at_most: int) -> Meta:
    """A list field's bound: at most `at_most` items in the schema (`maxItems`)."""
    return Meta(extra_json_schema={"maxItems": at_most})


def with_most_items(schema: JSONObject, field: str, at_most: int) -> JSONObject:
    """A copy of `schema` whose top-level list `field` allows at most `at_most` items (a
    reply's length in proportion to its task's inputs)."""
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not isinstance(properties.get(field), dict):
        raise KeyError(f"the schema has no list field {field!r}")
    return {**schema, "properties": {**properties,
                                     field: {**properties[field], "maxItems": at_most}}}


def bounded(
    schema: JSONObject, field: str, count: int, *, most: int | None = MOST_ITEMS,
    floor: int = 64,
) -> tuple[JSONObject, int]:
    """A request's schema, its list `field` holding at most `count` items (at least one, at
    most `most`: None for a list that answers its inputs one by one), and the max_tokens that
    holds the longest reply it allows (at least `floor`, at most 4096)."""
    count = count if most is None else min(count, most)
    schema = with_most_items(schema, field, max(1, count))
    return schema, max(floor, min(4096, most_tokens(schema) or 4096))


def most_tokens(schema: Mapping[str, object]) -> int | None:
    """The most tokens a reply matching `schema` can take, counting its keys, quotes and
    punctuation; None when a string or a list in it is unbounded."""
    kind = schema.get("type")
    if "anyOf" in schema:
        options = schema["anyOf"]
        sizes = [most_tokens(o) for o in options if isinstance(o, Mapping)] if isinstance(
            options, list) else [None]
        return None if None in sizes or not sizes else max(n for n in sizes if n is not None)
    if kind == "string":
        at_most = schema.get("maxLength")
        return at_most // _CHARS_PER_TOKEN + 2 if isinstance(at_most, int) else None
    if kind == "array":
        at_most, item = schema.get("maxItems"), schema.get("items")
        each = most_tokens(item) if isinstance(item, Mapping) else None
        if not isinstance(at_most, int) or each is None:
            return None
        return 2 + at_most * (each + 1)
    if kind == "object":
        properties = schema.get("properties")
        total = 2
        for name, value in (properties.items() if isinstance(properties, Mapping) else ()):
            size = most_tokens(value) if isinstance(value, Mapping) else None
            if size is None:
                return None
            total += len(name) // _CHARS_PER_TOKEN + 4 + size
        return total
    if kind == "integer":
        return 4  # a step's index, a score
    if kind == "number":
        return 6  # a confidence, a reward
    return 4  # boolean, null


class Reply(Struct, frozen=True, kw_only=True):
    """A task's reply; subclasses declare its fields, in the order the model is shown them.
    Unknown fields are ignored when read (the schema says there are none)."""


R = TypeVar("R", bound=Reply)

_NAMES = {"array": "a list", "object": "an object", "str": "a string", "int": "an integer",
          "float": "a number", "null": "null", "bool": "a boolean"}
_EXPECTED = re.compile(r"^Expected `([^`]+)`(?:, got `([^`]+)`)?(?: - at `([^`]+)`)?$")
_MISSING = re.compile(r"^Object missing required field `([^`]+)`(?: - at `([^`]+)`)?$")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


@cache
def reply_schema(kind: type[Reply]) -> JSONObject:
    """The JSON schema of `kind`, with every struct inlined and its `required` as the module
    docstring says. Cached: treat the result as read-only."""
    (root,), defs = msgspec.json.schema_components([kind], ref_template="{name}")
    optional = {info.cls.__name__: {f.name for f in msgspec.structs.fields(info.cls)
                                    if f.default is UNSET}
                for info in _structs(mi.type_info(kind))}
    schema = _inline(root, defs, optional)
    if not isinstance(schema, dict):
        raise TypeError(f"{kind.__name__} has no object schema")
    return schema


def read_reply(response: LLMResponse, kind: type[R], task: str) -> R:
    """`response` (its `reply_data`) as a `kind`.

    Raises:
        ValueError: the reply holds no JSON object, or a field that does not match (named by
            its path from the reply's root, what it must be, and what it is).
    """
    data = reply_data(response, strict=True)
    if not isinstance(data, dict):
        raise ValueError(f"{task} reply must be a JSON object, got {preview(data)}")
    try:
        return msgspec.convert(data, kind, strict=False)
    except msgspec.ValidationError as exc:
        raise ValueError(_problem(str(exc), data, kind, task)) from None


def reply_data(response: LLMResponse, *, strict: bool = False) -> object:
    """A structured reply's JSON value: its `data`, else its `text` read by `decode_json`
    (an LLM of one's own may answer in text); None when neither holds one.

    Raises:
        ValueError: (`strict` only) saying why the text holds no JSON value.
    """
    if response.data is not None or not response.text.strip():
        return response.data
    try:
        return decode_json(response.text)
    except ValueError:
        if strict:
            raise
        return None


def preview(value: object) -> str:
    """`repr(value)` cut to 120 characters, for a parser's error message."""
    shown = repr(value)
    return shown if len(shown) <= 120 else shown[:117] + "..."


_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?```\s*$", re.DOTALL)
_OPEN_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n?(.*)$", re.DOTALL)
_LENIENT = json.JSONDecoder(strict=False)
_DECODER = msgspec.json.Decoder()


def decode_json(text: str) -> object:
    """The JSON value in a model's reply text.

    Accepts the bare value, the value in a Markdown code fence, or prose around one object, and
    raw control characters (a newline, a tab) inside strings, which small local models write
    and strict JSON forbids.

    Raises:
        ValueError: saying why no JSON value could be read.
    """
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1).strip()
    if not stripped:
        raise ValueError("the reply is empty, expected a JSON object")
    try:
        return _DECODER.decode(stripped)
    except msgspec.DecodeError:
        pass
    try:
        return json.loads(stripped, strict=False)
    except json.JSONDecodeError as exc:
        start = stripped.find("{")
        if start >= 0:
            try:
                return _LENIENT.raw_decode(stripped[start:])[0]
            except json.JSONDecodeError:
                pass
        raise ValueError(f"the reply is not valid JSON ({exc.msg} at char {exc.pos})") from exc


def is_cut(text: str) -> bool:
    """Whether `text` is the start of a JSON object that stopped before its end (a reply cut
    short), rather than JSON with a mistake in it."""
    stripped = _opened(text)
    start = stripped.find("{")
    if start < 0:
        return False
    try:
        _LENIENT.raw_decode(stripped[start:])
    except json.JSONDecodeError as exc:
        # The decoder ran out of text: what came was well formed, only unfinished.
        return exc.pos >= len(stripped) - start - 1 or exc.msg.startswith("Unterminated")
    return False


class Cut(LLMReplyError, LLMContextError):
    """A structured reply that stopped before its end: at its max_tokens, the adapter allowing
    no more (`at_cap`), or with room left under it, when the model's context filled. `text` is
    what came (the start of a JSON value), `data` what the provider read of it (a tool call's
    input), if anything. Unusable as it is (`LLMReplyError`), and a shorter prompt may go
    through (`LLMContextError`)."""

    def __init__(self, message: str, *, text: str, data: object = None, at_cap: bool) -> None:
        super().__init__(message)
        self.text, self.data, self.at_cap = text, data, at_cap


def salvage(cut: Cut) -> JSONObject | None:
    """What a cut reply holds whole: its JSON object without a string or a number cut midway
    (`partial-json-parser`), and without the last item of its last list when the cut fell
    inside that item (a provider's own reading, `data`, is taken to be cut inside it); None
    when no list item is left."""
    stripped = _opened(cut.text)
    start = stripped.find("{")
    value: object = cut.data
    inside_item = True
    if start >= 0:
        try:
            head, tail = fix_fast(stripped[start:], Allow.OBJ | Allow.ARR)
            value = json.loads(head + tail)
        except Exception:  # the parser's own errors: nothing whole in it
            return None
        # The containers left open: the root, a list of it, and an item of that list.
        inside_item = len(tail) > 2
    if not isinstance(value, dict) or not value:
        return None
    last = next(reversed(value))
    if inside_item and isinstance(value[last], list):
        value[last] = value[last][:-1]
    return value if any(isinstance(v, list) and v for v in value.values()) else None


def _opened(text: str) -> str:
    """`text` without the Markdown fence it opens with, if any."""
    stripped = text.strip()
    fenced = _OPEN_FENCE.match(stripped)
    return fenced.group(1).strip().removesuffix("```") if fenced else stripped


def _problem(message: str, data: JSONObject, kind: type[Reply], task: str) -> str:
    missing = _MISSING.match(message)
    if missing:
        name, at = missing.group(1), _where(missing.group(2) or "$")
        wanted = _field_type(kind, (missing.group(2) or "$") + f".{name}")
        if not at:
            return f"{task} reply has no {name!r} field ({name} must be {wanted}): {preview(data)}"
        return f"{at}.{name} must be {wanted}, got nothing"
    expected = _EXPECTED.match(message)
    if expected and expected.group(3):
        path = expected.group(3)
        return (f"{_where(path)} must be {_phrase(expected.group(1))}, got "
                f"{preview(_value_at(data, path))}")
    located = re.search(r" - at `([^`]+)`$", message)
    where = _where(located.group(1)) if located else f"{task} reply"
    return f"{where}: {message.split(' - at ')[0]}"


def _phrase(expected: str) -> str:
    words = [_NAMES.get(part.strip().split(" ")[0], part.strip()) for part in expected.split("|")]
    return " or ".join(words)


def _where(path: str) -> str:
    return path.removeprefix("$").removeprefix(".")


def _value_at(data: object, path: str) -> object:
    for key, index in _STEP.findall(path):
        if key and isinstance(data, dict):
            data = data.get(key)
        elif index and isinstance(data, list) and int(index) < len(data):
            data = data[int(index)]
        else:
            return None
    return data


def _field_type(kind: type[Reply], path: str) -> str:
    """What the field at `path` of `kind` must be, in words."""
    info = mi.type_info(kind)
    for key, _ in _STEP.findall(path):
        info = _bare(info)
        if isinstance(info, mi.ListType) and not key:
            info = info.item_type
        elif isinstance(info, mi.StructType):
            info = next((f.type for f in info.fields if f.name == key), info)
    return _describe(_bare(info))


def _bare(info: mi.Type) -> mi.Type:
    return info.type if isinstance(info, mi.Metadata) else info


def _describe(info: mi.Type) -> str:
    names = {mi.ListType: "a list", mi.StructType: "an object", mi.StrType: "a string",
             mi.IntType: "an integer", mi.FloatType: "a number", mi.BoolType: "a boolean",
             mi.NoneType: "null"}
    if isinstance(info, mi.UnionType):
        return " or ".join(_describe(_bare(t)) for t in info.types)
    return names.get(type(info), "a value")


def _structs(info: mi.Type) -> list[mi.StructType]:
    """Every struct type reachable from `info`, `info` first."""
    found: list[mi.StructType] = []
    stack = [info]
    while stack:
        item = stack.pop()
        if isinstance(item, mi.StructType):
            if all(s.cls is not item.cls for s in found):
                found.append(item)
                stack.extend(f.type for f in item.fields)
        elif isinstance(item, mi.ListType):
            stack.append(item.item_type)
        elif isinstance(item, mi.UnionType):
            stack.extend(item.types)
        elif isinstance(item, mi.Metadata):
            stack.append(item.type)
    return found


def _inline(node: JSONValue, defs: JSONObject, optional: dict[str, set[str]]) -> JSONValue:
    """`node` (a schema) with each `$ref` replaced by its definition, without msgspec's
    `title` and `default` annotations."""
    if isinstance(node, list):
        return [_inline(item, defs, optional) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str):
        return _inline(defs[ref], defs, optional)
    choices = node.get("anyOf")
    if isinstance(choices, list):
        # null is what a reader tolerates, never what a model is asked for.
        shown = [c for c in choices if c != {"type": "null"}]
        if len(shown) == 1:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            return _inline({**rest, **shown[0]}, defs, optional)
        node = {**node, "anyOf": shown}
    out: JSONObject = {}
    for key, value in node.items():
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: _inline(sub, defs, optional) for name, sub in value.items()}
        elif key not in ("title", "default"):
            out[key] = _inline(value, defs, optional)
    properties = out.get("properties")
    if isinstance(properties, dict) and isinstance(node.get("title"), str):
        leave_out = optional.get(str(node["title"]), set())
        out["required"] = [name for name in properties if name not in leave_out]
        out["additionalProperties"] = False
    return out
