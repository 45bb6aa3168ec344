"""Drawing up an extraction's changeset: the nodes (embedded in one call) and links of an
episode's steps, facts and procedures, and when each fact began to hold."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

from mnemo import cpu
from mnemo.episode import EpisodeRecord, StepRecord
from mnemo.extraction import dates
from mnemo.extraction.entities import vector_text
from mnemo.extraction.model import Fact, Instruction
from mnemo.graph.model import Changeset, Link, LinkType, NodeDraft, NodeType, normalise_label
from mnemo.ports import Embedder, JSONObject, embed


@dataclass(frozen=True, slots=True)
class Source:
    """Where the steps came from: one SOURCE node per episode (or ingested trajectory)."""

    node_id: str
    text: str
    data: JSONObject
    source_id: str | None = None


@dataclass(slots=True)
class Extracted:
    """One trajectory's results, filled in as its replies come."""

    steps: list[StepRecord]
    facts: list[Fact] = field(default_factory=list)
    instructions: list[Instruction] = field(default_factory=list)
    returns: dict[int, int] = field(default_factory=dict)


def procedure(ins: Instruction) -> JSONObject:
    return {"intent": ins.intent, "condition": ins.condition, "instruction": ins.instruction,
            "expected_outcome": ins.expected_outcome}


@dataclass(slots=True)
class Draft:
    """A changeset drawn up before the "return" scores are in, and where each score goes."""

    repo: str
    nodes: list[NodeDraft] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    step_ids: list[str] = field(default_factory=list)
    scores: list[tuple[JSONObject, int, int]] = field(default_factory=list)
    # The generation of the repo's vectors the nodes' vectors are made for.
    generation: int = 0

    def changeset(self, extracted: list[Extracted]) -> Changeset:
        """The changeset, each instruction's return score as its trajectory has it now."""
        for data, part, index in self.scores:
            data["return_score"] = extracted[part].returns.get(index)
        return Changeset(id=f"changeset_{uuid.uuid4().hex}", repo=self.repo, nodes=self.nodes,
                         links=self.links, step_ids=self.step_ids,
                         generation=self.generation)


# (node id, type, text, data, dedup key) of a node not embedded yet.
_Pending = tuple[str, NodeType, str, JSONObject, str | None]
# A draft of more steps, facts and instructions than this is drawn up in a worker thread.
_ON_LOOP_ITEMS = 200


async def draw_up(repo: str, episode: EpisodeRecord, source: Source, extracted: list[Extracted],
                  embedder: Embedder, rewards: dict[str, float], generation: int) -> Draft:
    """Turns worker output into nodes and links, with the deferred `rewards` scored at close;
    embeds every node's text in one call."""
    if not extracted:
        return Draft(repo, generation=generation)

    draw = partial(_draw, repo, episode, source, extracted, rewards, generation)
    items = sum(len(p.steps) + len(p.facts) + len(p.instructions) for p in extracted)
    draft, pending, valid = draw() if items <= _ON_LOOP_ITEMS else await cpu.off_loop(draw)
    vectors = await embed(embedder, [vector_text(kind, text) for _, kind, text, _, _ in pending])
    draft.nodes = [
        NodeDraft(id=node_id, type=kind, text=text, data=data, vector=vector, key=key,
                  source_id=source.source_id, valid_from=valid.get(node_id))
        for (node_id, kind, text, data, key), vector in zip(pending, vectors, strict=True)]
    return draft


