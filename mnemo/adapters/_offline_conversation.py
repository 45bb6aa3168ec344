"""The offline LLM's heuristics for conversation memory's tasks: `summary`, `eviction` and
`snapshot_fold` (see `mnemo.adapters.offline`)."""

from __future__ import annotations

import re

from mnemo import text as _text
from mnemo.adapters._offline_common import (
    _GREETING,
    Answer,
    Entry,
    Inputs,
    _sentence_score,
    _strip_filler,
)
from mnemo.ports import JSONObject, ToolCall

# A user (or system) sentence that gives an instruction or corrects the assistant: eviction
# pins such messages word for word, since a summary would blur them.
_CONVERSATION_INSTRUCTION = re.compile(
    r"\b(?:always|never|make sure|be sure to|remember (?:to|that)|from now on|going forward|"
    r"(?:don'?t|do not) (?:ever )?\w+|must(?: not)?|instead of|rather than|i prefer|"
    r"i want you to|you (?:should|must|need to|have to)|please (?:use|keep|avoid|stop|"
    r"always|never|don'?t|do not|make sure)|avoid|stick (?:to|with)|only use|use only)\b",
    re.IGNORECASE,
)

_CONVERSATION_CORRECTION = re.compile(
    r"^(?:no|nope|wrong|actually|correction|not quite|wait,? no)\b|"
    r"\b(?:that'?s (?:wrong|incorrect|not (?:right|correct|what i))|"
    r"you (?:misunderstood|got it wrong|were wrong)|i meant|not \w+(?: \w+)?,? but)\b",
    re.IGNORECASE,
)

_ZONE_LINE = re.compile(r"^message (\d+)(?:-(\d+))?: (.*)$")

_ZONE_ROLE = re.compile(r"^([\w-]+): (.*)$")

_SPEAKERS = {
    "user": "User",
    "assistant": "Assistant",
    "system": "System",
    "developer": "System",
    "summary": "Summary",
}

_SUMMARY_SENTENCE_WORDS = 40


def _states_instruction(text: str) -> bool:
    return any(
        _CONVERSATION_INSTRUCTION.search(s) or _CONVERSATION_CORRECTION.search(s)
        for s in _text.sentences(text)
    )


def _extractive_summary(items: list[tuple[str, str]], max_words: int, previous: str = "") -> str:
    """The most informative sentences of `items` ((speaker, text) pairs) and of a previous summary,
    in order, within `max_words` words; earlier summaries fill up to half of it first."""
    earlier: list[tuple[float, int, str]] = []
    candidates: list[tuple[float, int, str]] = []
    order = 0
    for speaker, text in [("Summary", previous), *items]:
        if speaker == "Summary":
            for sentence in _text.sentences(text):
                earlier.append((_sentence_score(sentence) + 0.5, order, sentence))
                order += 1
            continue
        for raw in _text.sentences(text):
            sentence = _text.clip_words(_strip_filler(raw), _SUMMARY_SENTENCE_WORDS)
            if len(_text.words(sentence)) < 3 or _GREETING.match(sentence):
                continue
            score = _sentence_score(sentence)
            if speaker in {"User", "System"} and _states_instruction(sentence):
                score *= 2
            if speaker == "Tool":
                score /= 2
            shown = f"{speaker}: {sentence}" if speaker else sentence
            candidates.append((score, order, shown))
            order += 1
    picked: dict[int, str] = {}
    used = 0
    for pool, budget in ((earlier, max_words // 2), (earlier + candidates, max_words)):
        for score, position, sentence in sorted(pool, key=lambda c: (-c[0], c[1])):
            size = len(sentence.split())
            if score > 0 and position not in picked and used + size <= budget:
                picked[position] = sentence
                used += size
    return " ".join(s if s[-1:] in ".!?" else s + "." for _, s in sorted(picked.items()))


def _speaker(role: str) -> str:
    return _SPEAKERS.get(role, "Tool")


def _summary_task(inputs: Inputs) -> Answer:
    items = [(_speaker(m.role.strip()), m.text.strip()) for m in inputs.messages]
    max_words = max(16, inputs.max_words or 200)
    # With nothing informative said, the summary says so rather than invent content.
    return {"summary": _extractive_summary(items, max_words, inputs.previous_summary.strip())
            or f"{len(items)} earlier messages held no informative statement."}


def _snapshot_fold(inputs: Inputs) -> Answer:
    texts = [s.text.strip() for s in inputs.snapshots]
    max_words = max(16, inputs.max_words or 200)
    return {"summary": _extractive_summary([("", text) for text in texts], max_words)
            or _text.clip_words(" ".join(texts), max_words)
            or f"{len(texts)} earlier snapshots held no informative statement."}


def _eviction(inputs: Inputs) -> Answer:
    if inputs.done:
        # The tools already ran in an earlier round: finish.
        return [ToolCall("everything_ok", {}, "call_0")]
    messages: list[tuple[int, str, str]] = []
    for line in inputs.zone.splitlines():
        found = _ZONE_LINE.match(line.strip())
        if not found or found.group(2):
            continue  # a collapsed run of tool calls carries no sentence
        said = _ZONE_ROLE.match(found.group(3))
        if said:
            messages.append((int(found.group(1)), said.group(1), said.group(2)))
    max_words = max(16, 100 if inputs.max_words is None else inputs.max_words)
    calls: list[tuple[str, JSONObject]] = []
    if snapshot := _extractive_summary([(_speaker(r), t) for _, r, t in messages], max_words):
        calls.append(("save_snapshot", {"text": snapshot}))
    for seq, role, text in messages:
        if role in {"user", "system", "developer"} and _states_instruction(text) and (
                goal_ids := _goals_for(text, inputs.goals)):
            calls.append(("attach_messages_to_goals", {"message_ids": [seq], "goal_ids": goal_ids}))
    calls.append(("everything_ok", {}))
    return [ToolCall(name, arguments, f"call_{n}") for n, (name, arguments) in enumerate(calls)]


def _goals_for(text: str, goals: list[Entry]) -> list[str]:
    """The goals sharing a content word with `text`, else the newest goal (the current one)."""
    stems = _text.content_stems(text)
    ids = [g.id.strip() for g in goals if stems & _text.content_stems(g.description)]
    if not ids and goals:
        ids = [goals[-1].id.strip()]
    return [gid for gid in ids if gid]
