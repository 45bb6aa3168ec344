"""Extraction: from an episode's trajectories to one changeset, in at most two LLM rounds.

Round 1 asks, all at once, every trajectory's semantic and procedural tasks; the last
trajectory's procedural task also scores the last step's deferred reward (it has no next
observation, so `close` scores it; a reply without the score has the "reward" task asked
after). Each instruction's return then comes from the trajectory's cumulative reward, without a
call. Round 2 asks the optional "return" task, and only for a trajectory with several
instructions, where a model's judgement can tell them apart (one instruction takes the
trajectory's score either way). The critical path is therefore two calls whatever the number
of trajectories, one when no trajectory has several instructions.

A trajectory's "return" task needs only its procedural reply: it is asked as soon as that is
in, while the semantic replies still come. Once every trajectory's first round is in, the
changeset is drawn up and its texts embedded while the returns are still out; their scores
are written into it at the end. So the close's own work, and a remote embedder's round trip,
overlap the model's second round instead of following it.

A failed task does not cancel its siblings: each validated result is kept in the episode's
`TaskMemo`, so the retry re-asks only what failed. The caller's LLM is already bounded by its
provider's limiter and metered.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TypeVar

import anyio
import anyio.lowlevel

from mnemo import cpu
from mnemo.calls.retry import fail_after
from mnemo.episode.annotation import embed
from mnemo.episode.model import EpisodeRecord, StepRecord
from mnemo.episode.prompts import NEUTRAL_REWARD, parse_reward, reward_request
from mnemo.errors import AdapterError, LLMError, first_error
from mnemo.extraction import dates
from mnemo.extraction.entities import vector_text
from mnemo.extraction.memo import TaskMemo
from mnemo.extraction.model import Fact, Instruction
from mnemo.extraction.prompts import (
    parse_facts,
    parse_procedural,
    parse_returns,
    procedural_request,
    return_request,
    semantic_request,
)
from mnemo.graph.model import Changeset, Link, LinkType, NodeDraft, NodeType, normalise_label
from mnemo.ports import LLM, Embedder, JSONObject

log = logging.getLogger("mnemo")

T = TypeVar("T")

# The score of an instruction whose steps have no known reward: the "return" prompt's
# "not enough evidence".
NEUTRAL_RETURN = 5


@dataclass(frozen=True, slots=True)
class Source:
    """Where the steps came from: one SOURCE node per episode (or ingested trajectory)."""

    node_id: str
    text: str
    data: JSONObject
    source_id: str | None = None


@dataclass(slots=True)
class _Extracted:
    """One trajectory's results, filled in as its replies come."""

    steps: list[StepRecord]
    facts: list[Fact] = field(default_factory=list)
    instructions: list[Instruction] = field(default_factory=list)
    returns: dict[int, int] = field(default_factory=dict)


