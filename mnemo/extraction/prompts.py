"""The extraction tasks: facts, procedures, their returns and intent merges, with parsers into
what the workers produce from one trajectory (`Fact`, `Instruction`), before it becomes graph
nodes. Each `*_request` builds one `LLMRequest` through `task_request`; the parsers raise
ValueError naming the first offending field."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

from mnemo.calls.schema import (
    MOST_ITEMS,
    UNSET,
    Meta,
    Reply,
    UnsetType,
    bounded,
    items,
    reply_schema,
    text,
)
from mnemo.calls.tasks import preview, read_reply, reply_data, task_request, unit_score
from mnemo.ports import LLMRequest, LLMResponse

StepIndices = Annotated[list[int], Meta(description="The indices of the steps this came from.")]
Steps = Sequence[Mapping[str, object]]


@dataclass(frozen=True, slots=True)
class Fact:
    """A semantic memory: one self-contained proposition; `steps` are the trajectory-local
    indices of the steps it came from (None: all of them)."""

    proposition: str
    concepts: tuple[str, ...]
    confidence: float
    steps: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Instruction:
    """A procedural memory: WHEN `condition`, DO `instruction`, EXPECT `expected_outcome`."""

    intent: str
    condition: str
    instruction: str
    expected_outcome: str
    steps: tuple[int, ...] | None = None


# The bounds of a reply (`mnemo.calls.schema.text`, `items`), so it fits the task's max_tokens.
class FactReply(Reply, frozen=True):
    proposition: Annotated[str, text(200)]
    concepts: Annotated[list[Annotated[str, text(24)]], items(5)] | None = None
    # Clamped into [0, 1] when read: the bounds are the model's guide, not a reason to refuse.
    confidence: Annotated[float, Meta(extra_json_schema={"minimum": 0, "maximum": 1})] | None = None
    steps: Annotated[StepIndices, items(6)] | UnsetType | None = UNSET


class SemanticReply(Reply, frozen=True):
    facts: Annotated[list[FactReply], items(6)]


SEMANTIC_SYSTEM = (
    "You extract durable facts from an agent's work so they can be remembered and recalled "
    "later, out of context.")
SEMANTIC_INSTRUCTIONS = """\
Extract the facts worth remembering from these steps of the agent's work on one subgoal.
Each step has an index, the observation the agent saw and the action it took.
Rules for each fact:
- One proposition per fact: a single declarative sentence stating one piece of information.
- Self-contained: resolve every reference. Name people, things and places instead of writing
  "he", "she", "it", "this", "that" or "they"; spell out relative dates when the steps allow.
- Durable: keep information that stays useful later (preferences, properties, settings,
  causes, results, decisions). Skip greetings, thanks, filler, questions and small talk.
- concepts: 1 to 5 short lower-case topic labels (e.g. "nginx", "database backups").
- confidence: from 0 to 1, how certain the steps make the fact.
- steps: the indices of the steps the fact comes from.
Do not repeat a fact. If nothing is worth remembering, return an empty list.
Reply with JSON: {"facts": [{"proposition", "concepts", "confidence", "steps"}, ...]}."""


def semantic_request(*, goal: str, subgoal: str, steps: Steps) -> LLMRequest:
    """The "semantic" task over one trajectory's steps ({"index", "observation", "action"})."""
    schema, max_tokens = bounded(reply_schema(SemanticReply), "facts", 3 + 2 * len(steps))
    return task_request("semantic", system=SEMANTIC_SYSTEM, instructions=SEMANTIC_INSTRUCTIONS,
                        inputs={"goal": goal, "subgoal": subgoal, "steps": steps}, schema=schema,
                        max_tokens=max_tokens)


def parse_facts(resp: LLMResponse) -> list[Fact]:
    """The facts of a "semantic" reply, in order, each proposition once, confidence in [0, 1]."""
    reply = read_reply(resp, SemanticReply, "semantic")
    facts: dict[str, Fact] = {}
    for i, item in enumerate(reply.facts):
        proposition = _required_text(item.proposition, f"facts[{i}].proposition")
        # Punctuation or a copied placeholder ("...") says nothing; a repeat, nothing new.
        if is_words(proposition) and proposition.casefold() not in facts:
            facts[proposition.casefold()] = Fact(
                proposition=proposition, concepts=_concepts(item.concepts),
                confidence=_confidence(item.confidence), steps=_steps(item.steps))
    return list(facts.values())


class InstructionReply(Reply, frozen=True, kw_only=True):
    intent: Annotated[str, text(80)]
    condition: Annotated[str, text(160)] | None = None
    instruction: Annotated[str, text(240)]
    expected_outcome: Annotated[str, text(160)] | None = None
    steps: Annotated[StepIndices, items(6)] | UnsetType | None = UNSET


class ProceduralReply(Reply, frozen=True):
    instructions: Annotated[list[InstructionReply], items(4)]


PROCEDURAL_SYSTEM = (
    "You turn an agent's actions into reusable procedures: when a situation arises, what to "
    "do, and what to expect.")
