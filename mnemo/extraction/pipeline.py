"""Extraction: from an episode's trajectories to one changeset.

Every trajectory is extracted at once; within one, the semantic and procedural workers run
side by side, then the returns of its instructions are scored. The critical path is therefore
one trajectory's max(semantic, procedural) + return + embedding, whatever their number
(BENCHMARKS.md). The caller's LLM is already bounded by its provider's limiter and metered.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from mnemo.episode.annotation import embed, score_reward
from mnemo.episode.model import EpisodeRecord, StepRecord
from mnemo.errors import LLMError, first_error
from mnemo.extraction.model import Fact, Instruction
from mnemo.extraction.prompts import (
    parse_facts,
    parse_instructions,
    parse_returns,
    procedural_request,
    return_request,
    semantic_request,
)
from mnemo.graph.model import Changeset, Link, LinkType, NodeDraft, NodeType, normalise_label
from mnemo.ports import LLM, Embedder, ask


@dataclass(frozen=True, slots=True)
class Source:
    """Where the steps came from: one SOURCE node per episode (or ingested trajectory)."""

    node_id: str
    text: str
    data: dict[str, Any]
    source_id: str | None = None


@dataclass(slots=True)
class _Extracted:
    steps: list[StepRecord]
    facts: list[Fact]
    instructions: list[Instruction]
    returns: dict[int, int]


async def extract(
    episode: EpisodeRecord,
    steps: Sequence[StepRecord],
    *,
    repo: str,
    source: Source,
    llm: LLM,
    embedder: Embedder,
    time_limit: float,
    score_last_step: bool,
) -> Changeset:
    """Extracts `steps` (grouped by trajectory) into one changeset.

    When `score_last_step`, the last step's deferred reward is scored first (it has no next
    observation); it is written onto the step record.

    Raises:
        LLMError, EmbeddingError: a worker failed for good.
        TimeoutError: a trajectory took longer than `time_limit` seconds.
    """
    limited = llm  # the caller's, bounded by its provider's limiter
    groups = episode.trajectories(list(steps))
    results: list[_Extracted | None] = [None] * len(groups)
    last_scored = anyio.Event()

    async def score_last() -> None:
        last = steps[-1]
        try:
            last.reward = await score_reward(limited, episode.goal, last, None)
        finally:
            last_scored.set()

    async def one(i: int, group: list[StepRecord]) -> None:
        with anyio.fail_after(time_limit):
            needs_last = score_last_step and group[-1] is steps[-1]
            results[i] = await _extract_trajectory(
                limited, episode.goal, group, last_scored if needs_last else None
            )

    if not score_last_step or not steps:
        last_scored.set()
    with first_error():
        async with anyio.create_task_group() as tg:
            if score_last_step and steps:
                tg.start_soon(score_last)
            for i, group in enumerate(groups):
                tg.start_soon(one, i, group)
    done = [r for r in results if r is not None]
    return await _changeset(repo, episode, source, done, embedder)


async def _extract_trajectory(
    llm: LLM, goal: str, steps: list[StepRecord], last_reward: anyio.Event | None
) -> _Extracted:
    subgoal = steps[0].subgoal
    found: dict[str, Any] = {}

    async def semantic() -> None:
        request = semantic_request(
            goal=goal,
            subgoal=subgoal,
            steps=[
                {"index": i, "observation": s.observation, "action": s.action}
                for i, s in enumerate(steps)
            ],
        )
        found["facts"] = await ask(llm, request, parse_facts)

    async def procedural() -> None:
        if last_reward is not None:
            await last_reward.wait()
        request = procedural_request(goal=goal, subgoal=subgoal, steps=_step_dicts(steps))
        found["instructions"] = await ask(llm, request, parse_instructions)

    with first_error():
        async with anyio.create_task_group() as tg:
            tg.start_soon(semantic)
            tg.start_soon(procedural)
    instructions: list[Instruction] = found["instructions"]
    returns: dict[int, int] = {}
    if instructions:
        request = return_request(
            goal=goal,
            subgoal=subgoal,
            instructions=[
                {
                    "index": i,
                    "intent": ins.intent,
                    "condition": ins.condition,
                    "instruction": ins.instruction,
                    "expected_outcome": ins.expected_outcome,
                }
                for i, ins in enumerate(instructions)
            ],
            steps=_step_dicts(steps),
        )
        count = len(instructions)
        returns = await ask(llm, request, lambda r: parse_returns(r, count))
    return _Extracted(steps, found["facts"], instructions, returns)


def _step_dicts(steps: list[StepRecord]) -> list[dict[str, Any]]:
    return [
        {"index": i, "observation": s.observation, "action": s.action, "reward": s.reward}
        for i, s in enumerate(steps)
    ]


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def episodic_id(step: StepRecord) -> str:
    return f"episodic_{step.id}"


async def _changeset(
    repo: str,
    episode: EpisodeRecord,
    source: Source,
    extracted: list[_Extracted],
    embedder: Embedder,
) -> Changeset:
    """Turns worker output into nodes and links; embeds every node's text in one call."""
    if not extracted:
        return Changeset(id=_new_id("changeset"), repo=repo)
    pending: list[tuple[str, NodeType, str, dict[str, Any], str | None]] = []
    links: list[Link] = []

    def add(kind: NodeType, text: str, data: dict[str, Any], *, node_id: str | None = None,
            key: str | None = None) -> str:
        node_id = node_id or _new_id(kind.value)
        pending.append((node_id, kind, text, data, key))
        return node_id

    add(NodeType.SOURCE, source.text, source.data, node_id=source.node_id)
    step_ids: list[str] = []
    for part in extracted:
        first = part.steps[0]
        subgoal_id = add(
            NodeType.SUBGOAL,
            first.subgoal,
            {"trajectory_id": first.trajectory_id, "episode_id": episode.id},
            node_id=f"subgoal_{first.trajectory_id}",
        )
        episodic: list[str] = []
        for step in part.steps:
            step_ids.append(step.id)
            node_id = add(
                NodeType.EPISODIC,
                step.line,
                {
                    "observation": step.observation,
                    "action": step.action,
                    "state": step.state_summary,
                    "subgoal": step.subgoal,
                    "reward": step.reward,
                    "index": step.index,
                    "trajectory_id": step.trajectory_id,
                    "episode_id": episode.id,
                    "step_id": step.id,
                    "metadata": step.metadata,
                },
                node_id=episodic_id(step),
            )
            episodic.append(node_id)
            links.append(Link(subgoal_id, node_id, LinkType.HIERARCHICAL))
            links.append(Link(node_id, source.node_id, LinkType.PROVENANCE))

        def origin(step_indices: tuple[int, ...] | None, steps: list[str] = episodic) -> list[str]:
            if not step_indices:
                return steps
            chosen = [steps[i] for i in step_indices if 0 <= i < len(steps)]
            return chosen or steps

        facts: list[str] = []
        for fact in part.facts:
            fact_id = add(
                NodeType.SEMANTIC,
                fact.proposition,
                {
                    "concepts": list(fact.concepts),
                    "confidence": fact.confidence,
                    "trajectory_id": first.trajectory_id,
                },
            )
            facts.append(fact_id)
            for step_id in origin(fact.steps):
                links.append(Link(fact_id, step_id, LinkType.PROVENANCE))
            for concept in fact.concepts:
                label = " ".join(concept.split())
                tag_id = add(NodeType.TAG, label, {"label": label}, key=normalise_label(label))
                links.append(Link(tag_id, fact_id, LinkType.MEMBERSHIP))
        for i, a in enumerate(facts):
            for b in facts[i + 1 :]:
                links.append(Link(a, b, LinkType.SIBLING))
        for i, ins in enumerate(part.instructions):
            proc_id = add(
                NodeType.PROCEDURAL,
                ins.instruction,
                {
                    "intent": ins.intent,
                    "condition": ins.condition,
                    "instruction": ins.instruction,
                    "expected_outcome": ins.expected_outcome,
                    "return_score": part.returns.get(i),
                    "trajectory_id": first.trajectory_id,
                },
            )
            for step_id in origin(ins.steps):
                links.append(Link(proc_id, step_id, LinkType.PROVENANCE))
            intent_id = add(NodeType.INTENT, ins.intent, {"intent": ins.intent})
            links.append(Link(intent_id, proc_id, LinkType.HIERARCHICAL))

    # Subgoals already have vectors; everything else is embedded in one call.
    subgoal_vectors = {f"subgoal_{p.steps[0].trajectory_id}": p.steps[0].subgoal_vec
                       for p in extracted}
    to_embed = [text for node_id, _, text, _, _ in pending if node_id not in subgoal_vectors]
    vectors = iter(await embed(embedder, to_embed))
    nodes = [
        NodeDraft(
            id=node_id,
            type=kind,
            text=text,
            data=data,
            vector=subgoal_vectors[node_id] if node_id in subgoal_vectors else next(vectors),
            key=key,
            source_id=source.source_id,
        )
        for node_id, kind, text, data, key in pending
    ]
    return Changeset(id=_new_id("changeset"), repo=repo, nodes=nodes, links=links,
                     step_ids=step_ids)


def failure_reason(exc: BaseException) -> str:
    """The `PipelineError` reason for an extraction that raised `exc`."""
    if isinstance(exc, TimeoutError) and not isinstance(exc, LLMError):
        return "extraction_timeout"
    return "extraction_failed"
