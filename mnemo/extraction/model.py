"""What the extraction workers produce from one trajectory, before it becomes graph nodes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Fact:
    """A semantic memory: one self-contained proposition; `steps` are the trajectory-local
    indices of the steps it came from (None: all of them)."""

    proposition: str
    concepts: tuple[str, ...]
    confidence: float
    steps: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Instruction:
    """A procedural memory: WHEN `condition`, DO `instruction`, EXPECT `expected_outcome`."""

    intent: str
    condition: str
    instruction: str
    expected_outcome: str
    steps: tuple[int, ...] | None = None
