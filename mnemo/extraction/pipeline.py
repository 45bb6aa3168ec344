"""Extraction: from an episode's trajectories to one changeset, in at most two LLM rounds (the
semantic and procedural tasks, then "return" while the changeset is drawn up); a failed task
does not cancel its siblings, and every validated result is kept in the episode's `TaskMemo`."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TypeVar

import anyio
import anyio.lowlevel

from mnemo import cpu
from mnemo.calls.retry import allowed, fail_after
from mnemo.episode import NEUTRAL_REWARD, EpisodeRecord, StepRecord, parse_reward, reward_request
from mnemo.errors import AdapterError, LLMError, first_error
from mnemo.extraction.draft import (
    Draft,
    Extracted,
    Source as Source,  # the callers' import
    draw_up,
    procedure,
)
from mnemo.extraction.memo import TaskMemo
from mnemo.extraction.model import Instruction
from mnemo.extraction.prompts import (
    parse_facts,
    parse_procedural,
    parse_returns,
    procedural_request,
    return_request,
    semantic_request,
)
from mnemo.graph.model import Changeset
from mnemo.ports import LLM, Embedder, JSONObject

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
        pending.add(task)
        try:
            return await call
        except AdapterError as exc:
            work.failures.append((f"{task} of {name}", exc))
            return None
        finally:
            pending.discard(task)

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
    if isinstance(exc, TimeoutError) and not isinstance(exc, LLMError):
        return "extraction_timeout"
    return "extraction_failed"
