"""A node's decoding, for every PostgreSQL read of whole nodes (`graph_base.NODE_COLUMNS`)."""

from __future__ import annotations

from mnemo.graph.model import NODE_TYPES, Node, NodeId
from mnemo.storage.graph_rows import NODE_COLUMNS
from mnemo.storage.row import Row

NODE_WIDTH = len(NODE_COLUMNS.split(","))


def node(row: Row) -> Node:
    """The node of a row that starts with NODE_COLUMNS."""
    node_id, kind, text, data, created_at, start, end, recorded, retired, metadata = (
        row[:NODE_WIDTH])
    return Node(NodeId(str(node_id)), NODE_TYPES[kind], str(text), dict(data), created_at, start,
                end, recorded, retired, dict(metadata or {}))
