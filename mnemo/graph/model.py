"""The knowledge graph's values: node and link types, nodes, changesets and receipts."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import NewType, NoReturn, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from mnemo.errors import StorageError
from mnemo.ports import JSONObject

NodeId = NewType("NodeId", str)
Vector = npt.NDArray[np.float32]
_SORTED_JSON = msgspec.json.Encoder(order="sorted")


class NodeType(StrEnum):
    EPISODIC = "episodic"
    SEMANTIC = "semantic"
    PROCEDURAL = "procedural"
    SUBGOAL = "subgoal"
    SOURCE = "source"
    TAG = "tag"
    INTENT = "intent"


class LinkType(StrEnum):
    MEMBERSHIP = "membership"  # tag - semantic
    HIERARCHICAL = "hierarchical"  # intent - procedural, episodic - subgoal
    PROVENANCE = "provenance"  # semantic/procedural - episodic, episodic - source
    SIBLING = "sibling"  # semantic - semantic of one trajectory
    SUPERSEDES = "supersedes"  # a fact - the fact it contradicted (retired)


Member = TypeVar("Member", NodeType, LinkType)


class _StoredNames(dict[str, Member]):
    """Stored type names to their members. A name no member has (a row another program or a
    later version wrote) is a `StorageError("corrupt")`, as any unreadable row is, not a
    KeyError from deep inside a read."""

    def __missing__(self, name: str) -> NoReturn:
        raise StorageError("corrupt", f"a stored row names an unknown type {name!r}")


# A stored type name's member by a dict lookup: `NodeType(name)` goes through the enum's
# machinery at each call, and a recall hop decodes hundreds of rows.
NODE_TYPES: dict[str, NodeType] = _StoredNames((kind.value, kind) for kind in NodeType)
LINK_TYPES: dict[str, LinkType] = _StoredNames((kind.value, kind) for kind in LinkType)


@dataclass(frozen=True, slots=True)
class Node:
    """A node of a repo's graph. `text` is its proposition, instruction, label, ..."""

    id: NodeId
    type: NodeType
    text: str
    data: JSONObject
    created_at: datetime
    # Bi-temporal facts (SEMANTIC and PROCEDURAL nodes): when the fact held in the
    # world, and when mnemo recorded and retired it. None where unknown or still open.
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    recorded_at: datetime | None = None
    retired_at: datetime | None = None
    # Who the node belongs to: the metadata of the session, ingest or correction that made it
    # (`mnemo.graph.scope`); `{}` for none.
    metadata: dict[str, str | int | float | bool] = field(default_factory=dict)

    @property
    def retired(self) -> bool:
        """Whether a later fact contradicted this one (it stays, with `valid_to`)."""
        return self.retired_at is not None


@dataclass(frozen=True, slots=True)
class NodeDraft:
    """A node a changeset proposes. `key` identifies a TAG by its normalised label."""

    id: str
    type: NodeType
    text: str
    data: JSONObject
    vector: Vector
    key: str | None = None
    source_id: str | None = None
    # When a fact began to hold in the world; None: when it was recorded.
    valid_from: datetime | None = None


@dataclass(frozen=True, slots=True)
class Link:
    src: str
    dst: str
    type: LinkType


@dataclass(frozen=True, slots=True)
class Changeset:
    """What one extraction proposes to add to a repo. Applying it twice adds nothing."""

    id: str
    repo: str
    nodes: list[NodeDraft] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    step_ids: list[str] = field(default_factory=list)
    # The extraction tasks left out, each with why (`Config.partial_commits`).
    missing: list[str] = field(default_factory=list)
    # The generation of the repo's vectors its nodes' vectors were made for (`RepoRow.
    # generation`): a commit to a repo re-embedded since embeds them again first.
    generation: int = 0
    # The scope every node it adds carries (`Node.metadata`).
    metadata: dict[str, str | int | float | bool] = field(default_factory=dict)

    def to_json(self) -> str:
        raw: JSONObject = {
            "id": self.id,
            "repo": self.repo,
            "nodes": [_draft_to_dict(n) for n in self.nodes],
            "links": [[link.src, link.dst, link.type.value] for link in self.links],
            "step_ids": self.step_ids,
        }
        if self.missing:
            raw["missing"] = self.missing
        if self.generation:
            raw["generation"] = self.generation
        if self.metadata:
            raw["metadata"] = self.metadata
        # msgspec, keys sorted as json's sort_keys: a tenth of json.dumps's time for a close's
        # changeset (hundreds of KB), on the way from the last reply to ready.
        return _SORTED_JSON.encode(raw).decode()

    @classmethod
    def from_json(cls, text: str) -> Changeset:
        raw = json.loads(text)
        return cls(
            id=raw["id"],
            repo=raw["repo"],
            nodes=[_draft_from_dict(n) for n in raw["nodes"]],
            links=[Link(src, dst, LinkType(kind)) for src, dst, kind in raw["links"]],
            step_ids=list(raw["step_ids"]),
            missing=[str(m) for m in raw.get("missing", [])],
            generation=int(raw.get("generation", 0)),
            metadata=dict(raw.get("metadata", {})),
        )


