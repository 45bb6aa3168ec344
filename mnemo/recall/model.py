"""What a recall returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from mnemo.graph.model import Node


@dataclass(frozen=True, slots=True)
class Recalled:
    """One recalled node: its score, the phase that found it, and at which hop."""

    node: Node
    score: float
    phase: str
    hop: int


@dataclass(frozen=True, slots=True)
class Touched:
    """A node the recall scored on its way, returned or not."""

    node_id: str
    phase: str
    hop: int
    score: float


@dataclass(frozen=True, slots=True)
class RecallResult:
    """What `recall` found, best first. `reasoned` is an optional LLM synthesis; `touched`
    lists every node scored on the way; `trace` holds seconds per stage."""

    memories: list[Recalled]
    reasoned: str | None = None
    query: str = ""
    mode: str = "mixed"
    touched: list[Touched] = field(default_factory=list)
    trace: dict[str, float] = field(default_factory=dict)
