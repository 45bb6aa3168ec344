"""The extraction tasks: facts, procedures, their returns and intent merges, with parsers.

Each `*_request` builds one `LLMRequest` through `task_request`, so its `inputs` are exactly
the keyword arguments; each schema sits beside the request that uses it. The parsers are
strict: a reply that does not match its schema raises `ValueError` naming the first offending
field (for example "facts[2].proposition must be a non-empty string"); what matches it but says
nothing (a proposition of punctuation, a concept that is a JSON fragment) is left out. An
empty `facts` or `instructions` list is a valid answer.
"""

from __future__ import annotations

import math
import re
from typing import Any

from mnemo.calls.tasks import preview, reply_data, task_request
from mnemo.extraction.model import Fact, Instruction
from mnemo.ports import LLMRequest, LLMResponse

DEFAULT_CONFIDENCE = 0.5
MIN_RETURN, MAX_RETURN = 1, 10

_STEP_INDICES: dict[str, Any] = {
    "type": "array",
    "items": {"type": "integer"},
    "description": "The indices of the steps this came from.",
}

# ---- semantic -----------------------------------------------------------------------------

SEMANTIC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "facts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "proposition": {"type": "string"},
                    "concepts": {"type": "array", "items": {"type": "string"}},
                    "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                    "steps": _STEP_INDICES,
                },
                "required": ["proposition", "concepts", "confidence"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["facts"],
    "additionalProperties": False,
}
SEMANTIC_SYSTEM = (
    "You extract durable facts from an agent's work so they can be remembered and recalled "
    "later, out of context."
)
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


def semantic_request(*, goal: str, subgoal: str, steps: list[dict[str, Any]]) -> LLMRequest:
    """The "semantic" task over one trajectory's steps.

    `steps` are {"index": int, "observation": str, "action": str}, index 0-based within the
    trajectory. The reply's `data` is {"facts": [...]}; read it with `parse_facts`.
    """
    return task_request(
        "semantic",
        system=SEMANTIC_SYSTEM,
        instructions=SEMANTIC_INSTRUCTIONS,
        inputs={"goal": goal, "subgoal": subgoal, "steps": steps},
        schema=SEMANTIC_SCHEMA,
        # About 60 tokens a fact, a few facts a step.
        max_tokens=min(4096, 256 + 256 * len(steps)),
    )


def parse_facts(resp: LLMResponse) -> list[Fact]:
    """The facts of a "semantic" reply, in order.

    Confidence is clamped to [0, 1] (0.5 when missing or null); concepts are stripped, blanks
    dropped and case-insensitive duplicates removed in order (missing or null: none); steps
    are kept as a tuple of ints (missing or null: None).

    Raises:
        ValueError: naming the first field that does not match the schema.
    """
    items = _list_field(reply_data(resp), "facts", "semantic")
    facts: list[Fact] = []
    for i, item in enumerate(items):
        where = f"facts[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be an object, got {preview(item)}")
        proposition = _required_text(item, "proposition", where)
        if not is_words(proposition):
            continue  # punctuation, or a copied placeholder ("..."): nothing to remember
        facts.append(
            Fact(
                proposition=proposition,
                concepts=_concepts(item.get("concepts"), where),
                confidence=_confidence(item.get("confidence"), where),
                steps=_steps(item.get("steps"), where),
            )
        )
    return facts


# ---- procedural ---------------------------------------------------------------------------

PROCEDURAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "instructions": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "intent": {"type": "string"},
                    "condition": {"type": "string"},
                    "instruction": {"type": "string"},
                    "expected_outcome": {"type": "string"},
                    "steps": _STEP_INDICES,
                },
                "required": ["intent", "condition", "instruction", "expected_outcome"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["instructions"],
    "additionalProperties": False,
}
PROCEDURAL_SYSTEM = (
    "You turn an agent's actions into reusable procedures: when a situation arises, what to "
    "do, and what to expect."
)
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


