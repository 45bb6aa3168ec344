"""The knowledge graph's values, and `node_value`, a node's worth beyond its relevance:
recency x frequency x reward."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, NewType, NoReturn, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from mnemo.config import Config
from mnemo.errors import StorageError
from mnemo.ports import JSONObject, vector_from_blob, vector_to_blob

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
    """Stored type names to their members; an unknown name is `StorageError("corrupt")`."""

    def __missing__(self, name: str) -> NoReturn:
        raise StorageError("corrupt", f"a stored row names an unknown type {name!r}")


# A dict lookup, cheaper than `NodeType(name)`.
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
    # Bi-temporal facts (SEMANTIC and PROCEDURAL): when the fact held in the world, and when
    # mnemo recorded and retired it; None where unknown or still open.
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    recorded_at: datetime | None = None
    retired_at: datetime | None = None
    # Who the node belongs to (`mnemo.graph.scope`); `{}` for none.
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
    # The generation of the repo's vectors its vectors were made for (re-embedded if stale).
    generation: int = 0
    # The scope every node it adds carries (`Node.metadata`).
    metadata: dict[str, str | int | float | bool] = field(default_factory=dict)

    def to_json(self) -> str:
        nodes = [_Draft(**_fields(n, _Draft, vector=vector_to_blob(n.vector))) for n in self.nodes]
        links = [(link.src, link.dst, link.type) for link in self.links]
        wire = _Changeset(**_fields(self, _Changeset, nodes=nodes, links=links))
        return _SORTED_JSON.encode(wire).decode()

    @classmethod
    def from_json(cls, text: str) -> Changeset:
        """StorageError("corrupt") for a text that is not a changeset's JSON."""
        try:
            raw = msgspec.json.decode(text, type=_Changeset)
        except msgspec.DecodeError as exc:
            raise StorageError("corrupt", f"a stored changeset: {exc}") from exc
        nodes = [NodeDraft(**_fields(d, _Draft, vector=vector_from_blob(d.vector)))
                 for d in raw.nodes]
        return cls(**_fields(raw, _Changeset, nodes=nodes, links=[Link(*k) for k in raw.links]))


def _fields(value: object, kind: type[msgspec.Struct], **changed: object) -> dict[str, Any]:
    """`value`'s attributes named as `kind`'s fields, but those in `changed`."""
    return {name: getattr(value, name) for name in kind.__struct_fields__} | changed


class _Draft(msgspec.Struct, frozen=True):
    """A `NodeDraft` in a changeset's JSON: its vector as float32 bytes (base64)."""

    id: str
    type: NodeType
    text: str
    data: dict[str, Any]
    vector: bytes
    key: str | None
    source_id: str | None
    valid_from: datetime | None = None


class _Changeset(msgspec.Struct, frozen=True, omit_defaults=True):
    """A `Changeset`'s JSON (keys sorted by `_SORTED_JSON`), a link as [src, dst, type]."""

    id: str
    repo: str
    nodes: list[_Draft]
    links: list[tuple[str, str, LinkType]]
    step_ids: list[str]
    missing: list[str] = []
    generation: int = 0
    metadata: dict[str, str | int | float | bool] = {}


