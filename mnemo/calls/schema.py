"""A task's reply struct (`Reply`) and the JSON schema sent for it: inlined, every field
required but `UNSET` ones, never null. `text(n)` and `items(n)` bound a string or a list in
the schema only; `most_tokens` is the longest reply a bounded schema allows."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from mnemo.ports import JSONObject, JSONValue

__all__ = [
    "MOST_ITEMS", "UNSET", "Meta", "Reply", "UnsetType", "bounded", "items", "most_tokens",
    "reply_schema", "text",
]

# The most items a reply's list may hold, whatever its task's inputs.
MOST_ITEMS = 16
# Characters a token stands for, counted low so that `most_tokens` errs long.
_CHARS_PER_TOKEN = 3


def text(at_most: int, description: str | None = None) -> Meta:
    """A string field's `maxLength` (in the schema only)."""
    return Meta(description=description, extra_json_schema={"maxLength": at_most})


def items(at_most: int) -> Meta:
    """A list field's `maxItems` (in the schema only)."""
    return Meta(extra_json_schema={"maxItems": at_most})


def bounded(
    schema: JSONObject, field: str, count: int, *, most: int | None = MOST_ITEMS,
    floor: int = 64, cap: int | None = 4096,
) -> tuple[JSONObject, int]:
    """A request's schema, its list `field` holding at most `count` items (a string field: at
    most `count` characters), and the max_tokens its longest reply needs (`floor` to `cap`)."""
    count = max(1, count if most is None else min(count, most))
    properties = schema.get("properties")
    field_schema = properties.get(field) if isinstance(properties, dict) else None
    if not isinstance(properties, dict) or not isinstance(field_schema, dict):
        raise KeyError(f"the schema has no field {field!r}")
    key = "maxLength" if field_schema.get("type") == "string" else "maxItems"
    schema = {**schema, "properties": {**properties, field: {**field_schema, key: count}}}
    longest = most_tokens(schema) or 4096
    return schema, max(floor, longest if cap is None else min(cap, longest))


def most_tokens(schema: Mapping[str, object]) -> int | None:
    """The most tokens a reply matching `schema` can take, keys and punctuation included; None when
    a string or a list in it is unbounded."""
    kind, options = schema.get("type"), schema.get("anyOf")
    if options is not None:
        sizes = [most_tokens(o) if isinstance(o, Mapping) else None
                 for o in (options if isinstance(options, list) else [None])]
        return None if not sizes or None in sizes else max(n for n in sizes if n is not None)
    at_most = schema.get("maxLength" if kind == "string" else "maxItems")
    if kind == "string":
        return at_most // _CHARS_PER_TOKEN + 2 if isinstance(at_most, int) else None
    if kind == "array":
        item = schema.get("items")
        each = most_tokens(item) if isinstance(item, Mapping) else None
        return None if not isinstance(at_most, int) or each is None else 2 + at_most * (each + 1)
    if kind == "object":
        properties = schema.get("properties")
        fields = properties.items() if isinstance(properties, Mapping) else ()
        each_field = [(name, most_tokens(sub) if isinstance(sub, Mapping) else None)
                      for name, sub in fields]
        if any(size is None for _, size in each_field):
            return None
        return 2 + sum(len(name) // _CHARS_PER_TOKEN + 4 + (size or 0)
                       for name, size in each_field)
    return 6 if kind == "number" else 4  # a confidence; an index, a score, a boolean


class Reply(Struct, frozen=True, kw_only=True):
    """A task's reply; subclasses declare its fields, in the order the model is shown them."""

@cache
def reply_schema(kind: type[Reply]) -> JSONObject:
    """The JSON schema of `kind` (see the module doc); cached, so read-only."""
    (root,), defs = msgspec.json.schema_components([kind], ref_template="{name}")
    schema = _inline(root, defs)
    if not isinstance(schema, dict):
        raise TypeError(f"{kind.__name__} has no object schema")
    return schema


def _inline(node: JSONValue, defs: JSONObject) -> JSONValue:
    """`node` with `$ref`s inlined, no `title`, `default`, all but `UNSET` fields required."""
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str):
        return _inline(defs[ref], defs)
    choices = node.get("anyOf")
    if isinstance(choices, list):
        # null is what a reader tolerates, never what a model is asked for.
        shown = [c for c in choices if c != {"type": "null"}]
        if len(shown) == 1:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            return _inline({**rest, **shown[0]}, defs)
        node = {**node, "anyOf": shown}
    out: JSONObject = {k: {name: _inline(sub, defs) for name, sub in v.items()}
                       if k == "properties" and isinstance(v, dict) else _inline(v, defs)
                       for k, v in node.items() if k not in ("title", "default")}
    properties = node.get("properties")
    if isinstance(properties, dict):
        required = node.get("required")
        out["required"] = [name for name, sub in properties.items()
                           if (isinstance(required, list) and name in required)
                           or (isinstance(sub, dict) and "default" in sub)]
        out["additionalProperties"] = False
    return out
