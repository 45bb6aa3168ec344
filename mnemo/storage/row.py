"""A row as a database driver returns it (sqlite3, psycopg): what type each column has is
known only from the statement that read it, so the reader beside each statement narrows it.

A JSON column is read with msgspec (`loads`); what it refuses (NaN, infinities, escaped lone
surrogates, all of which `json.dumps` writes) goes to the standard library, so whatever
`json.dumps` wrote reads back the same."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from mnemo.errors import StorageError
from mnemo.ports import JSONObject

# A column's value, as the driver decoded it.
Column = Any
Row = tuple[Column, ...]

_DECODER = msgspec.json.Decoder()

# A read of more nodes than this builds them off the event loop (SQLite: on the connection's
# thread, even when its recall cache holds them all): a node of a long step costs tens of
# microseconds to build (its JSON).
ON_LOOP_NODES = 200


def loads(text: str | bytes | bytearray | memoryview) -> object:
    """The value of a JSON document, as `json.loads` reads it."""
    try:
        return _DECODER.decode(text)
    except msgspec.DecodeError:
        return json.loads(bytes(text) if isinstance(text, memoryview) else text)


def loads_object(text: str | bytes | bytearray | memoryview) -> JSONObject:
    """The JSON object `text` holds (a node's data).

    Raises:
        StorageError: "corrupt", it holds another JSON value.
    """
    value = loads(text)
    if not isinstance(value, dict):
        raise StorageError("corrupt", f"a stored JSON object is a {type(value).__name__}")
    return value