# The procedural task of the trajectory that ends an episode also scores its last step, whose
# reward no next observation gave (`close` scores it).
PROCEDURAL_SCORING_SCHEMA: dict[str, Any] = {
    **PROCEDURAL_SCHEMA,
    "properties": {
        **PROCEDURAL_SCHEMA["properties"],
        # A number from 0 to 1 (clamped when read); a string that reads as one is taken
        # too, and one that does not only has the "reward" task asked after: never a reason
        # to refuse the procedures.
        "last_reward": {"type": ["number", "string", "null"]},
    },
}
LAST_REWARD_INSTRUCTIONS = """\
Also score the last step (its reward is null): last_reward, from 0 to 1, how much its action
moved toward the subgoal, judged from the steps (1: achieved it, 0.5: neutral or unclear, 0:
failed or made things worse).
Reply with JSON: {"instructions": [...], "last_reward": <number 0-1>}."""


def procedural_request(
    *, goal: str, subgoal: str, steps: list[dict[str, Any]], score_last: bool = False
) -> LLMRequest:
    """The "procedural" task over one trajectory's steps; with `score_last`, the reply also
    scores the last step (`last_reward`).

    `steps` are {"index": int, "observation": str, "action": str, "reward": float | None}.
    The reply's `data` is {"instructions": [...]} (and "last_reward"); read it with
    `parse_procedural`.
    """
    instructions = PROCEDURAL_INSTRUCTIONS
    inputs: dict[str, Any] = {"goal": goal, "subgoal": subgoal, "steps": steps}
    if score_last:
        instructions = f"{instructions}\n{LAST_REWARD_INSTRUCTIONS}"
        inputs["score_last_step"] = True
    return task_request(
        "procedural",
        system=PROCEDURAL_SYSTEM,
        instructions=instructions,
        inputs=inputs,
        schema=PROCEDURAL_SCORING_SCHEMA if score_last else PROCEDURAL_SCHEMA,
        # About 120 tokens an instruction (four fields), at most a couple a step.
        max_tokens=min(4096, 256 + 256 * len(steps) + (16 if score_last else 0)),
    )


def parse_procedural(resp: LLMResponse) -> tuple[list[Instruction], float | None]:
    """The instructions of a "procedural" reply (`parse_instructions`) and its score of the
    last step (clamped to [0, 1]; None when the reply has none that reads as a number)."""
    data = reply_data(resp)
    score = _number(data.get("last_reward")) if isinstance(data, dict) else None
    reward = None if score is None or math.isnan(score) else min(1.0, max(0.0, score))
    return parse_instructions(resp), reward


def parse_instructions(resp: LLMResponse) -> list[Instruction]:
    """The instructions of a "procedural" reply, in order.

    `intent` and `instruction` must be non-blank; `condition` and `expected_outcome` may be
    empty (missing or null reads as ""). Texts are stripped; steps as in `parse_facts`.

    Raises:
        ValueError: naming the first field that does not match the schema.
    """
    items = _list_field(reply_data(resp), "instructions", "procedural")
    out: list[Instruction] = []
    for i, item in enumerate(items):
        where = f"instructions[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be an object, got {preview(item)}")
        intent = _required_text(item, "intent", where)
        instruction = _required_text(item, "instruction", where)
        if not (is_words(intent) and is_words(instruction)):
            continue  # punctuation, or a copied placeholder: no procedure
        out.append(
            Instruction(
                intent=intent,
                condition=_optional_text(item, "condition", where),
                instruction=instruction,
                expected_outcome=_optional_text(item, "expected_outcome", where),
                steps=_steps(item.get("steps"), where),
            )
        )
    return out


# ---- return -------------------------------------------------------------------------------

RETURN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "scores": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "index": {"type": "integer"},
                    "return_score": {"type": "integer", "minimum": 1, "maximum": 10},
                },
                "required": ["index", "return_score"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["scores"],
    "additionalProperties": False,
}
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


