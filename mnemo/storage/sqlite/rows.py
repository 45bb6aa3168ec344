"""A node's columns and their decoding, for every SQLite read of whole nodes (one place, so
that a column added to nodes reaches every reader: recall's batched reads once missed the
bi-temporal ones)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from mnemo.graph.model import Node, NodeType

NODE_COLUMNS = "id, type, text, data, created_at, valid_from, valid_to, recorded_at, retired_at"
NODE_WIDTH = len(NODE_COLUMNS.split(","))


def node(row: tuple[Any, ...]) -> Node:
    """The node of a row that starts with NODE_COLUMNS."""
    node_id, kind, text, data, created_at, *times = row[:NODE_WIDTH]
    return Node(
        node_id, NodeType(kind), text, json.loads(data), datetime.fromisoformat(created_at),
        *(None if t is None else datetime.fromisoformat(t) for t in times),
    )
