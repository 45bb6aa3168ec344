"""Episodes and their steps as mnemo stores them, and a step's annotation (environment state,
subgoal and its embedding, the previous step's deferred reward, whether it starts a trajectory).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Annotated

import anyio
import numpy as np

from mnemo.calls.retry import allowed, fail_after
from mnemo.calls.schema import Meta, Reply, most_tokens, reply_schema, text
from mnemo.calls.tasks import ask, preview, read_reply, reply_data, task_request, unit_score
from mnemo.config import Config
from mnemo.errors import LLMTimeout, MnemoError, first_error
from mnemo.graph.model import Vector
from mnemo.ports import LLM, Embedder, JSONObject, LLMRequest, LLMResponse, cosine, embed, reaches


@dataclass(frozen=True, slots=True)
class StepInfo:
    """What `append` returns once the step is stored: its trajectory and whether it starts
    one; both None and `annotated` False while the model has not answered."""

    index: int
    trajectory_id: str | None
    boundary_detected: bool | None
    annotated: bool = True


# The subgoal vector of a step not annotated yet.
NO_VECTOR = np.zeros(0, np.float32)
NO_VECTOR.flags.writeable = False


@dataclass(slots=True)
class StepRecord:
    """One step of an episode, stored before it is annotated (until then its trajectory,
    state and subgoal are empty, its vector `NO_VECTOR`); `reward` is scored by the next
    step's annotation (or the close)."""

    id: str
    index: int
    trajectory_id: str
    observation: str
    action: str
    state_summary: str
    subgoal: str
    subgoal_vec: Vector
    reward: float | None = None
    metadata: JSONObject | None = None
    committed_in: str | None = None

    @property
    def annotated(self) -> bool:
        return bool(self.trajectory_id)

    @property
    def line(self) -> str:
        """The step as one line, "obs -> act"."""
        return f"{self.observation} -> {self.action}"


@dataclass(slots=True)
class EpisodeRecord:
    """The episode a session is collecting (or extracting): its goal and steps."""

    id: str
    goal: str
    steps: list[StepRecord] = field(default_factory=list)

    def trajectories(self, steps: list[StepRecord] | None = None) -> list[list[StepRecord]]:
        """`steps` (default: all) grouped by trajectory, in order of first step."""
        return by_trajectory(self.steps if steps is None else steps)


@dataclass(frozen=True, slots=True)
class EpisodeLog:
    """An episode as the step log keeps it: its session, goal, `status` ("open", "committed"
    or "discarded"), start and close times, and every step (`committed_in`: its changeset)."""

    id: str
    session_id: str
    goal: str
    status: str
    started_at: datetime
    closed_at: datetime | None
    steps: list[StepRecord]

    def trajectories(self) -> list[list[StepRecord]]:
        return by_trajectory(self.steps)


def by_trajectory(steps: list[StepRecord]) -> list[list[StepRecord]]:
    """`steps` grouped by trajectory, in order of first step."""
    groups: dict[str, list[StepRecord]] = {}
    for step in steps:
        groups.setdefault(step.trajectory_id, []).append(step)
    return list(groups.values())


NEUTRAL_REWARD = 0.5


class StateReply(Reply, frozen=True):
    state: Annotated[str, text(
        400, "The environment's state right after the step: one short paragraph of facts.")]


STATE_SCHEMA = reply_schema(StateReply)
STATE_TOKENS = most_tokens(STATE_SCHEMA)
STATE_SYSTEM = (
    "You keep track of the state of the environment an agent is working in. "
    "You write short, factual state summaries.")
STATE_INSTRUCTIONS = """\
Summarise the state of the environment right after the agent's latest step.
- goal: what the agent is trying to achieve overall.
- previous_state: your summary before this step (null for the first step); keep what still holds.
- observation: what the agent saw at this step; action: what the agent did in response.
Write one short paragraph (at most three sentences, under 60 words) stating the current
situation and the action just taken. Facts only: no advice, no speculation, no lists or headings.
Reply with JSON: {"state": "<the paragraph>"}."""