class _FirstRound:
    """Counts the trajectories whose first round (facts, instructions, the deferred reward) is
    still out; `all_in` is set when none is."""

    def __init__(self, trajectories: int) -> None:
        self.left = trajectories
        self.all_in = anyio.Event()
        if trajectories == 0:
            self.all_in.set()

    def one_in(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.all_in.set()


class _Round:
    """What the tasks of one extraction share: the LLM, the memo, and the failures so far
    (each with the task and trajectory it befell)."""

    def __init__(self, llm: LLM, memo: TaskMemo, goal: str) -> None:
        self.llm, self.memo, self.goal = llm, memo, goal
        self.failures: list[tuple[str, AdapterError]] = []
        # The deferred reward scored at close, by step id; written onto the step record only
        # once the whole extraction succeeded, so that a retry builds the same requests.
        self.rewards: dict[str, float] = {}

    def reward(self, step: StepRecord) -> float | None:
        return self.rewards.get(step.id, step.reward)


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
    memo: TaskMemo | None = None,
    partial: bool = False,
    generation: int = 0,
) -> Changeset:
    """Extracts `steps` (grouped by trajectory) into one changeset, its vectors made by
    `embedder` for the repo's vectors of `generation` (`Changeset.generation`).

    When `score_last_step`, the last step's deferred reward is scored with its trajectory's
    procedural task; it is written onto the step record when the extraction succeeds.
    Results found in `memo` are not asked again, and every result validated here is kept
    there, also when another task fails. With `partial`, a task that failed for good leaves
    its part out instead of failing the extraction: the changeset holds every step and what
    the other tasks produced, and its `missing` names each task left out and why.

    Raises:
        LLMError, EmbeddingError: a task failed for good (the first failure, naming its task
            and trajectory; the other tasks ran to their end all the same), without `partial`.
        TimeoutError: a trajectory's calls took longer than `time_limit` seconds of work
            (waits for a slot not counted); the message names the tasks left unanswered.
    """
    memo = memo if memo is not None else TaskMemo(episode.id)
    groups = episode.trajectories(list(steps))
    parts = [_Extracted(group) for group in groups]
    work = _Round(llm, memo, episode.goal)
    last = steps[-1] if steps else None
    deferred = last if score_last_step and last is not None else None
    first_round = _FirstRound(len(groups))
    drafted: list[_Draft] = []
    draft_failed: list[Exception] = []

    async def one(i: int, group: list[StepRecord]) -> None:
        scores = deferred if deferred is not None and group[-1] is deferred else None
        trajectory = _Trajectory(i + 1, group)
        try:
            with fail_after(time_limit, stretches=True):
                await _extract_trajectory(work, trajectory, parts[i], first_round.one_in,
                                          scores_last=scores)
        except TimeoutError as exc:
            unanswered = ", ".join(sorted(trajectory.pending)) or "none"
            raise TimeoutError(
                f"{trajectory.name} took more than {time_limit:g} s of its calls' time "
                f"(unanswered: {unanswered})"
            ) from exc

    async def draft() -> None:
        await first_round.all_in.wait()
        # The last trajectory's "return" request, started as its first round came in, goes
        # out before this work takes the loop.
        await anyio.lowlevel.checkpoint()
        if work.failures and not partial:
            return  # the extraction fails: nothing to embed
        try:
            drafted.append(await _draft(repo, episode, source, parts, embedder, work.rewards,
                                        generation))
        except Exception as exc:
            # Raised once the returns are in, as when the changeset followed them: a failed
            # embedding does not cancel tasks whose results the memo keeps for the retry.
            draft_failed.append(exc)

    with first_error():
        async with anyio.create_task_group() as tg:
            for i, group in enumerate(groups):
                tg.start_soon(one, i, group)
            tg.start_soon(draft)
    if work.failures and not partial:
        where, failure = work.failures[0]
        named = _named(where, failure)
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


def _named(where: str, failure: AdapterError) -> AdapterError:
    """`failure` again, of its class, its message saying which task of which trajectory."""
    try:
        return type(failure)(f"{where}: {failure}")
    except TypeError:  # an error class that takes other arguments: as it is
        return failure


@dataclass(slots=True)
class _Trajectory:
    """One trajectory being extracted, and the tasks of it not answered yet."""

    number: int
    steps: list[StepRecord]
    pending: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return f"trajectory {self.number} ({self.steps[0].subgoal!r})"


async def _extract_trajectory(
    work: _Round,
    trajectory: _Trajectory,
    part: _Extracted,
    first_round_in: Callable[[], None],
    *,
    scores_last: StepRecord | None,
) -> None:
    """One trajectory's facts, instructions and returns, into `part`; a task that failed for
    good leaves its part empty, and its failure (named) is in `work.failures`. With
    `scores_last` (its last step, whose reward close scores), the procedural task scores it
    too; a reply without that score has it asked of the "reward" task after. The "return" task
    is asked once the procedural reply is in, whatever the semantic one does;
    `first_round_in` is called once both (and the reward) are in."""
    steps = trajectory.steps
    key = steps[0].trajectory_id
    subgoal = steps[0].subgoal
    chars = _chars(steps)
    first_round_left = 2

    def one_in() -> None:
        nonlocal first_round_left
        first_round_left -= 1
        if first_round_left == 0:
            first_round_in()

    async def asked(task: str, call: Awaitable[T]) -> T | None:
        trajectory.pending.add(task)
        try:
            return await call
        except AdapterError as exc:
            work.failures.append((f"{task} of {trajectory.name}", exc))
            return None
        finally:
            trajectory.pending.discard(task)

    async def semantic() -> None:
        # The procedural requests go out first: round 2 waits for their replies, the semantic
        # ones only for the changeset (drawn up while the returns are out). A transport that
        # writes a request in a task of its own (aiohttp on Python 3.11) would otherwise write
        # this trajectory's procedural request after this task has built and sent its own.
        await anyio.lowlevel.checkpoint()
        request = await cpu.run(lambda: semantic_request(
            goal=work.goal,
            subgoal=subgoal,
            steps=[
                {"index": i, "observation": s.observation, "action": s.action}
                for i, s in enumerate(steps)
            ],
        ), chars)
        facts = await asked("semantic", work.memo.ask(work.llm, key, request, parse_facts))
        if facts is not None:
            part.facts.extend(facts)
        one_in()

    async def procedural() -> None:
        # Only the records' rewards go in, never one scored meanwhile: a retry must build the
        # same request.
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
        one_in()
        if len(instructions) > 1:
            part.returns.update(await _scored_returns(work, steps, instructions))

    with first_error():
        async with anyio.create_task_group() as tg:
            tg.start_soon(semantic)
            await procedural()