@dataclass(frozen=True, slots=True)
class CommitReceipt:
    """What a commit added: the ids of the nodes it created, durable when returned, and the
    extraction tasks whose part it lacks, each with why (`Config.partial_commits`)."""

    changeset_id: str
    repo: str
    node_ids: list[NodeId]
    missing: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        raw: JSONObject = {
            "changeset_id": self.changeset_id, "repo": self.repo, "node_ids": self.node_ids,
        }
        if self.missing:
            raw["missing"] = self.missing
        return json.dumps(raw, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CommitReceipt:
        raw = json.loads(text)
        return cls(raw["changeset_id"], raw["repo"], list(raw["node_ids"]),
                   [str(m) for m in raw.get("missing", [])])


def step_window(node_id: str, width: int) -> list[str]:
    """The ids of the EPISODIC nodes up to `width` steps before and after the step whose node
    is `node_id` in its episode, nearest first (those that exist or not); none for an id of
    another shape. A step's id is "<episode id>:<index>" and its node's "episodic_<step id>"
    (extraction.pipeline)."""
    head, colon, index = node_id.rpartition(":")
    if not (colon and head.startswith("episodic_") and index.isascii() and index.isdigit()):
        return []
    at = int(index)
    return [f"{head}:{i}" for d in range(1, width + 1) for i in (at - d, at + d) if i >= 0]


# A tag's identity keeps this many characters of its label: a concept is a short label, and a
# key must fit PostgreSQL's index entries (2,704 bytes, beside the repo's name).
MAX_LABEL_CHARS = 200


def normalise_label(label: str) -> str:
    """A tag's identity: trimmed, lower-case, inner whitespace collapsed, at most
    `MAX_LABEL_CHARS` characters (two labels that agree that far are one tag)."""
    return " ".join(label.split()).lower()[:MAX_LABEL_CHARS].rstrip()


def now_utc() -> datetime:
    return datetime.now(UTC)


def vector_to_blob(vector: Vector) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


def vector_from_blob(blob: bytes) -> Vector:
    return np.frombuffer(blob, dtype=np.float32)


def _draft_to_dict(node: NodeDraft) -> JSONObject:
    return {
        "id": node.id,
        "type": node.type.value,
        "text": node.text,
        "data": node.data,
        "vector": base64.b64encode(vector_to_blob(node.vector)).decode("ascii"),
        "key": node.key,
        "source_id": node.source_id,
        "valid_from": None if node.valid_from is None else node.valid_from.isoformat(),
    }


def _draft_from_dict(raw: JSONObject) -> NodeDraft:
    return NodeDraft(
        id=str(raw["id"]),
        type=NODE_TYPES[str(raw["type"])],
        text=str(raw["text"]),
        data=_object(raw["data"]),
        vector=vector_from_blob(base64.b64decode(str(raw["vector"]))),
        key=_optional_text(raw["key"]),
        source_id=_optional_text(raw["source_id"]),
        valid_from=(
            datetime.fromisoformat(str(raw["valid_from"])) if raw.get("valid_from") else None
        ),
    )


def _object(value: object) -> JSONObject:
    if not isinstance(value, dict):
        raise StorageError("corrupt", f"a stored node's data is a {type(value).__name__}")
    return value


def _optional_text(value: object) -> str | None:
    return None if value is None else str(value)
