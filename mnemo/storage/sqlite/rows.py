"""A node's columns and their decoding, for every SQLite read of whole nodes (one place, so
that a column added to nodes reaches every reader: recall's batched reads once missed the
bi-temporal ones)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from mnemo.graph.model import NODE_TYPES, Node
from mnemo.storage.json_text import loads

NODE_COLUMNS = "id, type, text, data, created_at, valid_from, valid_to, recorded_at, retired_at"
NODE_WIDTH = len(NODE_COLUMNS.split(","))


def node(row: tuple[Any, ...]) -> Node:
    """The node of a row that starts with NODE_COLUMNS."""
    node_id, kind, text, data, created_at, valid_from, valid_to, recorded_at, retired_at = (
        row[:NODE_WIDTH]
    )
    return Node(
        node_id, NODE_TYPES[kind], text, loads(data), datetime.fromisoformat(created_at),
        _moment(valid_from), _moment(valid_to), _moment(recorded_at), _moment(retired_at),
    )


def _moment(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)
