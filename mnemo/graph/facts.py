"""Bi-temporal facts: the times a SEMANTIC or PROCEDURAL node is stored with."""

from __future__ import annotations

from mnemo.graph.model import NodeDraft, NodeType

TEMPORAL = frozenset({NodeType.SEMANTIC, NodeType.PROCEDURAL})


def times(node: NodeDraft, recorded: str) -> tuple[str | None, str | None]:
    """(recorded_at, valid_from) of a new node as ISO text: a fact is recorded when its commit
    is, and holds from the time its draft names, else from then; other nodes have neither."""
    if node.type not in TEMPORAL:
        return None, None
    return recorded, recorded if node.valid_from is None else node.valid_from.isoformat()
