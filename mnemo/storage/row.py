"""A row as a driver returns it (the reader beside each statement narrows its types), and JSON
read with msgspec, falling back to `json.loads` for what it refuses (NaN, lone surrogates)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from mnemo.errors import StorageError
from mnemo.ports import JSONObject

Column = Any
Row = tuple[Column, ...]

_DECODER = msgspec.json.Decoder()

# A read of more nodes than this builds them off the event loop (BENCHMARKS.md).
ON_LOOP_NODES = 200


def loads(text: str | bytes | bytearray | memoryview) -> object:
    try:
        return _DECODER.decode(text)
    except msgspec.DecodeError:
        return json.loads(bytes(text) if isinstance(text, memoryview) else text)


def json_object(value: object) -> JSONObject:
    """`value`, a JSON object as read; `StorageError("corrupt")` for another value."""
    if not isinstance(value, dict):
        raise StorageError("corrupt", f"a stored JSON object is a {type(value).__name__}")
    return value