def return_request(
    *,
    goal: str,
    subgoal: str,
    instructions: list[dict[str, Any]],
    steps: list[dict[str, Any]],
) -> LLMRequest:
    """The "return" task: scores each extracted instruction 1..10.

    `instructions` are {"index", "intent", "condition", "instruction", "expected_outcome"}
    and `steps` as for `procedural_request`. Read the reply with `parse_returns`.
    """
    return task_request(
        "return",
        system=RETURN_SYSTEM,
        instructions=RETURN_INSTRUCTIONS,
        inputs={"goal": goal, "subgoal": subgoal, "instructions": instructions, "steps": steps},
        schema=RETURN_SCHEMA,
        max_tokens=128 + 32 * len(instructions),
    )


def parse_returns(resp: LLMResponse, count: int) -> dict[int, int]:
    """Instruction index -> return score (rounded, clamped to 1..10) of a "return" reply.

    Indices outside 0..count-1 are ignored; when an index repeats, its first score counts.
    Instructions the reply does not score are simply absent.

    Raises:
        ValueError: when the reply is not {"scores": [{"index": int, "return_score": number}]}.
    """
    items = _list_field(reply_data(resp), "scores", "return")
    scores: dict[int, int] = {}
    for i, item in enumerate(items):
        where = f"scores[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be an object, got {preview(item)}")
        index = _integer(item.get("index"))
        if index is None:
            raise ValueError(f"{where}.index must be an integer, got {preview(item.get('index'))}")
        raw = item.get("return_score")
        score = _number(raw)
        if score is None or math.isnan(score):
            raise ValueError(f"{where}.return_score must be a number, got {preview(raw)}")
        if 0 <= index < count and index not in scores:
            clamped = min(float(MAX_RETURN), max(float(MIN_RETURN), score))
            scores[index] = round(clamped)
    return scores


# ---- merge_intent -------------------------------------------------------------------------

MERGE_INTENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"intent": {"type": "string"}},
    "required": ["intent"],
    "additionalProperties": False,
}
MERGE_INTENT_SYSTEM = "You maintain a catalogue of intents: short names for what procedures do."
MERGE_INTENT_INSTRUCTIONS = """\
Two intents, existing and new, name nearly the same purpose. Write one intent that covers
both: a short verb phrase (at most 8 words). Prefer the existing wording when it already
covers the new one.
Reply with JSON: {"intent": <the merged intent>}."""


def merge_intent_request(*, existing: str, new: str) -> LLMRequest:
    """The "merge_intent" task: the reply's `data` is {"intent": str} covering both intents."""
    return task_request(
        "merge_intent",
        system=MERGE_INTENT_SYSTEM,
        instructions=MERGE_INTENT_INSTRUCTIONS,
        inputs={"existing": existing, "new": new},
        schema=MERGE_INTENT_SCHEMA,
        max_tokens=256,
    )


def parse_merged_intent(resp: LLMResponse) -> str:
    """The merged intent of a "merge_intent" reply, stripped.

    Raises:
        ValueError: when the reply is not an object with a non-blank "intent" string.
    """
    data = reply_data(resp)
    if not isinstance(data, dict):
        raise ValueError(f"merge_intent reply must be a JSON object, got {preview(data)}")
    return _required_text(data, "intent", "merge_intent reply")


# ---- merge_intents ------------------------------------------------------------------------

MERGE_INTENTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "intents": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"index": {"type": "integer"}, "intent": {"type": "string"}},
                "required": ["index", "intent"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["intents"],
    "additionalProperties": False,
}
MERGE_INTENTS_INSTRUCTIONS = """\
Each pair holds two intents, existing and new, that name nearly the same purpose. For each
pair write one intent that covers both: a short verb phrase (at most 8 words). Prefer the
existing wording when it already covers the new one.
Reply with JSON: {"intents": [{"index": <the pair's index>, "intent": <the merged intent>},
...]}, one item per pair."""


