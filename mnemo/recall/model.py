"""What a recall returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from mnemo.graph.model import Node, NodeId


@dataclass(frozen=True, slots=True)
class Recalled:
    """One recalled node: its score, the phase that found it, and at which hop. `evidence`:
    for a fact or procedure, the ids of the EPISODIC steps it was extracted from (its
    PROVENANCE), which recall does not return beside it as separate results."""

    node: Node
    score: float
    phase: str
    hop: int
    # A fact a later one contradicted (at the recall's time) ranks below it and
    # says so: `retired`, and the id of the fact that succeeded it.
    retired: bool = False
    superseded_by: NodeId | None = None
    evidence: tuple[NodeId, ...] = ()

    @property
    def valid_from(self) -> datetime | None:
        """When the fact began to hold (None: not a fact, or unknown)."""
        return self.node.valid_from

    @property
    def valid_to(self) -> datetime | None:
        """When the fact stopped holding (None: it still holds, as far as mnemo knows)."""
        return self.node.valid_to if self.retired else None


@dataclass(frozen=True, slots=True)
class Touched:
    """A node the recall scored on its way, returned or not."""

    node_id: NodeId
    phase: str
    hop: int
    score: float


@dataclass(frozen=True, slots=True)
class RecallResult:
    """What `recall` found, best first. `reasoned` is an optional LLM synthesis; `touched`
    lists every node scored on the way; `trace` holds seconds per stage. `degraded` names
    each stage the recall did without because it failed (the LLM's plan, re-ranking or
    synthesis, the access counts' write), with its error: the memories are still the
    retrieval's, but not all that was configured ran. Empty when everything did."""

    memories: list[Recalled]
    reasoned: str | None = None
    query: str = ""
    mode: str = "mixed"
    touched: list[Touched] = field(default_factory=list)
    trace: dict[str, float] = field(default_factory=dict)
    degraded: list[str] = field(default_factory=list)