PROCEDURAL_INSTRUCTIONS = """\
Extract reusable procedures from these steps of the agent's work on one subgoal.
Each step has an index, the observation the agent saw, the action it took, and a reward from
0 to 1 for how much the step helped (null when unknown). Learn from what worked; when a step
failed, a procedure may say what to do instead.
For each procedure give:
- intent: a short verb phrase naming what the procedure achieves ("restart a failed service").
- condition: WHEN to apply it, the situation that calls for it.
- instruction: what to DO, concrete and self-contained (commands, values, names).
- expected_outcome: what to EXPECT when it works.
- steps: the indices of the steps it comes from.
One procedure per distinct action; do not repeat one. Skip steps that only talk (greetings,
thanks, acknowledgements). If there is no procedure, return an empty list.
Reply with JSON: {"instructions": [{"intent", "condition", "instruction",
"expected_outcome", "steps"}, ...]}."""


# The procedural task of an episode's last trajectory also scores its last step.
class ScoringReply(ProceduralReply, frozen=True):
    # A number from 0 to 1, required in the schema but optional when read: without it the
    # "reward" task scores the step.
    last_reward: float | Annotated[str, text(16)] | None = None


LAST_REWARD_INSTRUCTIONS = """\
Also score the last step (its reward is null): last_reward, from 0 to 1, how much its action
moved toward the subgoal, judged from the steps (1: achieved it, 0.5: neutral or unclear, 0:
failed or made things worse).
Reply with JSON: {"instructions": [...], "last_reward": <number 0-1>}."""


def procedural_request(*, goal: str, subgoal: str, steps: Steps,
                       score_last: bool = False) -> LLMRequest:
    """The "procedural" task over one trajectory's steps (`score_last`: the last one scored too)."""
    instructions = PROCEDURAL_INSTRUCTIONS
    inputs: dict[str, str | bool | Steps] = {"goal": goal, "subgoal": subgoal, "steps": steps}
    if score_last:
        instructions = f"{instructions}\n{LAST_REWARD_INSTRUCTIONS}"
        inputs["score_last_step"] = True
    schema, max_tokens = bounded(reply_schema(ScoringReply if score_last else ProceduralReply),
                                 "instructions", 2 + len(steps))
    return task_request("procedural", system=PROCEDURAL_SYSTEM, instructions=instructions,
                        inputs=inputs, schema=schema, max_tokens=max_tokens)


def parse_procedural(resp: LLMResponse) -> tuple[list[Instruction], float | None]:
    """The instructions of a "procedural" reply (`parse_instructions`) and its score of the
    last step (clamped to [0, 1]; None when the reply has none that reads as a number)."""
    data = reply_data(resp)
    return parse_instructions(resp), (
        unit_score(data.get("last_reward")) if isinstance(data, dict) else None)


def parse_instructions(resp: LLMResponse) -> list[Instruction]:
    """The instructions of a "procedural" reply, in order, each once and stripped."""
    reply = read_reply(resp, ProceduralReply, "procedural")
    out: dict[str, Instruction] = {}
    for i, item in enumerate(reply.instructions):
        intent = _required_text(item.intent, f"instructions[{i}].intent")
        instruction = _required_text(item.instruction, f"instructions[{i}].instruction")
        # Punctuation or a copied placeholder is no procedure; a repeat, nothing new.
        if is_words(intent) and is_words(instruction) and instruction.casefold() not in out:
            out[instruction.casefold()] = Instruction(
                intent=intent, condition=(item.condition or "").strip(), instruction=instruction,
                expected_outcome=(item.expected_outcome or "").strip(), steps=_steps(item.steps))
    return list(out.values())


class ScoreReply(Reply, frozen=True):
    index: int
    # Read as a number, then rounded and clamped into 1..10.
    return_score: Annotated[
        float, Meta(extra_json_schema={"type": "integer", "minimum": 1, "maximum": 10})]


class ReturnReply(Reply, frozen=True):
    scores: Annotated[list[ScoreReply], items(MOST_ITEMS)]


RETURN_SYSTEM = "You judge how much each procedure an agent followed contributed to its subgoal."
RETURN_INSTRUCTIONS = """\
Score each procedure in instructions (by its index) from 1 to 10 for how much following it
contributed to achieving the subgoal, judged by the steps it came from and what happened
after them (each step carries a reward from 0 to 1, or null when unknown).
- 10: it achieved the subgoal directly.
- 7-9: it clearly moved toward the subgoal.
- 5: partial or neutral effect, or not enough evidence.
- 2-4: it did little or caused a setback.
- 1: it was harmful or failed.
Score every procedure exactly once.
Reply with JSON: {"scores": [{"index": <int>, "return_score": <int 1-10>}, ...]}."""


