"""What a recall keeps and returns: its candidates, what it read about the best of them, a
step's neighbours in its episode, the results it picks (`ResultSelection`), and the values it
returns."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from mnemo.config import Config
from mnemo.graph.model import Node, NodeId, NodeType, Vector, step_window
from mnemo.graph.ports import Neighbor
from mnemo.graph.scope import canonical


@dataclass(frozen=True, slots=True)
class Recalled:
    """One recalled node: its score, the phase that found it, and at which hop. `evidence`:
    for a fact or procedure, the EPISODIC steps it was extracted from (not returned beside it)."""

    node: Node
    score: float
    phase: str
    hop: int
    # A fact a later one contradicted ranks below it and says so, with its successor's id.
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
    each configured stage that failed (the LLM's plan, re-ranking or synthesis, the access
    counts' write), with its error; empty when everything ran."""

    memories: list[Recalled]
    reasoned: str | None = None
    query: str = ""
    mode: str = "mixed"
    touched: list[Touched] = field(default_factory=list)
    trace: dict[str, float] = field(default_factory=dict)
    degraded: list[str] = field(default_factory=list)


N = NodeType


@dataclass(slots=True)
class Candidate:
    """How a recall reached a node: its score so far, by which phase, at which hop."""

    score: float
    phase: str
    hop: int


@dataclass(slots=True)
class ReadContext:
    """What recall read about its best candidates: nodes, access stats, each fact's or
    procedure's PROVENANCE steps, and their vectors."""

    nodes: dict[str, Node]
    stats: dict[str, tuple[int, datetime | None]]
    sources: dict[str, list[str]]
    vectors: dict[str, Vector] = field(default_factory=dict)

    def add_steps(self, links: Iterable[Neighbor]) -> None:
        for link in links:
            node = self.nodes.get(link.origin)
            if node is not None and node.type in (N.SEMANTIC, N.PROCEDURAL):
                self.sources.setdefault(link.origin, []).append(link.node_id)

    def steps_of(self, nodes: Sequence[Node]) -> dict[str, str]:
        """The one step each memory stands for: an EPISODIC node itself, a fact or procedure made
        from exactly one step that step."""
        steps: dict[str, str] = {n.id: n.id for n in nodes if n.type is N.EPISODIC}
        for node in nodes:
            sources = self.sources.get(node.id, [])
            if node.type in (N.SEMANTIC, N.PROCEDURAL) and len(sources) == 1:
                steps[node.id] = sources[0]
        return steps


def restatements_first(
    scored: list[tuple[float, Node, Candidate]], restated: dict[str, int]
) -> list[tuple[float, Node, Candidate]]:
    """`scored` best first, but the memories that restate the query (exact before near-exact)
    ahead of all others, at the best score."""
    best = max(score for score, _, _ in scored)
    scored.sort(key=lambda item: (restated.get(item[1].id, 2), *best_first(item)))
    out = []
    for score, node, candidate in scored:
        if node.id in restated:
            candidate.score = score = max(score, best)
        out.append((score, node, candidate))
    return out


_TIES = {N.SEMANTIC: 0, N.PROCEDURAL: 0, N.EPISODIC: 1}


def best_first(item: tuple[float, Node, Candidate]) -> tuple[float, int, float, str, str]:
    """The sort key of a scored memory, best first. An exact tie goes to knowledge before a
    step, then the newer, then by text, so any store ranks the same memories alike."""
    score, node, _ = item
    return (-score, _TIES.get(node.type, 2), -node.created_at.timestamp(), node.text, node.id)


def adjacent_steps(node: Node, width: int = 1) -> list[str]:
    """The ids of the EPISODIC nodes up to `width` steps before and after `node` in its
    episode, nearest first; none for another type or a node without its place."""
    if node.type is not NodeType.EPISODIC:
        return []
    episode, index = node.data.get("episode_id"), node.data.get("index")
    if not isinstance(episode, str) or not isinstance(index, int) or isinstance(index, bool):
        return []
    return step_window(f"episodic_{episode}:{index}", width)


