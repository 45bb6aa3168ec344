"""Bi-temporal facts: the times a SEMANTIC or PROCEDURAL node is stored with, and a fact's
correction."""

from __future__ import annotations

import uuid

from mnemo.graph.model import Changeset, Link, LinkType, Node, NodeDraft, NodeType, Vector

TEMPORAL = frozenset({NodeType.SEMANTIC, NodeType.PROCEDURAL})


def times(node: NodeDraft, recorded: str) -> tuple[str | None, str | None]:
    """(recorded_at, valid_from) of a new node as ISO text: a fact is recorded when its commit
    is, and holds from the time its draft names, else from then; other nodes have neither."""
    if node.type not in TEMPORAL:
        return None, None
    return recorded, recorded if node.valid_from is None else node.valid_from.isoformat()


def correction(repo: str, old: Node, text: str, vector: Vector, generation: int) -> Changeset:
    """A changeset of one fact, `text` (of `old`'s type, data and scope), that supersedes
    `old`: committed, it retires `old` as a contradicting fact does
    (`mnemo.graph.contradiction`: kept, with `valid_to`, linked from its successor by
    SUPERSEDES)."""
    new_id = f"{old.type.value}_{uuid.uuid4().hex}"
    return Changeset(
        id=f"changeset_{uuid.uuid4().hex}",
        repo=repo,
        nodes=[NodeDraft(new_id, old.type, text, dict(old.data), vector)],
        links=[Link(new_id, old.id, LinkType.SUPERSEDES)],
        generation=generation,
        metadata=dict(old.metadata),
    )