@dataclass(frozen=True, slots=True)
class CommitReceipt:
    """What a commit added: the ids of the nodes it created (durable when returned), and the
    extraction tasks whose part it lacks, each with why."""

    changeset_id: str
    repo: str
    node_ids: list[NodeId]
    missing: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        """Sorted keys, as the stores keep every JSON text."""
        return json.dumps(msgspec.to_builtins(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CommitReceipt:
        return msgspec.json.decode(text, type=cls)


# Bi-temporal facts: the node types stored with the times a fact held and was recorded.
TEMPORAL = frozenset({NodeType.SEMANTIC, NodeType.PROCEDURAL})


def times(node: NodeDraft, recorded: str) -> tuple[str | None, str | None]:
    """(recorded_at, valid_from) of a new node as ISO text: a fact's are its commit's time (or
    the draft's `valid_from`); other nodes have neither."""
    if node.type not in TEMPORAL:
        return None, None
    return recorded, recorded if node.valid_from is None else node.valid_from.isoformat()


# What a correction keeps of the old fact's data, no words of its source (a forget of that
# source erases them): its numbers, and a LangGraph item's address (its metadata's mark).
NUMBERS = ("confidence", "return_score")
ADDRESS = ("namespace", "key", "created_at")


def kept(old: Node) -> JSONObject:
    """Of `old`'s data, what a correction of it keeps."""
    data: JSONObject = {k: v for k in NUMBERS if isinstance(v := old.data.get(k), int | float)
                        and not isinstance(v, bool)}
    if old.metadata.get("langgraph") is True:
        data.update({k: old.data[k] for k in ADDRESS if k in old.data})
    return data


def correction(repo: str, old: Node, text: str, vector: Vector, generation: int) -> Changeset:
    """A changeset of one fact, `text` (of `old`'s type and scope, with what it `kept` of its
    data; a procedure's instruction is `text`), that supersedes and retires `old` when
    committed."""
    new_id = f"{old.type.value}_{uuid.uuid4().hex}"
    data = kept(old)
    if old.type is NodeType.PROCEDURAL:
        data["instruction"] = text
    return Changeset(
        id=f"changeset_{uuid.uuid4().hex}",
        repo=repo,
        nodes=[NodeDraft(new_id, old.type, text, data, vector)],
        links=[Link(new_id, old.id, LinkType.SUPERSEDES)],
        generation=generation,
        metadata=dict(old.metadata),
    )


def step_window(node_id: str, width: int) -> list[str]:
    """The ids of the EPISODIC nodes up to `width` steps around `node_id`'s in its episode,
    nearest first, existing or not; none for an id not "episodic_<episode>:<i>"."""
    head, colon, index = node_id.rpartition(":")
    if not (colon and head.startswith("episodic_") and index.isascii() and index.isdigit()):
        return []
    at = int(index)
    return [f"{head}:{i}" for d in range(1, width + 1) for i in (at - d, at + d) if i >= 0]


def step_order(node: Node) -> tuple[str, int]:
    """Where a step stands: its episode, then its index as a number (step 2 before step 10)."""
    index = node.data.get("index")
    return str(node.data.get("episode_id", "")), index if isinstance(index, int) else 0


def steps_of(node: Node, provenance: Iterable[Node]) -> list[Node]:
    """The steps a node came from, in `step_order`: the node itself when it is one; for a fact
    or procedure, the steps among `provenance` (the nodes its PROVENANCE links reach); none for
    other nodes (a source's PROVENANCE ends are the steps that came from it)."""
    if node.type is NodeType.EPISODIC:
        return [node]
    if node.type not in (NodeType.SEMANTIC, NodeType.PROCEDURAL):
        return []
    return sorted((n for n in provenance if n.type is NodeType.EPISODIC), key=step_order)


# A tag's identity keeps this many characters of its label (it must fit an index entry).
MAX_LABEL_CHARS = 200


def normalise_label(label: str) -> str:
    """A tag's identity: trimmed, lower-case, whitespace collapsed, at most `MAX_LABEL_CHARS`."""
    return " ".join(label.split()).lower()[:MAX_LABEL_CHARS].rstrip()


def now_utc() -> datetime:
    return datetime.now(UTC)


_LOG_FULL_FREQUENCY = math.log1p(10)  # 10 accesses: frequency reaches 1
_NUMBER = (int, float)  # `int | float` is a new union object at each use

def reward(kind: NodeType, data: Mapping[str, object]) -> float:
    """What the pipeline learned of the node, in [0.5, 1]: an EPISODIC step's `reward`, a
    PROCEDURAL `return_score` / 10, a SEMANTIC `confidence` (0.5 when missing), softened to
    0.5 + r / 2; 1 for the other types."""
    raw: object
    if kind is NodeType.EPISODIC:
        raw = data.get("reward")
    elif kind is NodeType.PROCEDURAL:
        score = data.get("return_score")
        raw = score / 10 if isinstance(score, _NUMBER) else None
    elif kind is NodeType.SEMANTIC:
        raw = data.get("confidence")
    else:
        return 1.0
    if not isinstance(raw, _NUMBER) or math.isnan(raw):
        raw = 0.5
    return 0.5 + min(max(float(raw), 0.0), 1.0) / 2


def node_value(
    kind: NodeType,
    data: Mapping[str, object],
    *,
    created_at: datetime,
    last_access: datetime | None,
    access_count: int,
    now: datetime,
    config: Config,
) -> float:
    """A node's worth apart from any query, in (0, 1]: recency x frequency x reward. Recency
    counts whole hours from the last access (or creation) with `config.recency_half_life_days`;
    frequency never drops below `config.frequency_floor`. Naive datetimes are UTC.
    """
    # `reward` times recency and frequency inlined (a hot path).
    seen = created_at if created_at.tzinfo is not None else created_at.replace(tzinfo=UTC)
    if last_access is not None:
        last = last_access if last_access.tzinfo is not None else last_access.replace(tzinfo=UTC)
        if last > seen:
            seen = last
    age_days = (((now if now.tzinfo is not None else now.replace(tzinfo=UTC)) - seen)
                .total_seconds() // 3600 / 24)
    raw = math.log1p(access_count if access_count > 0 else 0) / _LOG_FULL_FREQUENCY
    floor = config.frequency_floor
    return (
        float(2.0 ** (-(age_days if age_days > 0.0 else 0.0) / config.recency_half_life_days))
        * max(floor, min(1.0, raw))
        * reward(kind, data))
