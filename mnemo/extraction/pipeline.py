"""Extraction: from an episode's trajectories to one changeset, in at most two LLM rounds (the
semantic and procedural tasks, then "return" while the changeset is drawn up); a failed task
does not cancel its siblings, and every validated result is kept in the episode's `TaskMemo`.
Drawing up the changeset (`draw_up`): the nodes (embedded in one call) and links of an
episode's steps, facts and procedures, and when each fact began to hold."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import TypeVar

import anyio
import anyio.lowlevel

from mnemo import cpu
from mnemo.calls.retry import allowed, fail_after
from mnemo.episode import NEUTRAL_REWARD, EpisodeRecord, StepRecord, parse_reward, reward_request
from mnemo.errors import AdapterError, LLMError, first_error
from mnemo.extraction import dates
from mnemo.extraction.entities import vector_text
from mnemo.extraction.memo import TaskMemo
from mnemo.extraction.prompts import (
    Fact,
    Instruction,
    parse_facts,
    parse_procedural,
    parse_returns,
    procedural_request,
    return_request,
    semantic_request,
)
from mnemo.graph.model import Changeset, Link, LinkType, NodeDraft, NodeType, normalise_label
from mnemo.ports import LLM, Embedder, JSONObject, embed

log = logging.getLogger("mnemo")

T = TypeVar("T")

# The score of an instruction whose steps have no known reward.
NEUTRAL_RETURN = 5


class _Round:
    """What the tasks of one extraction share; each failure names its task and trajectory."""

    def __init__(self, llm: LLM, memo: TaskMemo, goal: str) -> None:
        self.llm, self.memo, self.goal = llm, memo, goal
        self.failures: list[tuple[str, AdapterError]] = []
        # The deferred reward scored at close, by step id; written once the extraction succeeded.
        self.rewards: dict[str, float] = {}

    def reward(self, step: StepRecord) -> float | None:
        return self.rewards.get(step.id, step.reward)


async def extract(episode: EpisodeRecord, steps: Sequence[StepRecord], *, repo: str, source: Source,
                  llm: LLM, embedder: Embedder, time_limit: float, score_last_step: bool,
                  memo: TaskMemo | None = None, partial: bool, generation: int) -> Changeset:
    """Extracts `steps` (grouped by trajectory) into one changeset embedded for `generation`,
    with the last step's deferred reward when `score_last_step`; with `partial`, a task that
    failed for good is left out (named in `missing`), else its LLMError or EmbeddingError is
    raised. TimeoutError past `time_limit` seconds of work."""
    memo = memo if memo is not None else TaskMemo(episode.id)
    groups = episode.trajectories(list(steps))
    parts = [Extracted(group) for group in groups]
    work = _Round(llm, memo, episode.goal)
    deferred = steps[-1] if score_last_step and steps else None
    # Set once each trajectory's two first tasks are in.
    first_round, first_left = anyio.Event(), 2 * len(groups)
    drafted: list[Draft] = []
    draft_failed: list[Exception] = []

    def first_in() -> None:
        nonlocal first_left
        first_left -= 1
        if first_left == 0:
            first_round.set()

    async def one(i: int, group: list[StepRecord]) -> None:
        scores = deferred if deferred is not None and group[-1] is deferred else None
        name = f"trajectory {i + 1} ({group[0].subgoal!r})"
        pending: set[str] = set()
        try:
            with fail_after(time_limit, stretches=True):
                await _extract_trajectory(work, parts[i], name, pending, first_in,
                                          scores_last=scores)
        except TimeoutError as exc:
            unanswered = ", ".join(sorted(pending)) or "none"
            raise TimeoutError(
                f"{name} took more than {allowed(exc, time_limit):g} s of its calls' time "
                f"(unanswered: {unanswered})") from exc

    async def draft() -> None:
        if groups:
            await first_round.wait()
        # The last trajectory's "return" request goes out before this work takes the loop.
        await anyio.lowlevel.checkpoint()
        if work.failures and not partial:
            return  # the extraction fails: nothing to embed
        try:
            drafted.append(await draw_up(repo, episode, source, parts, embedder, work.rewards,
                                        generation))
        except Exception as exc:
            # Raised once the returns are in, whose results the memo keeps for the retry.
            draft_failed.append(exc)

    with first_error():
        async with anyio.create_task_group() as tg:
            for i, group in enumerate(groups):
                tg.start_soon(one, i, group)
            tg.start_soon(draft)
    if work.failures and not partial:
        where, failure = work.failures[0]
        try:  # the failure again, of its class, its message naming its task and trajectory
            named = type(failure)(f"{where}: {failure}")
        except TypeError:  # an error class that takes other arguments: as it is
            named = failure
        if named is failure:
            raise failure
        raise named from failure
    if draft_failed:
        raise draft_failed[0]
    changeset = drafted[0].changeset(parts)
    if work.failures:
        changeset = replace(changeset, missing=[f"{where}: {exc}" for where, exc in
                                                work.failures])
        log.warning("%s: committing without %s", episode.id, "; ".join(changeset.missing))
    if deferred is not None:
        deferred.reward = work.rewards.get(deferred.id)
    return changeset


async def _extract_trajectory(work: _Round, part: Extracted, name: str, pending: set[str],
                              first_round_in: Callable[[], None], *,
                              scores_last: StepRecord | None) -> None:
    """The facts, instructions and returns of trajectory `name` into `part` (a failed task leaves
    its part empty, its failure in `work.failures`), its tasks in `pending` while they are
    asked; `first_round_in` is called as each of the two first replies is in."""
    steps = part.steps
    key, subgoal, chars = steps[0].trajectory_id, steps[0].subgoal, _chars(steps)

    async def asked(task: str, call: Awaitable[T]) -> T | None:
        pending.add(task)  # until answered: a timeout names it
        try:
            answer = await call
        except AdapterError as exc:
            work.failures.append((f"{task} of {name}", exc))
            answer = None
        pending.discard(task)
        return answer

    async def semantic() -> None:
        # The procedural requests go out first: round 2 waits for their replies.
        await anyio.lowlevel.checkpoint()
        request = await cpu.run(lambda: semantic_request(
            goal=work.goal, subgoal=subgoal,
            steps=[{"index": i, "observation": s.observation, "action": s.action}
                   for i, s in enumerate(steps)],
        ), chars)
        facts = await asked("semantic", work.memo.ask(work.llm, key, request, parse_facts))
        if facts is not None:
            part.facts.extend(facts)
        first_round_in()

    async def procedural() -> None:
        # Only the records' rewards go in, so a retry builds the same request.
        request = await cpu.run(lambda: procedural_request(
            goal=work.goal, subgoal=subgoal, steps=_step_dicts(steps),
            score_last=scores_last is not None,
        ), chars)
        reply = await asked("procedural",
                            work.memo.ask(work.llm, key, request, parse_procedural))
        if reply is not None:
            part.instructions.extend(reply[0])
            reward = reply[1]
            if scores_last is not None:
                if reward is None:
                    reward = await asked("reward", _score_alone(work, scores_last))
                if reward is not None:
                    work.rewards[scores_last.id] = reward
        instructions = part.instructions
        part.returns.update(cumulative_returns(instructions, [work.reward(s) for s in steps]))
        first_round_in()
        if len(instructions) > 1:
            part.returns.update(await _scored_returns(work, steps, instructions))

    with first_error():
        async with anyio.create_task_group() as tg:
            tg.start_soon(semantic)
            await procedural()


async def _score_alone(work: _Round, step: StepRecord) -> float:
    """The last step's reward through the "reward" task (when the procedural reply lacks it)."""
    request = await cpu.run(lambda: reward_request(
        goal=work.goal, subgoal=step.subgoal, observation=step.observation,
        action=step.action, next_observation=None,
    ), _chars([step]))
    return await work.memo.ask(work.llm, step.trajectory_id, request, parse_reward,
                               unusable=NEUTRAL_REWARD, any_reply=True)


