"""Which messages and files a memory-file task sees, and how recall ranks files (pure)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate
from pathlib import Path

from mnemo import text as _text
from mnemo.errors import InvalidInputError, check_text
from mnemo.memoryfiles import _format
from mnemo.memoryfiles.model import MemoryFile
from mnemo.memoryfiles.prompts import TopicChange

# Only the newest part of a long history is sent: earlier updates saw the rest.
_MAX_MESSAGE_CHARS = 4_000
_MAX_CONVERSATION_CHARS = 60_000
# At most this many files show their content to the LLM (all of them when there are no more).
_MAX_SHOWN_FILES = 8
# How many ever smaller inputs a memory update tries when the model's context refuses them.
_VIEWS = 6
# Recall weights a query word by where it matches (the best place counts).
_TOPIC_WEIGHT, _DESCRIPTION_WEIGHT, _CONTENT_WEIGHT = 3, 2, 1


@dataclass(frozen=True, slots=True)
class Stored:
    """One file as scanned: its resolved topic and times, and what it holds."""

    path: Path
    topic: str
    description: str
    updated: datetime
    used: datetime | None
    body: str

    def file(self) -> MemoryFile:
        return MemoryFile(self.topic, self.description, self.path, self.updated, self.body)

    @property
    def last_used(self) -> datetime:
        # Writing a file is a use too: a file written after another was recalled is newer.
        return max(self.used, self.updated) if self.used else self.updated


def conversation(history: object, limit: int, setting: str) -> list[dict[str, str]]:
    """The user and assistant messages of `history` that carry text, newest within budget
    (InvalidInputError for a history that is not messages, or past `limit`, the bound
    `setting` names)."""
    if isinstance(history, str | bytes) or not isinstance(history, Sequence):
        raise InvalidInputError("history must be a list of message dicts")
    kept: list[dict[str, str]] = []
    total = 0
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if not isinstance(message, Mapping):
            raise InvalidInputError(
                f"history[{index}] must be a message dict, got {type(message).__name__}")
        content = message.get("content")
        if isinstance(content, Sequence) and not isinstance(content, str) and (
            len(content) > limit):
            raise InvalidInputError(
                f"history[{index}].content holds {len(content):,} parts, more than {limit:,}")
        text = check_text(content_text(content), f"history[{index}].content", limit=limit,
                          blank_ok=True, setting=setting).strip()
        if message.get("role") not in ("user", "assistant") or not text:
            continue
        total += min(len(text), _MAX_MESSAGE_CHARS)
        if total > _MAX_CONVERSATION_CHARS and kept:
            break
        kept.append({"role": str(message["role"]), "content": text[:_MAX_MESSAGE_CHARS]})
    kept.reverse()
    return kept


def listing(stored: list[Stored], conversation: list[dict[str, str]]) -> list[dict[str, str]]:
    """Every file as the `memory_update` task is shown it, the most related first, with "content"
    for the files whose content the LLM sees."""
    said = {stem for m in conversation for stem in _text.content_stems(m["content"])}
    overlap = {s.path: len(said & _text.content_stems(f"{s.topic} {s.description}"))
               for s in stored}
    related = sorted(stored, key=lambda s: (-overlap[s.path], -s.updated.timestamp(), s.topic))
    visible = {s.path for s in related[:_MAX_SHOWN_FILES]
               if len(stored) <= _MAX_SHOWN_FILES or overlap[s.path]}
    return [
        {"topic": s.topic, "description": s.description}
        | ({"content": s.body} if s.path in visible else {})
        for s in related]


def views(
    conversation: list[dict[str, str]], files: list[dict[str, str]]
) -> Iterator[tuple[list[dict[str, str]], list[dict[str, str]]]]:
    """The inputs of a `memory_update`, whole, then each about half as long (`_VIEWS` in all)."""
    said = sum(len(m["content"]) for m in conversation)
    filed = sum(_size(f) for f in files)
    yield conversation, files
    for level in range(1, _VIEWS):
        share = 0.5**level
        yield _newest(conversation, int(said * share)), _first(files, int(filed * share))


def _newest(conversation: list[dict[str, str]], budget: int) -> list[dict[str, str]]:
    sizes = list(accumulate(len(message["content"]) for message in reversed(conversation)))
    return conversation[len(conversation) - max(1, bisect_right(sizes, budget)):]


def _first(files: list[dict[str, str]], budget: int) -> list[dict[str, str]]:
    """The first `files` whose names fit in `budget` characters, then as much of their newest
    entries as the rest holds."""
    names = [{"topic": item["topic"], "description": item["description"]} for item in files]
    names = names[:bisect_right(list(accumulate(map(_size, names))), budget)]
    budget -= sum(map(_size, names))
    kept: list[dict[str, str]] = []
    for item, name in zip(files, names, strict=False):
        lines = _format.entries(item.get("content", ""))
        fit = bisect_right(list(accumulate(len(line) + 1 for line in reversed(lines))), budget)
        newest = lines[len(lines) - fit:]
        budget -= len(_format.body(newest))
        kept.append(name | ({"content": _format.body(newest)} if newest else {}))
    return kept


def _size(item: Mapping[str, str]) -> int:
    return sum(len(value) for value in item.values())


def combine(changes: list[TopicChange]) -> list[TopicChange]:
    """One change per topic key (the LLM may name one twice), in first-seen order."""
    combined: dict[str, TopicChange] = {}
    for change in changes:
        key = _format.topic_key(change.topic)
        seen = combined.get(key)
        if seen is None:
            combined[key] = change
            continue
        combined[key] = TopicChange(
            topic=seen.topic, description=seen.description or change.description,
            signals=tuple(dict.fromkeys(seen.signals + change.signals)),
            content=f"{seen.content}\n{change.content}", remove=seen.remove + change.remove)
    return list(combined.values())


def stems(text: str) -> set[str]:
    return {_text.stem(t) for t in _text.tokens(text) if not _text.is_stopword(t)}


def relevance(wanted: set[str], stored: Stored) -> int:
    topic, description, content = (
        stems(stored.topic), stems(stored.description), stems(stored.body))
    score = 0
    for word in wanted:
        if word in topic:
            score += _TOPIC_WEIGHT
        elif word in description:
            score += _DESCRIPTION_WEIGHT
        elif word in content:
            score += _CONTENT_WEIGHT
    return score


def content_text(content: object) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, bytes | bytearray):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return ""
