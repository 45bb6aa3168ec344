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
    """How far an ingest has got, as its `progress` callback and the `"ingest_progress"` event
    report it.

    `stage` is `"annotating"` (once before the first step, with `done=0`, then after each
    step: `done` steps of `total` annotated), `"extracting"` (every step annotated; facts and
    procedures are being extracted), `"committing"` (the changeset is being written), then
    `"done"` (durable; also the only report of an ingest that finds its source already
    stored).
    """

    source_id: str
    stage: str
    done: int
    total: int
