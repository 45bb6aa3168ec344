"""What `Memory.ingest` takes and returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Step:
    """One step of an ingested trajectory; `metadata` is kept on its EPISODIC node."""

    observation: str
    action: str
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Trajectory:
    """A complete trajectory to store in one call."""

    goal: str
    steps: list[Step] = field(default_factory=list)
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class IngestReceipt:
    """What an ingest stored. `created` is False when the source was already there."""

    source_id: str
    node_ids: list[str]
    created: bool
