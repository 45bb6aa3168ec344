"""What `Memory.ingest` takes and returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from mnemo.graph.model import NodeId


@dataclass(frozen=True, slots=True)
class Step:
    """One step of an ingested trajectory; `metadata` is kept on its EPISODIC node."""

    observation: str
    action: str
    metadata: dict[str, object] | None = None


@dataclass(frozen=True, slots=True)
class Trajectory:
    """A complete trajectory to store in one call."""

    goal: str
    steps: list[Step] = field(default_factory=list)
    metadata: dict[str, object] | None = None


@dataclass(frozen=True, slots=True)
class IngestReceipt:
    """What an ingest stored. `created` is False when the source was already there;
    `missing` names the extraction tasks whose part it lacks, each with why
    (`Config.partial_commits`)."""

    source_id: str
    node_ids: list[NodeId]
    created: bool
    missing: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class IngestProgress:
    """How far an ingest has got (its `progress` callback, the `"ingest_progress"` event):
    `stage` is `"annotating"` (`done` of `total` steps, from 0), `"extracting"`,
    `"committing"`, then `"done"` (durable; the only report of a source already stored)."""

    source_id: str
    stage: str
    done: int
    total: int
