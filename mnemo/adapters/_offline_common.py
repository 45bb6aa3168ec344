"""What the offline heuristics share (`mnemo.adapters.offline`): typed access to a task's JSON
inputs, and the tests of a sentence (a fact, filler, a question, a greeting, how informative)."""

from __future__ import annotations

import math
import re

from mnemo import text as _text
from mnemo.ports import Usage


def _str(inputs: dict[str, object], key: str) -> str:
    value = inputs.get(key)
    return value.strip() if isinstance(value, str) else ""


def _str_list(inputs: dict[str, object], key: str) -> list[str]:
    value = inputs.get(key)
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, str)]


def _dicts(inputs: dict[str, object], key: str) -> list[dict[str, object]]:
    value = inputs.get(key)
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, dict)]


def _int(item: dict[str, object], key: str, default: int) -> int:
    value = item.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _field(item: dict[str, object], key: str) -> str:
    value = item.get(key)
    return value.strip() if isinstance(value, str) else ""


def _reward(item: dict[str, object]) -> float | None:
    value = item.get("reward")
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return min(1.0, max(0.0, float(value)))
    return None


_NO_USAGE = Usage(0, 0, 0.0)


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
    """`text` with its first letter upper-case, unless its first word is an identifier
    ("test_upload fails" stays as written)."""
    first = text.split(maxsplit=1)[0].rstrip(",;:!?") if text.strip() else ""
    return text if _text.is_identifier(first) else text[:1].upper() + text[1:]


def _strip_filler(sentence: str, *, capitalise: bool = True) -> str:
    """The sentence without leading interjections like "Okay, so" (capitalised again, but
    for an identifier)."""
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
    if informative < 2:
        return False
    return not (_GREETING.match(sentence) and informative < 3)


def _sentence_score(sentence: str) -> float:
    ws = _text.words(sentence)
    informative = sum(1 for w in ws if _text.is_informative(w))
    specific = sum(1 for w in ws if any(c.isdigit() for c in w) or _text.is_acronym(w))
    return informative + 0.5 * specific
