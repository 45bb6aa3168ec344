"""Annotating a step: its state summary, subgoal and subgoal embedding, and the previous
step's deferred reward; and deciding whether it starts a new trajectory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio

from mnemo.calls.retry import fail_after
from mnemo.calls.tasks import ask
from mnemo.episode.model import StepRecord
from mnemo.episode.prompts import (
    NEUTRAL_REWARD,
    parse_reward,
    parse_state,
    parse_subgoal,
    reward_request,
    state_request,
    subgoal_request,
)
from mnemo.errors import LLMTimeout, MnemoError, first_error
from mnemo.graph.model import Vector
from mnemo.graph.vectors import cosine, embed, reaches
from mnemo.ports import LLM, Embedder


@dataclass(frozen=True, slots=True)
class Annotation:
    state_summary: str
    subgoal: str
    subgoal_vec: Vector
    previous_reward: float | None


async def annotate(
    llm: LLM,
    embedder: Embedder,
    *,
    goal: str,
    observation: str,
    action: str,
    previous: StepRecord | None,
    recent: Sequence[str],
) -> Annotation:
    """Asks the LLM for state, subgoal and the previous step's reward at once, then embeds the
    subgoal.

    Raises:
        LLMError: the LLM failed or kept answering unusably.
        EmbeddingError: the embedder failed or returned a vector of the wrong dimension.
    """
    results: dict[str, str | float] = {}

    async def state() -> None:
        request = state_request(
            goal=goal,
            observation=observation,
            action=action,
            previous_state=previous.state_summary if previous else None,
        )
        results["state"] = await ask(llm, request, parse_state)

    async def subgoal() -> None:
        request = subgoal_request(
            goal=goal,
            observation=observation,
            action=action,
            previous_subgoal=previous.subgoal if previous else None,
            recent_steps=list(recent),
        )
        results["subgoal"] = await ask(llm, request, parse_subgoal)

    # The three calls run at once; the state call runs in this task, which saves starting a
    # third one (a task's start is on the append path).
    with first_error():
        async with anyio.create_task_group() as tg:
            tg.start_soon(subgoal)
            if previous is not None:
                tg.start_soon(_reward_into, results, llm, goal, previous, observation)
            await state()
    subgoal_text = str(results["subgoal"])
    vector = (await embed(embedder, [subgoal_text]))[0]
    reward = results.get("reward")
    return Annotation(
        state_summary=str(results["state"]),
        subgoal=subgoal_text,
        subgoal_vec=vector,
        previous_reward=float(reward) if isinstance(reward, float) else None,
    )


async def annotate_step(
    llm: Callable[[], LLM],
    embedder: Embedder,
    *,
    goal: str,
    observation: str,
    action: str,
    steps: Sequence[StepRecord],
    threshold: float,
    time_limit: float,
    name: str,
) -> tuple[Annotation, bool]:
    """Annotates a step appended after `steps` (its episode's so far, the model asked through
    `llm()`) within `time_limit` seconds, and says whether it starts a new trajectory
    (`starts_trajectory` with `threshold`).

    Raises:
        LLMTimeout: the annotation outlasted `time_limit` (`name` says whose step it was).
        LLMError, EmbeddingError: as `annotate`.
    """
    previous = steps[-1] if steps else None
    try:
        with fail_after(time_limit, stretches=True):
            note = await annotate(
                llm(),
                embedder,
                goal=goal,
                observation=observation,
                action=action,
                previous=previous,
                recent=[step.line for step in steps[-3:]],
            )
    except TimeoutError as exc:
        if isinstance(exc, MnemoError):
            raise
        raise LLMTimeout(f"{name}: the annotation timed out after {time_limit}s") from exc
    return note, starts_trajectory(previous, note.subgoal_vec, threshold)


async def _reward_into(
    results: dict[str, str | float], llm: LLM, goal: str, step: StepRecord, next_observation: str
) -> None:
    results["reward"] = await score_reward(llm, goal, step, next_observation)


async def score_reward(
    llm: LLM, goal: str, step: StepRecord, next_observation: str | None
) -> float:
    """The step's reward in [0, 1] judged by what came next; 0.5 when the reply is unusable.

    Raises:
        LLMError: the LLM itself failed.
    """
    request = reward_request(
        goal=goal,
        subgoal=step.subgoal,
        observation=step.observation,
        action=step.action,
        next_observation=next_observation,
    )
    return await ask(llm, request, parse_reward, unusable=NEUTRAL_REWARD)


def starts_trajectory(previous: StepRecord | None, vector: Vector, threshold: float) -> bool:
    """A new trajectory starts when consecutive subgoals are less similar than `threshold`,
    or when their vectors are of two dimensions (the repo was re-embedded in between)."""
    if previous is None:
        return False
    if len(previous.subgoal_vec) != len(vector):
        return True
    return not reaches(cosine(previous.subgoal_vec, vector), threshold)
