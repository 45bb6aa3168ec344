"""What the offline heuristics share (`mnemo.adapters.offline`): a task's JSON inputs read into
`Inputs`, and the tests of a sentence (a fact, filler, a question, a greeting, how informative)."""

from __future__ import annotations

import re
from typing import TypeAlias

import msgspec

from mnemo import text as _text
from mnemo.calls.tasks import input_json
from mnemo.ports import JSONObject, LLMRequest, ToolCall


class Step(msgspec.Struct):
    index: int | None = None
    observation: str = ""
    action: str = ""
    reward: float | None = None


class Indexed(msgspec.Struct):
    """An instruction to score, or an existing and a new text to merge or compare."""

    index: int | None = None
    instruction: str = ""
    existing: str = ""
    new: str = ""


class Entry(msgspec.Struct):
    """A message (`role`, `text` or `content`), a snapshot, a goal or a memory file."""

    role: str = ""
    text: str = ""
    content: str = ""
    id: str = ""
    topic: str = ""
    description: str = ""


class Inputs(msgspec.Struct):
    """A task's inputs (`mnemo.calls.tasks.task_request`), empty where a task has none."""

    goal: str = ""
    subgoal: str = ""
    observation: str = ""
    action: str = ""
    next_observation: str | None = None
    previous_state: str | None = None
    previous_subgoal: str | None = None
    recent_steps: list[str] = []
    steps: list[Step] = []
    score_last_step: bool = False
    instructions: list[Indexed] = []
    pairs: list[Indexed] = []
    existing: str = ""
    new: str = ""
    messages: list[Entry] = []
    snapshots: list[Entry] = []
    goals: list[Entry] = []
    files: list[Entry] = []
    conversation: list[Entry] = []
    previous_summary: str = ""
    max_words: int | None = None
    max_chars: int = 4000
    done: list[str] = []
    zone: str = ""
    statement: str = ""
    entries: list[str] = []
    description: str = ""
    query: str = ""
    memories: list[str] = []

    @classmethod
    def of(cls, request: LLMRequest) -> Inputs:
        """The inputs `request` holds; none (every field empty) when they do not read as these."""
        try:
            return msgspec.json.decode(input_json(request), type=cls, strict=False)
        except msgspec.DecodeError:
            return cls()


# A heuristic's answer: the reply's text, its tool calls, or its data.
Answer: TypeAlias = "str | list[ToolCall] | JSONObject"

_QUESTION_OPENERS = re.compile(
    r"^(?:what|why|how|when|where|who|whom|whose|which|can you|could you|would you|will you|"
    r"do you|does anyone|is there|are there|should i|shall we|may i)\b",
    re.IGNORECASE,
)

_GREETING = re.compile(
    r"^(?:thanks|thank you|thx|cheers|hi|hello|hey|good (?:morning|afternoon|evening|night)|"
    r"bye|goodbye|welcome|you're welcome|no problem|sounds good|got it|of course)\b",
    re.IGNORECASE,
)

# An opening word followed by a comma, "!" or ":" (group 2), or by plain space.
_OPENER = re.compile(r"([A-Za-z]+)\s*([,!:])?\s+")

# Interjections that open a sentence without content even with no comma after them.
_ALWAYS_FILLER = frozenset(
    "okay ok so well also actually basically anyway anyways alright hmm hm oh ah um uh yeah yep "
    "yes now hi hello hey".split()
)


def _capitalised(text: str) -> str:
    """`text` with its first letter upper-case, unless its first word is an identifier."""
    first = text.split(maxsplit=1)[0].rstrip(",;:!?") if text.strip() else ""
    return text if _text.is_identifier(first) else text[:1].upper() + text[1:]


def _strip_filler(sentence: str, *, capitalise: bool = True) -> str:
    """The sentence without leading interjections like "Okay, so" (`_capitalised` again)."""
    rest = sentence
    while match := _OPENER.match(rest):
        word = match.group(1).lower()
        if word in _ALWAYS_FILLER:
            if word == "so" and re.match(r"so\s+(?:far|much|many|that)\b", rest, re.I):
                break
        elif not (word in _text.FILLER_OPENERS and match.group(2)):
            break
        rest = rest[match.end() :]
    return _capitalised(rest) if capitalise else rest


def _is_fact(sentence: str) -> bool:
    if sentence.endswith("?") or _QUESTION_OPENERS.match(sentence):
        return False
    ws = _text.words(sentence)
    if len(ws) < 4:
        return False
    informative = sum(
        1
        for i, w in enumerate(ws)
        if _text.is_informative(w) or _text.is_name(w, sentence_initial=i == 0)
    )
    return informative >= 2 and not (_GREETING.match(sentence) and informative < 3)


def _sentence_score(sentence: str) -> float:
    ws = _text.words(sentence)
    informative = sum(1 for w in ws if _text.is_informative(w))
    specific = sum(1 for w in ws if any(c.isdigit() for c in w) or _text.is_acronym(w))
    return informative + 0.5 * specific
