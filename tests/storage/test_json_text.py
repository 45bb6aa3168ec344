"""`mnemo.storage.row.loads`, the stores' JSON reader: whatever `json.dumps` wrote, it reads
back as `json.loads` does (msgspec for speed, the standard library for what msgspec refuses)."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, strategies as st

from mnemo.graph.model import Node, NodeType
from mnemo.storage.row import loads
from mnemo.storage.sqlite.rows import node
from tests.fakes import js

values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.text()
    | st.integers() | st.integers(min_value=2**63 - 2, max_value=2**70),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (NaN equal to NaN; 1 is not 1.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@given(values)
def test_reads_what_json_wrote_as_json_reads_it(value: Any) -> None:
    """Big integers stay integers, NaN and infinities and lone surrogates are read, key order
    is kept; from text, bytes and a memoryview alike."""
    text = json.dumps(value)
    expected = json.loads(text)
    for given_as in (text, text.encode(), memoryview(text.encode())):
        assert same(loads(given_as), expected)


def test_a_node_row_is_decoded_whole() -> None:
    """A SQLite row of NODE_COLUMNS becomes its node: type, data, every moment and its
    metadata."""
    data = {"reward": float("nan"), "big": 2**80, "text": "caf\u00e9"}
    row = ("n1", "semantic", "a fact", json.dumps(data), "2026-11-23T08:00:00+00:00",
           None, "2026-11-24T00:00:00+00:00", None, "2026-11-25T00:00:00+00:00",
           '{"user_id": "a"}', 3, None)
    decoded = node(row)
    assert isinstance(decoded, Node)
    assert decoded.type is NodeType.SEMANTIC
    assert decoded.data["big"] == 2**80
    assert math.isnan(js(decoded.data)["reward"])
    assert (decoded.valid_from, decoded.recorded_at) == (None, None)
    assert decoded.valid_to is not None
    assert decoded.valid_to.day == 24
    assert decoded.retired_at is not None
    assert decoded.retired_at.day == 25
    assert decoded.metadata == {"user_id": "a"}