def state_request(
    *, goal: str, observation: str, action: str, previous_state: str | None
) -> LLMRequest:
    """The "state" task: the reply's `data` is {"state": str}, one paragraph (a paragraph
    alone in `text` is read too), its length bound in the schema."""
    inputs = {"goal": goal, "observation": observation, "action": action,
              "previous_state": previous_state}
    return task_request("state", system=STATE_SYSTEM, instructions=STATE_INSTRUCTIONS,
                        inputs=inputs, schema=STATE_SCHEMA, max_tokens=STATE_TOKENS)


def parse_state(resp: LLMResponse) -> str:
    """The state summary of a "state" reply, stripped: `data["state"]`, a string in `data`,
    or else the paragraph in `text`; ValueError when there is none."""
    data = reply_data(resp)
    if isinstance(data, dict):
        data = data.get("state")
    if isinstance(data, str) and data.strip():
        return data.strip()
    if resp.data is None and resp.text.strip():
        return resp.text.strip()  # the paragraph alone (a JSON object in it is the step's)
    raise ValueError(
        "state reply holds no summary: expected a non-blank \"state\" in data (or the "
        f"paragraph in text), got text={resp.text!r} and data={preview(resp.data)}")


class SubgoalReply(Reply, frozen=True, kw_only=True):
    reasoning: Annotated[str, text(
        160, "One sentence: does this step continue the previous sub-task?")] = ""
    subgoal: Annotated[str, text(
        100, "The sub-task this step serves, as a short imperative phrase.")]


SUBGOAL_SCHEMA = reply_schema(SubgoalReply)
SUBGOAL_SYSTEM = (
    "You segment an agent's work into sub-tasks. For each step you name the sub-task "
    "(subgoal) that the step serves.")
SUBGOAL_INSTRUCTIONS = """\
Name the subgoal of the agent's latest step: the concrete sub-task, toward the goal, that the
observation and action are about. Write it as a short imperative phrase of 3 to 8 words, for
example "configure the nginx reverse proxy".
- previous_subgoal is the subgoal of the step before (null for the first step). If this step
  continues the same sub-task, return previous_subgoal exactly as written, character for
  character: any change of wording starts a new segment.
- Choose a new subgoal only when the step clearly turns to a different sub-task.
- recent_steps are the steps just before this one, oldest first, as "observation -> action".
Reply with JSON: "reasoning" (one sentence on whether and why the step continues the previous
sub-task) and "subgoal"."""


def subgoal_request(
    *,
    goal: str,
    observation: str,
    action: str,
    previous_subgoal: str | None,
    recent_steps: list[str],
) -> LLMRequest:
    """The "subgoal" task: the reply's `data` is {"reasoning": str, "subgoal": str}."""
    inputs = {"goal": goal, "observation": observation, "action": action,
              "previous_subgoal": previous_subgoal, "recent_steps": recent_steps}
    return task_request("subgoal", system=SUBGOAL_SYSTEM, instructions=SUBGOAL_INSTRUCTIONS,
                        inputs=inputs, schema=SUBGOAL_SCHEMA, max_tokens=256)


def parse_subgoal(resp: LLMResponse) -> str:
    """A "subgoal" reply's `data["subgoal"]`, stripped; ValueError when it is missing or blank."""
    subgoal = read_reply(resp, SubgoalReply, "subgoal").subgoal
    if not subgoal.strip():
        raise ValueError("subgoal is blank")
    return subgoal.strip()


class RewardReply(Reply, frozen=True):
    # Clamped into [0, 1] when read (`parse_reward`, which reads a numeric string too).
    reward: Annotated[float, Meta(
        extra_json_schema={"minimum": 0, "maximum": 1},
        description="How much the step advanced the goal: 0 (not at all) to 1 (fully).")]


REWARD_SCHEMA = reply_schema(RewardReply)
REWARD_SYSTEM = "You judge how much one step of an agent's work advanced its goal."
REWARD_INSTRUCTIONS = """\
Score one step of the agent's work: the observation it saw and the action it took.
Judge the step by what happened next: next_observation is the environment's reaction to the
action, or null when this was the last step (then judge from the step itself).
- 1.0: the step achieved the subgoal or clearly moved the goal forward.
- 0.5: neutral, or the effect is unclear.
- 0.0: the step failed, caused an error, or moved away from the goal.
Use values in between for partial progress.
Reply with JSON: {"reward": <a number from 0 to 1>}."""


