"""A node's columns and their decoding, for every SQLite read of whole nodes."""

from __future__ import annotations

import json
import zlib
from datetime import datetime

import numpy as np

from mnemo.graph.model import NODE_TYPES, Node, NodeId, Vector
from mnemo.storage.graph_rows import NODE_WIDTH
from mnemo.storage.row import Row, json_object, loads


def node(row: Row) -> Node:
    """The node of a row that starts with NODE_COLUMNS."""
    (node_id, kind, text, data, created_at, valid_from, valid_to, recorded_at, retired_at,
     metadata) = row[:NODE_WIDTH]
    return Node(
        NodeId(node_id), NODE_TYPES[kind], text, json_object(loads(data)),
        datetime.fromisoformat(created_at),
        _moment(valid_from), _moment(valid_to), _moment(recorded_at), _moment(retired_at),
        {} if metadata is None else json.loads(metadata),
    )


def _moment(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def half_blob(vector: Vector) -> bytes:
    """A vector as `vectors` keeps it: float16 (a cosine moves by about 1e-4)."""
    return np.asarray(vector, dtype=np.float32).astype(np.float16).tobytes()


def vector_of_half(blob: bytes) -> Vector:
    """A `vectors` row's vector, as float32 (what every search computes with)."""
    return np.frombuffer(blob, dtype=np.float16).astype(np.float32)


# A packed text: this version byte, then raw deflate with `_WORDS` as preset dictionary.
# Never change `_WORDS` under this version.
_PACKED = b"\x01"
_WORDS = (
    b'"episodic_", "semantic_", "procedural_", "subgoal_", "source_", "tag_", "intent_",'
    b' "provenance"], "membership"], "hierarchical"], "sibling"],'
    b" ingest_episode_changeset_node_ids"
)


def pack_text(text: str) -> bytes:
    """A JSON text as a commit record or receipt keeps it (`unpack_text`)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, _WORDS)
    return _PACKED + packer.compress(text.encode()) + packer.flush()


def unpack_text(stored: str | bytes) -> str:
    """The text of a `pack_text` value, or of a text stored plain."""
    if isinstance(stored, str):
        return stored
    if not stored.startswith(_PACKED):
        raise ValueError("not a packed text")
    unpacker = zlib.decompressobj(-15, _WORDS)
    return (unpacker.decompress(stored[1:]) + unpacker.flush()).decode()