async def _scored_returns(work: _Round, steps: list[StepRecord],
                          instructions: list[Instruction]) -> dict[int, int]:
    """The "return" task's scores; {} when it fails (the cumulative scores stand)."""
    request = await cpu.run(lambda: return_request(
        goal=work.goal, subgoal=steps[0].subgoal,
        instructions=[{"index": i, **procedure(ins)} for i, ins in enumerate(instructions)],
        steps=_step_dicts(steps, work),
    ), _chars(steps))
    try:
        return await work.memo.ask(work.llm, steps[0].trajectory_id, request,
                                   lambda r: parse_returns(r, len(instructions)))
    except LLMError as exc:
        log.warning("return scoring failed, keeping the cumulative-reward scores: %r", exc)
        return {}


def cumulative_returns(instructions: Sequence[Instruction],
                       rewards: Sequence[float | None]) -> dict[int, int]:
    """Each instruction's return score: the mean known reward from its first step to the
    trajectory's end, mapped onto 1..10 (`NEUTRAL_RETURN` when none is known)."""
    scores: dict[int, int] = {}
    for i, ins in enumerate(instructions):
        start = min((k for k in ins.steps or () if 0 <= k < len(rewards)), default=0)
        known = [r for r in rewards[start:] if r is not None]
        mean = sum(known) / len(known) if known else None
        scores[i] = NEUTRAL_RETURN if mean is None else min(10, max(1, int(1 + 9 * mean + 0.5)))
    return scores


def _chars(steps: Sequence[StepRecord]) -> int:
    """The characters of the steps' texts (`cpu.run`'s size)."""
    return sum(len(s.observation) + len(s.action) for s in steps)


def _step_dicts(steps: list[StepRecord], work: _Round | None = None) -> list[JSONObject]:
    """The steps as the procedural and return tasks see them (with `work`, the deferred
    reward scored at close too)."""
    return [
        {"index": i, "observation": s.observation, "action": s.action,
         "reward": work.reward(s) if work is not None else s.reward}
        for i, s in enumerate(steps)]


def failure_reason(exc: BaseException) -> str:
    """The `PipelineError` reason for an extraction that raised `exc`."""
    if isinstance(exc, TimeoutError) and not isinstance(exc, AdapterError):
        return "extraction_timeout"
    return "extraction_failed"


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