async def _score_alone(work: _Round, step: StepRecord) -> float:
    """The last step's reward through the "reward" task (a model whose procedural reply
    left it out)."""
    request = await cpu.run(lambda: reward_request(
        goal=work.goal, subgoal=step.subgoal, observation=step.observation,
        action=step.action, next_observation=None,
    ), _chars([step]))
    return await work.memo.ask(work.llm, step.trajectory_id, request, parse_reward,
                               unusable=NEUTRAL_REWARD)


async def _scored_returns(
    work: _Round, steps: list[StepRecord], instructions: list[Instruction]
) -> dict[int, int]:
    """The "return" task's scores; {} when it fails (the cumulative scores stand: the task is
    optional, and failing the episode for it would throw the rest away)."""
    request = await cpu.run(lambda: return_request(
        goal=work.goal,
        subgoal=steps[0].subgoal,
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
        steps=_step_dicts(steps, work),
    ), _chars(steps))
    count = len(instructions)
    try:
        return await work.memo.ask(
            work.llm, steps[0].trajectory_id, request, lambda r: parse_returns(r, count)
        )
    except LLMError as exc:
        log.warning("return scoring failed, keeping the cumulative-reward scores: %r", exc)
        return {}


def cumulative_returns(
    instructions: Sequence[Instruction], rewards: Sequence[float | None]
) -> dict[int, int]:
    """Each instruction's return score (1..10) from the trajectory's cumulative reward.

    An instruction's return is the reward to go from the first step it came from (its
    `steps`, else the trajectory's first step) to the trajectory's end, averaged over the
    steps with a known reward and mapped from 0..1 onto 1..10; `NEUTRAL_RETURN` when no
    step there has a reward.
    """
    scores: dict[int, int] = {}
    for i, ins in enumerate(instructions):
        valid = [k for k in ins.steps or () if 0 <= k < len(rewards)]
        start = min(valid) if valid else 0
        known = [r for r in rewards[start:] if r is not None]
        if not known:
            scores[i] = NEUTRAL_RETURN
            continue
        mean = sum(known) / len(known)
        scores[i] = min(10, max(1, int(1 + 9 * mean + 0.5)))
    return scores


def _chars(steps: Sequence[StepRecord]) -> int:
    """The characters of the steps' texts: what a request of them costs to build
    (`cpu.run`)."""
    return sum(len(s.observation) + len(s.action) for s in steps)


def _step_dicts(
    steps: list[StepRecord], work: _Round | None = None
) -> list[JSONObject]:
    """The steps as the procedural and return tasks see them: with `work`, the deferred
    reward scored at close too; without, only the rewards on the step records."""
    return [
        {"index": i, "observation": s.observation, "action": s.action,
         "reward": work.reward(s) if work is not None else s.reward}
        for i, s in enumerate(steps)
    ]


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def episodic_id(step: StepRecord) -> str:
    return f"episodic_{step.id}"


@dataclass(slots=True)
class _Draft:
    """A changeset drawn up before the "return" scores are in: its nodes (embedded) and
    links, and where each instruction's score goes (its node's data, by trajectory and
    instruction)."""

    repo: str
    nodes: list[NodeDraft] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    step_ids: list[str] = field(default_factory=list)
    scores: list[tuple[JSONObject, int, int]] = field(default_factory=list)
    # The generation of the repo's vectors the nodes' vectors are made for.
    generation: int = 0

    def changeset(self, extracted: list[_Extracted]) -> Changeset:
        """The changeset, each instruction's return score as its trajectory has it now."""
        for data, part, index in self.scores:
            data["return_score"] = extracted[part].returns.get(index)
        return Changeset(id=_new_id("changeset"), repo=self.repo, nodes=self.nodes,
                         links=self.links, step_ids=self.step_ids,
                         generation=self.generation)


# (node id, type, text, data, dedup key) of a node not embedded yet.
_Pending = tuple[str, NodeType, str, JSONObject, str | None]
# A draft of more steps, facts and instructions than this is drawn up in a worker thread
# (1,000 one-step trajectories took a quarter of a second of the loop).
_ON_LOOP_ITEMS = 200


