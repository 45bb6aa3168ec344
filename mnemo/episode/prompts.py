"""The step annotation tasks: environment state, subgoal and reward, with their parsers.

Each `*_request` builds one `LLMRequest` through `task_request`, so its `inputs` are exactly
the keyword arguments; each schema sits beside the request that uses it. The parsers turn a
reply into a typed value: `parse_state` and `parse_subgoal` raise `ValueError` saying what was
wrong, while `parse_reward` never raises (an unreadable reward is the neutral 0.5).
"""

from __future__ import annotations

import math
from typing import Annotated

from mnemo.calls.tasks import (
    Meta,
    Reply,
    most_tokens,
    preview,
    read_reply,
    reply_data,
    reply_schema,
    task_request,
    text,
)
from mnemo.ports import LLMRequest, LLMResponse

NEUTRAL_REWARD = 0.5

# ---- state --------------------------------------------------------------------------------

class StateReply(Reply, frozen=True):
    state: Annotated[str, text(
        400, "The environment's state right after the step: one short paragraph of facts.")]


STATE_SCHEMA = reply_schema(StateReply)
STATE_SYSTEM = (
    "You keep track of the state of the environment an agent is working in. "
    "You write short, factual state summaries."
)
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
    """The "state" task: the reply's `data` is {"state": str}, one paragraph (a reply of the
    paragraph alone in `text` is read too). Its length is bound in the schema, which a local
    server's grammar enforces: a small model that repeats itself ends its reply there, short
    of `max_tokens`."""
    return task_request(
        "state",
        system=STATE_SYSTEM,
        instructions=STATE_INSTRUCTIONS,
        inputs={
            "goal": goal,
            "observation": observation,
            "action": action,
            "previous_state": previous_state,
        },
        schema=STATE_SCHEMA,
        max_tokens=most_tokens(STATE_SCHEMA),
    )


def parse_state(resp: LLMResponse) -> str:
    """The state summary of a "state" reply, stripped: `data["state"]` (or the JSON of that
    shape in `text`), a string in `data`, else, with no `data`, the paragraph in `text`.

    Raises:
        ValueError: when the reply holds no non-blank summary.
    """
    data = reply_data(resp)
    if isinstance(data, dict):
        data = data.get("state")
    if isinstance(data, str) and data.strip():
        return data.strip()
    if resp.data is None and resp.text.strip():
        return resp.text.strip()  # the paragraph alone (a JSON object in it is the step's)
    raise ValueError(
        "state reply holds no summary: expected a non-blank \"state\" in data (or the "
        f"paragraph in text), got text={resp.text!r} and data={preview(resp.data)}"
    )


# ---- subgoal ------------------------------------------------------------------------------

class SubgoalReply(Reply, frozen=True, kw_only=True):
    reasoning: Annotated[str, text(
        160, "One sentence: does this step continue the previous sub-task?")] = ""
    subgoal: Annotated[str, text(
        100, "The sub-task this step serves, as a short imperative phrase.")]


SUBGOAL_SCHEMA = reply_schema(SubgoalReply)
SUBGOAL_SYSTEM = (
    "You segment an agent's work into sub-tasks. For each step you name the sub-task "
    "(subgoal) that the step serves."
)
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
    return task_request(
        "subgoal",
        system=SUBGOAL_SYSTEM,
        instructions=SUBGOAL_INSTRUCTIONS,
        inputs={
            "goal": goal,
            "observation": observation,
            "action": action,
            "previous_subgoal": previous_subgoal,
            "recent_steps": recent_steps,
        },
        schema=SUBGOAL_SCHEMA,
        max_tokens=256,
    )


def parse_subgoal(resp: LLMResponse) -> str:
    """The subgoal of a "subgoal" reply (`data["subgoal"]`), stripped.

    Raises:
        ValueError: when the reply is not an object or its "subgoal" is missing or blank.
    """
    subgoal = read_reply(resp, SubgoalReply, "subgoal").subgoal
    if not subgoal.strip():
        raise ValueError("subgoal is blank")
    return subgoal.strip()


# ---- reward -------------------------------------------------------------------------------

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
    """The "reward" task: the reply's `data` is {"reward": number in [0, 1]}.

    `next_observation` is None when the step was the last of its episode.
    """
    return task_request(
        "reward",
        system=REWARD_SYSTEM,
        instructions=REWARD_INSTRUCTIONS,
        inputs={
            "goal": goal,
            "subgoal": subgoal,
            "observation": observation,
            "action": action,
            "next_observation": next_observation,
        },
        schema=REWARD_SCHEMA,
        max_tokens=128,
    )


def parse_reward(resp: LLMResponse) -> float:
    """The reward of a "reward" reply, clamped to [0, 1]; 0.5 when it cannot be read.

    Accepts {"reward": number}, a bare number, or a number (or JSON object) in `text`.
    Never raises.
    """
    data = reply_data(resp)
    if isinstance(data, dict):
        data = data.get("reward")
    if isinstance(data, str):
        try:
            data = float(data.strip())
        except ValueError:
            return NEUTRAL_REWARD
    if isinstance(data, bool) or not isinstance(data, int | float):
        return NEUTRAL_REWARD
    try:
        value = float(data)
    except OverflowError:
        return 1.0 if data > 0 else 0.0
    if math.isnan(value):
        return NEUTRAL_REWARD
    return min(1.0, max(0.0, value))