def reward_request(
    *,
    goal: str,
    subgoal: str,
    observation: str,
    action: str,
    next_observation: str | None,
) -> LLMRequest:
    """The "reward" task: the reply's `data` is {"reward": number in [0, 1]};
    `next_observation` is None for the episode's last step."""
    inputs = {"goal": goal, "subgoal": subgoal, "observation": observation, "action": action,
              "next_observation": next_observation}
    return task_request("reward", system=REWARD_SYSTEM, instructions=REWARD_INSTRUCTIONS,
                        inputs=inputs, schema=REWARD_SCHEMA, max_tokens=128)


def parse_reward(resp: LLMResponse) -> float:
    """The reward of a "reward" reply ({"reward": number}, a bare number, or one in `text`),
    clamped to [0, 1]; 0.5 when it cannot be read. Never raises."""
    data = reply_data(resp)
    score = unit_score(data.get("reward") if isinstance(data, dict) else data)
    return NEUTRAL_REWARD if score is None else score


async def annotate_step(
    llm: Callable[[], LLM],
    embedder: Embedder,
    config: Config,
    goal: str,
    step: StepRecord,
    steps: Sequence[StepRecord],
    *,
    new_trajectory: str,
    name: str,
) -> tuple[StepRecord, float | None]:
    """`step`, appended after `steps`, annotated within `append_timeout + extraction_timeout`
    seconds (what its append, then a close, waits for it; waits for a turn excluded; else
    LLMTimeout), and the previous step's reward: the LLM is asked for the state, the
    subgoal and that reward at once, then the subgoal is embedded. The step goes in the
    previous step's trajectory, or in `new_trajectory` when it starts one (`config`'s
    `trajectory_threshold`); LLMError or EmbeddingError when the model or the embedder fails."""
    previous = steps[-1] if steps else None
    model = llm()
    results: dict[str, str | float] = {}

    async def state() -> None:
        results["state"] = await ask(model, state_request(
            goal=goal,
            observation=step.observation,
            action=step.action,
            previous_state=previous.state_summary if previous else None,
        ), parse_state, any_reply=True)

    async def subgoal() -> None:
        results["subgoal"] = await ask(model, subgoal_request(
            goal=goal,
            observation=step.observation,
            action=step.action,
            previous_subgoal=previous.subgoal if previous else None,
            recent_steps=[s.line for s in steps[-3:]],
        ), parse_subgoal)

    async def score(before: StepRecord) -> None:
        # 0.5 when the reply is unusable; LLMError when the LLM itself failed.
        results["reward"] = await ask(model, reward_request(
            goal=goal,
            subgoal=before.subgoal,
            observation=before.observation,
            action=before.action,
            next_observation=step.observation,
        ), parse_reward, unusable=NEUTRAL_REWARD, any_reply=True)

    time_limit = config.append_timeout + config.extraction_timeout
    try:
        with fail_after(time_limit, stretches=True):
            # The three calls run at once, the state call in this task (one task start saved).
            with first_error():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(subgoal)
                    if previous is not None:
                        tg.start_soon(score, previous)
                    await state()
            vector = (await embed(embedder, [str(results["subgoal"])]))[0]
    except TimeoutError as exc:
        if isinstance(exc, MnemoError):
            raise
        raise LLMTimeout(f"{name}: the annotation timed out after {allowed(exc, time_limit):g} s"
                         ) from exc
    starts = starts_trajectory(previous, vector, config.trajectory_threshold)
    trajectory = previous.trajectory_id if previous is not None and not starts else new_trajectory
    done = replace(step, trajectory_id=trajectory, state_summary=str(results["state"]),
                   subgoal=str(results["subgoal"]), subgoal_vec=vector)
    reward = results.get("reward")
    return done, float(reward) if isinstance(reward, float) else None


def starts_trajectory(previous: StepRecord | None, vector: Vector, threshold: float) -> bool:
    """A new trajectory starts when consecutive subgoals are less similar than `threshold`,
    or of two dimensions (the repo was re-embedded in between)."""
    if previous is None:
        return False
    if len(previous.subgoal_vec) != len(vector):
        return True
    return not reaches(cosine(previous.subgoal_vec, vector), threshold)