def return_request(*, goal: str, subgoal: str, instructions: Steps, steps: Steps) -> LLMRequest:
    """The "return" task: scores each extracted instruction 1..10 (read with `parse_returns`)."""
    schema, max_tokens = bounded(reply_schema(ReturnReply), "scores", len(instructions), most=None)
    return task_request(
        "return", system=RETURN_SYSTEM, instructions=RETURN_INSTRUCTIONS,
        inputs={"goal": goal, "subgoal": subgoal, "instructions": instructions, "steps": steps},
        schema=schema, max_tokens=max_tokens)


def parse_returns(resp: LLMResponse, count: int) -> dict[int, int]:
    """Instruction index -> return score (clamped to 1..10) of a "return" reply."""
    reply = read_reply(resp, ReturnReply, "return")
    scores: dict[int, int] = {}
    for i, item in enumerate(reply.scores):
        if math.isnan(item.return_score):
            raise ValueError(f"scores[{i}].return_score must be a number, got nan")
        if 0 <= item.index < count and item.index not in scores:
            scores[item.index] = round(min(10.0, max(1.0, item.return_score)))
    return scores


class MergedReply(Reply, frozen=True):
    intent: Annotated[str, text(80)]


MERGE_INTENT_SYSTEM = "You maintain a catalogue of intents: short names for what procedures do."
MERGE_INTENT_INSTRUCTIONS = """\
Two intents, existing and new, name nearly the same purpose. Write one intent that covers
both: a short verb phrase (at most 8 words). Prefer the existing wording when it already
covers the new one.
Reply with JSON: {"intent": <the merged intent>}."""


def merge_intent_request(*, existing: str, new: str) -> LLMRequest:
    """The "merge_intent" task: the reply's `data` is {"intent": str} covering both intents."""
    return task_request(
        "merge_intent", system=MERGE_INTENT_SYSTEM, instructions=MERGE_INTENT_INSTRUCTIONS,
        inputs={"existing": existing, "new": new}, schema=reply_schema(MergedReply),
        max_tokens=256)


def parse_merged_intent(resp: LLMResponse) -> str:
    """The merged intent of a "merge_intent" reply, stripped (ValueError when there is none)."""
    reply = read_reply(resp, MergedReply, "merge_intent")
    return _required_text(reply.intent, "merge_intent reply.intent")


class PairReply(Reply, frozen=True):
    index: int
    intent: Annotated[str, text(80)]


class MergedPairsReply(Reply, frozen=True):
    intents: Annotated[list[PairReply], items(MOST_ITEMS)]


MERGE_INTENTS_INSTRUCTIONS = """\
Each pair holds two intents, existing and new, that name nearly the same purpose. For each
pair write one intent that covers both: a short verb phrase (at most 8 words). Prefer the
existing wording when it already covers the new one.
Reply with JSON: {"intents": [{"index": <the pair's index>, "intent": <the merged intent>},
...]}, one item per pair."""


def merge_intents_request(pairs: list[tuple[str, str]]) -> LLMRequest:
    """The "merge_intents" task: "merge_intent" for several (existing, new) pairs at once."""
    schema, max_tokens = bounded(reply_schema(MergedPairsReply), "intents", len(pairs), most=None)
    return task_request(
        "merge_intents",
        system=MERGE_INTENT_SYSTEM,
        instructions=MERGE_INTENTS_INSTRUCTIONS,
        inputs={"pairs": [{"index": i, "existing": existing, "new": new}
                          for i, (existing, new) in enumerate(pairs)]},
        schema=schema,
        max_tokens=max_tokens)


def parse_merged_intents(resp: LLMResponse, count: int) -> dict[int, str]:
    """Pair index -> merged intent of a "merge_intents" reply (unanswered pairs absent)."""
    reply = read_reply(resp, MergedPairsReply, "merge_intents")
    merged: dict[int, str] = {}
    for item in reply.intents:
        text = item.intent.strip()
        if 0 <= item.index < count and text and item.index not in merged:
            merged[item.index] = text
    return merged


def _required_text(value: str, where: str) -> str:
    if not value.strip():
        raise ValueError(f"{where} must be a non-empty string, got {preview(value)}")
    return value.strip()


def _concepts(value: list[str] | None) -> tuple[str, ...]:
    # Tags are deduplicated by lower-cased label downstream; the first spelling wins here.
    labels: dict[str, str] = {}
    for label in (concept.strip() for concept in value or ()):
        if is_words(label) and len(label) <= 64 and _NOT_IN_LABELS.search(label) is None:
            labels.setdefault(label.lower(), label)
    return tuple(labels.values())


# A tag is a few words: no JSON or markup characters (a small model's `');{` became a tag).
_NOT_IN_LABELS = re.compile(r"[{}\[\]<>\"`;\\]")


def is_words(text: str) -> bool:
    """Whether `text` says something: it holds a letter or a digit (not only punctuation)."""
    return any(c.isalnum() for c in text)


def _confidence(value: float | None) -> float:
    score = unit_score(value)
    return 0.5 if score is None else score


def _steps(value: list[int] | UnsetType | None) -> tuple[int, ...] | None:
    return tuple(dict.fromkeys(value)) if isinstance(value, list) else None