def merge_intents_request(pairs: list[tuple[str, str]]) -> LLMRequest:
    """The "merge_intents" task: "merge_intent" for several (existing, new) pairs at once;
    read the reply with `parse_merged_intents`."""
    return task_request(
        "merge_intents",
        system=MERGE_INTENT_SYSTEM,
        instructions=MERGE_INTENTS_INSTRUCTIONS,
        inputs={"pairs": [{"index": i, "existing": existing, "new": new}
                          for i, (existing, new) in enumerate(pairs)]},
        schema=MERGE_INTENTS_SCHEMA,
        max_tokens=64 + 48 * len(pairs),
    )


def parse_merged_intents(resp: LLMResponse, count: int) -> dict[int, str]:
    """Pair index -> merged intent of a "merge_intents" reply (pairs it does not answer, or
    answers blank, are absent: they keep the existing wording).

    Raises:
        ValueError: when the reply is not {"intents": [{"index": int, "intent": str}, ...]}.
    """
    items = _list_field(reply_data(resp), "intents", "merge_intents")
    merged: dict[int, str] = {}
    for i, item in enumerate(items):
        where = f"intents[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be an object, got {preview(item)}")
        index = _integer(item.get("index"))
        text = item.get("intent")
        if index is None or not isinstance(text, str):
            raise ValueError(f"{where} must be {{\"index\": int, \"intent\": str}}, got "
                             f"{preview(item)}")
        if 0 <= index < count and text.strip() and index not in merged:
            merged[index] = text.strip()
    return merged


# ---- shared field readers -----------------------------------------------------------------






def _list_field(data: Any, key: str, task: str) -> list[Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{task} reply must be a JSON object, got {preview(data)}")
    if key not in data:
        raise ValueError(f"{task} reply has no {key!r} field: {preview(data)}")
    value = data[key]
    if not isinstance(value, list):
        raise ValueError(f"{key} must be a list, got {preview(value)}")
    return value


def _required_text(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}.{key} must be a non-empty string, got {preview(value)}")
    return value.strip()


def _optional_text(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{where}.{key} must be a string, got {preview(value)}")
    return value.strip()


def _concepts(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError(f"{where}.concepts must be a list of strings, got {preview(value)}")
    out: list[str] = []
    seen: set[str] = set()
    for j, concept in enumerate(value):
        if not isinstance(concept, str):
            raise ValueError(f"{where}.concepts[{j}] must be a string, got {preview(concept)}")
        label = concept.strip()
        # Tags are deduplicated by lower-cased label downstream; the first spelling wins here.
        if is_label(label) and label.lower() not in seen:
            seen.add(label.lower())
            out.append(label)
    return tuple(out)


# A tag is a few words: no JSON or markup characters (a small model's `');{` became a tag).
_NOT_IN_LABELS = re.compile(r"[{}\[\]<>\"`;\\]")
MAX_LABEL_CHARS = 64


def is_words(text: str) -> bool:
    """Whether `text` says something: it holds a letter or a digit (not only punctuation)."""
    return any(c.isalnum() for c in text)


def is_label(text: str) -> bool:
    """Whether `text` can be a concept's label: words, short, without JSON or markup."""
    return (is_words(text) and len(text) <= MAX_LABEL_CHARS
            and _NOT_IN_LABELS.search(text) is None)


def _confidence(value: Any, where: str) -> float:
    if value is None:
        return DEFAULT_CONFIDENCE
    number = _number(value)
    if number is None:
        raise ValueError(f"{where}.confidence must be a number, got {preview(value)}")
    if math.isnan(number):
        return DEFAULT_CONFIDENCE
    return min(1.0, max(0.0, number))


def _steps(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError(f"{where}.steps must be a list of integers, got {preview(value)}")
    out: list[int] = []
    for j, raw in enumerate(value):
        index = _integer(raw)
        if index is None:
            raise ValueError(f"{where}.steps[{j}] must be an integer, got {preview(raw)}")
        if index not in out:
            out.append(index)
    return tuple(out)


def _number(value: Any) -> float | None:
    """A JSON number (or numeric string) as a float; ±inf for ints too large; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, float):
        return value
    return None


def _integer(value: Any) -> int | None:
    """A JSON integer (or a float with no fractional part) as an int; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None
