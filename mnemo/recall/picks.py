"""Which scored candidates a recall returns: at most k, each type within its bounds, one
result per step, with the facts that stand in for their steps (`knowledge`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mnemo.config import Config
from mnemo.graph.model import Node, NodeId, NodeType
from mnemo.recall.candidates import Candidate
from mnemo.recall.model import Recalled

N = NodeType


class ResultSelection:
    """The results, best first, chosen from scored candidates: at most `k`, each type within
    its minimum score and its top-k, one result per step (`steps`: ReadContext.steps_of), one
    per wording of the other nodes. The place of a step, or of the first of a step and
    its facts, goes to the first fact not taken yet of those that may stand in for it
    (`stand_ins`, by step id), at the better of the two scores; a step returned stands for the
    facts made from it alone; a fact returned stands for its step, and further facts of that
    step are `deferred` (taken after every other step's result) unless `strong`
    (`knowledge.strong`)."""

    def __init__(
        self, config: Config, k: int, steps: Mapping[str, str], sources: Mapping[str, list[str]],
        stand_ins: Mapping[str, list[tuple[float, Node, Candidate]]], strong: set[str],
    ) -> None:
        self.config, self.k, self.steps, self.sources = config, k, steps, sources
        self.stand_ins, self.strong = stand_ins, strong
        self._min_score = _min_scores(config)
        self._top_k = _top_ks(config)
        self.ranked: list[Recalled] = []
        self.deferred: list[tuple[float, Node, Candidate]] = []
        self._per_type: dict[NodeType, int] = {}
        self._claimed: set[str] = set()  # steps a result stands for
        self._returned: set[str] = set()  # steps returned themselves
        self._taken: set[str] = set()
        self._said: set[str] = set()  # the texts returned (of nodes other than steps)

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
                node, candidate = stand_in[1], stand_in[2]
                score = max(score, stand_in[0])
            if node.id in self._taken or score < self._min_score.get(node.type, 0.0):
                continue
            step = self.steps.get(node.id)
            if step is not None and (step in self._returned or (
                    node.type is N.EPISODIC and step in self._claimed)):
                continue
            if defer and step is not None and step in self._claimed and (
                    node.id not in self.strong):
                self.deferred.append(item)
                continue
            if self._per_type.get(node.type, 0) >= self._top_k.get(node.type, 1_000_000):
                continue
            # Nodes of one wording are one answer, the better placed: a fact and an instruction
            # the offline model made of one action, the goal of two sessions, a subgoal and
            # its intent. Steps are events, each its own.
            said = " ".join(node.text.casefold().split()) if node.type is not N.EPISODIC else None
            if said is not None and said in self._said:
                continue
            if said is not None:
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


def _min_scores(config: Config) -> dict[NodeType, float]:
    """The lowest score of a result of each memory type (other types: 0)."""
    return {
        N.SEMANTIC: config.recall_min_score_semantic,
        N.EPISODIC: config.recall_min_score_episodic,
        N.PROCEDURAL: config.recall_min_score_procedural,
    }


def _top_ks(config: Config) -> dict[NodeType, int]:
    """How many results of each memory type (other types: no bound)."""
    return {
        N.SEMANTIC: config.recall_top_k_semantic,
        N.EPISODIC: config.recall_top_k_episodic,
        N.PROCEDURAL: config.recall_top_k_procedural,
    }

