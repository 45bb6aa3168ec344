"""Steps as mnemo stores them, and what `append` tells the caller."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from mnemo.graph.model import Vector
from mnemo.ports import JSONObject


@dataclass(frozen=True, slots=True)
class StepInfo:
    """What `append` returns once the step is stored: its trajectory and whether it starts
    one, once annotated; while the model has not answered, `annotated` is False and both are
    None (the step is annotated later, by close at the latest)."""

    index: int
    trajectory_id: str | None
    boundary_detected: bool | None
    annotated: bool = True


# The subgoal vector of a step not annotated yet.
NO_VECTOR = np.zeros(0, np.float32)
NO_VECTOR.flags.writeable = False


@dataclass(slots=True)
class StepRecord:
    """One step of an episode, stored before it is annotated: until then its trajectory,
    state summary and subgoal are empty and its vector is `NO_VECTOR` (`annotated`).
    `reward` is scored by the next step's annotation (or the close)."""

    id: str
    index: int
    trajectory_id: str
    observation: str
    action: str
    state_summary: str
    subgoal: str
    subgoal_vec: Vector
    reward: float | None = None
    metadata: JSONObject | None = None
    committed_in: str | None = None

    @property
    def annotated(self) -> bool:
        return bool(self.trajectory_id)

    @property
    def line(self) -> str:
        """The step as one line, "obs -> act"."""
        return f"{self.observation} -> {self.action}"


@dataclass(slots=True)
class EpisodeRecord:
    """The episode a session is collecting (or extracting): its goal and steps."""

    id: str
    goal: str
    steps: list[StepRecord] = field(default_factory=list)

    def trajectories(self, steps: list[StepRecord] | None = None) -> list[list[StepRecord]]:
        """`steps` (default: all) grouped by trajectory, in order of first step."""
        groups: dict[str, list[StepRecord]] = {}
        for step in self.steps if steps is None else steps:
            groups.setdefault(step.trajectory_id, []).append(step)
        return list(groups.values())


@dataclass(frozen=True, slots=True)
class EpisodeLog:
    """An episode as the step log keeps it, after the fact: its session, goal, `status`
    ("open", "committed" or "discarded"), when it started and closed, and every step (each
    step's `committed_in` names the changeset that committed it, None while uncommitted)."""

    id: str
    session_id: str
    goal: str
    status: str
    started_at: datetime
    closed_at: datetime | None
    steps: list[StepRecord]

    def trajectories(self) -> list[list[StepRecord]]:
        """The steps grouped by trajectory, in order of first step."""
        groups: dict[str, list[StepRecord]] = {}
        for step in self.steps:
            groups.setdefault(step.trajectory_id, []).append(step)
        return list(groups.values())