def _draw(repo: str, episode: EpisodeRecord, source: Source, extracted: list[Extracted],
          rewards: dict[str, float],
          generation: int) -> tuple[Draft, list[_Pending], dict[str, datetime]]:
    """The draft's links, step ids and scores; its nodes to embed; when each fact held from."""
    scores: list[tuple[JSONObject, int, int]] = []
    pending: list[_Pending] = []
    links: list[Link] = []
    valid: dict[str, datetime] = {}
    step_dates: dict[str, datetime | None] = {}
    session_date = (dates.metadata_date(extracted[0].steps[0].metadata)
                    or dates.named_date(episode.goal[:MAX_DATED_CHARS]))

    def add(kind: NodeType, text: str, data: JSONObject, *, node_id: str | None = None,
            key: str | None = None) -> str:
        node_id = node_id or f"{kind.value}_{uuid.uuid4().hex}"
        pending.append((node_id, kind, text, data, key))
        return node_id

    add(NodeType.SOURCE, source.text, source.data, node_id=source.node_id)
    step_ids: list[str] = []
    for number, part in enumerate(extracted):
        first = part.steps[0]
        subgoal_id = add(NodeType.SUBGOAL, first.subgoal,
                         {"trajectory_id": first.trajectory_id, "episode_id": episode.id},
                         node_id=f"subgoal_{first.trajectory_id}")
        episodic: list[str] = []
        for step in part.steps:
            step_ids.append(step.id)
            node_id = add(NodeType.EPISODIC, step.line, {
                "observation": step.observation, "action": step.action,
                "state": step.state_summary, "subgoal": step.subgoal,
                "reward": rewards.get(step.id, step.reward), "index": step.index,
                "trajectory_id": step.trajectory_id, "episode_id": episode.id,
                "step_id": step.id, "metadata": step.metadata,
            }, node_id=f"episodic_{step.id}")
            episodic.append(node_id)
            links.append(Link(subgoal_id, node_id, LinkType.HIERARCHICAL))
            links.append(Link(node_id, source.node_id, LinkType.PROVENANCE))

        def memory(kind: NodeType, text: str, data: JSONObject,
                   step_indices: tuple[int, ...] | None, part: Extracted = part,
                   episodic: list[str] = episodic) -> str:
            """A fact's or a procedure's node, when it began to hold (a date it names, against
            its first step's), its provenance (its steps, else the trajectory's)."""
            node_id = add(kind, text, data)
            chosen = [i for i in step_indices or () if 0 <= i < len(part.steps)]
            chosen = chosen or list(range(len(part.steps)))
            step = part.steps[chosen[0]]
            if step.id not in step_dates:
                # A step's stamp opens it ("Dana (8 May, 2023): ..."): only the start is read.
                step_dates[step.id] = (dates.metadata_date(step.metadata)
                                       or dates.named_date(step.observation[:STAMP_CHARS])
                                       or session_date)
            anchor = step_dates[step.id]
            held = dates.named_date(text[:MAX_DATED_CHARS], anchor) or anchor
            if held is not None:
                valid[node_id] = held
            links.extend(Link(node_id, episodic[i], LinkType.PROVENANCE) for i in chosen)
            return node_id

        facts: list[str] = []
        for fact in part.facts:
            fact_id = memory(NodeType.SEMANTIC, fact.proposition, {
                "concepts": list(fact.concepts), "confidence": fact.confidence,
                "trajectory_id": first.trajectory_id,
            }, fact.steps)
            facts.append(fact_id)
            for concept in fact.concepts:
                label = " ".join(concept.split())
                tag_id = add(NodeType.TAG, label, {"label": label}, key=normalise_label(label))
                links.append(Link(tag_id, fact_id, LinkType.MEMBERSHIP))
        links.extend(Link(a, b, LinkType.SIBLING)
                     for i, a in enumerate(facts) for b in facts[i + 1 :])
        for i, ins in enumerate(part.instructions):
            data = {**procedure(ins), "return_score": None, "trajectory_id": first.trajectory_id}
            scores.append((data, number, i))
            proc_id = memory(NodeType.PROCEDURAL, ins.instruction, data, ins.steps)
            intent_id = add(NodeType.INTENT, ins.intent, {"intent": ins.intent})
            links.append(Link(intent_id, proc_id, LinkType.HIERARCHICAL))

    return Draft(repo, [], links, step_ids, scores, generation), pending, valid


# How much of a step's observation may carry its date stamp, and of a fact its date.
STAMP_CHARS = 200
MAX_DATED_CHARS = 2_000