class ResultSelection:
    """The results, best first, chosen from scored candidates: at most `k`, each type within
    its minimum score and top-k, one result per step and per wording. A step's place goes to
    the first fact not taken yet that may stand in for it (`stand_ins`), at the better score;
    further facts of a returned fact's step are `deferred` unless `strong`, and every fact of a
    step returned itself."""

    def __init__(
        self, config: Config, k: int, steps: Mapping[str, str], sources: Mapping[str, list[str]],
        stand_ins: Mapping[str, list[tuple[float, Node, Candidate]]], strong: set[str],
    ) -> None:
        self.k, self.steps, self.sources = k, steps, sources
        self.stand_ins, self.strong = stand_ins, strong
        # Each memory type's lowest score and most results (other types: 0 and no bound).
        self._min_score = {N.SEMANTIC: config.recall_min_score_semantic,
                           N.EPISODIC: config.recall_min_score_episodic,
                           N.PROCEDURAL: config.recall_min_score_procedural}
        self._top_k = {N.SEMANTIC: config.recall_top_k_semantic,
                       N.EPISODIC: config.recall_top_k_episodic,
                       N.PROCEDURAL: config.recall_top_k_procedural}
        self.ranked: list[Recalled] = []
        self.deferred: list[tuple[float, Node, Candidate]] = []
        self._per_type: dict[NodeType, int] = {}
        self._claimed: set[str] = set()  # steps a result stands for
        self._returned: set[str] = set()  # steps returned themselves
        self._taken: set[str] = set()
        self._said: set[str] = set()  # the wordings returned (of nodes other than steps)

    def take(self, scored: Iterable[tuple[float, Node, Candidate]], *, defer: bool = True
             ) -> None:
        for item in scored:
            if len(self.ranked) == self.k:
                return
            score, node, candidate = item
            place = self.steps.get(node.id, node.id)
            stand_in = None if place in self._claimed else next(
                (s for s in self.stand_ins.get(place, ()) if s[1].id not in self._taken), None)
            if stand_in is not None:
                if defer and node.type is not N.EPISODIC and stand_in[1].id != node.id:
                    self.deferred.append(item)  # a fact of the step beside the one standing in
                node, candidate = stand_in[1], stand_in[2]
                score = max(score, stand_in[0])
            if not self._fits(node, score):
                continue
            step = self.steps.get(node.id)
            if step is not None and node.type is N.EPISODIC and step in self._claimed:
                continue
            # A step's further facts come after every other step's (a strong one after a fact).
            if defer and step is not None and step in self._claimed and (
                    step in self._returned or node.id not in self.strong):
                self.deferred.append(item)
                continue
            if (said := _wording(node)) is not None:
                self._said.add(said)
            self._per_type[node.type] = self._per_type.get(node.type, 0) + 1
            self._taken.add(node.id)
            if stand_in is not None:
                self._claimed.add(place)
            if step is not None:
                self._claimed.add(step)
                if node.type is N.EPISODIC:
                    self._returned.add(step)
            self.ranked.append(Recalled(node, score, candidate.phase, candidate.hop,
                                        evidence=tuple(map(NodeId, self.sources.get(node.id, ())))))

    def _fits(self, node: Node, score: float) -> bool:
        """Whether `node` at `score` may still be a result: not taken, within its type's minimum
        score and top-k, and of a wording not returned yet."""
        return (node.id not in self._taken and score >= self._min_score.get(node.type, 0.0)
                and self._per_type.get(node.type, 0) < self._top_k.get(node.type, 1_000_000)
                and _wording(node) not in self._said)


def _wording(node: Node) -> str | None:
    """What makes nodes one answer, the better placed: their words in one scope (a step is its
    own; two users' facts, or two items of a LangGraph store, are two answers)."""
    if node.type is N.EPISODIC:
        return None
    return f"{canonical(node.metadata)}\x00{' '.join(node.text.casefold().split())}"


class Trace:
    """Seconds per stage of one recall (`RecallResult.trace`)."""

    def __init__(self) -> None:
        self.stages: dict[str, float] = {}
        self._start = time.perf_counter()

    def mark(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + now - self._start
        self._start = now