async def _draft(
    repo: str,
    episode: EpisodeRecord,
    source: Source,
    extracted: list[_Extracted],
    embedder: Embedder,
    rewards: dict[str, float],
    generation: int,
) -> _Draft:
    """Turns worker output into nodes and links; embeds every node's text in one call.
    `rewards` are the deferred rewards scored at close (not yet on their step records); the
    return scores are the draft's `changeset`'s to write."""
    if not extracted:
        return _Draft(repo, generation=generation)

    def draw() -> tuple[_Draft, list[_Pending], dict[str, datetime]]:
        return _draw(repo, episode, source, extracted, rewards, generation)

    items = sum(len(p.steps) + len(p.facts) + len(p.instructions) for p in extracted)
    draft, pending, valid = draw() if items <= _ON_LOOP_ITEMS else await cpu.off_loop(draw)
    # Every node is embedded here, in one call, subgoals too: their steps' vectors may have
    # been made before the repo was re-embedded (a session open across it), and a changeset's
    # vectors are all of one embedder, the one `generation` names.
    vectors = await embed(embedder, [vector_text(kind, text) for _, kind, text, _, _ in pending])
    draft.nodes = [
        NodeDraft(
            id=node_id,
            type=kind,
            text=text,
            data=data,
            vector=vector,
            key=key,
            source_id=source.source_id,
            valid_from=valid.get(node_id),
        )
        for (node_id, kind, text, data, key), vector in zip(pending, vectors, strict=True)
    ]
    return draft


def _draw(
    repo: str,
    episode: EpisodeRecord,
    source: Source,
    extracted: list[_Extracted],
    rewards: dict[str, float],
    generation: int,
) -> tuple[_Draft, list[_Pending], dict[str, datetime]]:
    """The draft's links, step ids and scores; its nodes to embed; when each fact began to
    hold."""
    scores: list[tuple[JSONObject, int, int]] = []
    pending: list[_Pending] = []
    links: list[Link] = []
    # When each fact began to hold: a date it names, resolved against its steps'
    # date (their metadata's, else one their text names), else the session's (the goal's).
    valid: dict[str, datetime] = {}
    step_dates: dict[str, datetime | None] = {}
    session_date = dates.metadata_date(
        extracted[0].steps[0].metadata if extracted[0].steps else None
    ) or dates.named_date(episode.goal[:MAX_DATED_CHARS])

    def add(kind: NodeType, text: str, data: JSONObject, *, node_id: str | None = None,
            key: str | None = None) -> str:
        node_id = node_id or _new_id(kind.value)
        pending.append((node_id, kind, text, data, key))
        return node_id

    add(NodeType.SOURCE, source.text, source.data, node_id=source.node_id)
    step_ids: list[str] = []
    for number, part in enumerate(extracted):
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
                    "reward": rewards.get(step.id, step.reward),
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

        def held_from(text: str, step_indices: tuple[int, ...] | None,
                      part: _Extracted = part) -> datetime | None:
            chosen = [part.steps[i] for i in step_indices or () if 0 <= i < len(part.steps)]
            step = (chosen or part.steps)[0]
            if step.id not in step_dates:
                # A step's stamp opens it ("Dana (8 May, 2023): ..."); reading only the
                # start keeps a maximal observation from costing seconds per fact.
                step_dates[step.id] = (dates.metadata_date(step.metadata)
                                       or dates.named_date(step.observation[:STAMP_CHARS])
                                       or session_date)
            anchor = step_dates[step.id]
            return dates.named_date(text[:MAX_DATED_CHARS], anchor) or anchor

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
            held = held_from(fact.proposition, fact.steps)
            if held is not None:
                valid[fact_id] = held
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
            procedure: JSONObject = {
                "intent": ins.intent,
                "condition": ins.condition,
                "instruction": ins.instruction,
                "expected_outcome": ins.expected_outcome,
                "return_score": None,
                "trajectory_id": first.trajectory_id,
            }
            scores.append((procedure, number, i))
            proc_id = add(NodeType.PROCEDURAL, ins.instruction, procedure)
            held = held_from(ins.instruction, ins.steps)
            if held is not None:
                valid[proc_id] = held
            for step_id in origin(ins.steps):
                links.append(Link(proc_id, step_id, LinkType.PROVENANCE))
            intent_id = add(NodeType.INTENT, ins.intent, {"intent": ins.intent})
            links.append(Link(intent_id, proc_id, LinkType.HIERARCHICAL))

    return _Draft(repo, [], links, step_ids, scores, generation), pending, valid


# How much of a step's observation may carry its date stamp, and of a fact its date.
STAMP_CHARS = 200
MAX_DATED_CHARS = 2_000


def failure_reason(exc: BaseException) -> str:
    """The `PipelineError` reason for an extraction that raised `exc`."""
    if isinstance(exc, TimeoutError) and not isinstance(exc, LLMError):
        return "extraction_timeout"
    return "extraction_failed"
