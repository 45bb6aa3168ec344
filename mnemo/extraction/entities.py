"""Speakers and named entities of a step, as TAG nodes it belongs to: with entity tags, each
EPISODIC node is linked to a tag per name it mentions and one for its speaker, so recall leads
from a name in the query straight to its steps."""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace

from mnemo import text as _text
from mnemo.extraction.dates import MONTHS, WEEKDAYS
from mnemo.graph.erasure import Embed
from mnemo.graph.model import (
    Changeset,
    Link,
    LinkType,
    NodeDraft,
    NodeType,
    normalise_label,
)
from mnemo.graph.vectors import embed_within
from mnemo.ports import Embedder, embed

# A speaker's name, and the time that may follow it: "Caroline (1:56 pm on 8 May, 2023)".
_NAME = r"[A-Z][\w'\-]*(?: [A-Z][\w'\-]*)?"
_TIME = r"\([^()]{0,80}\)"
# "Caroline:" or "Caroline (1:56 pm on 8 May, 2023):" opening a line of a transcript.
_SPEAKER = re.compile(rf"^\s*({_NAME})\s*(?:{_TIME})?\s*:\s")
# The same opening with its time (see `embedding_text`).
_TIMED_SPEAKER = re.compile(rf"^(\s*{_NAME})\s*{_TIME}\s*:\s")
# Capitalised, but a date rather than an entity.
_CALENDAR = frozenset((*MONTHS, *WEEKDAYS))
# The most tags one step gets: a long tool output names dozens of things.
MAX_NAMES = 6


def embedding_text(text: str) -> str:
    """What a node's vector is made of: its text, a transcript line without the time of its
    opening ("Caroline (8 May 2023): I paint" -> "Caroline: I paint")."""
    return _TIMED_SPEAKER.sub(r"\1: ", text, count=1)


def vector_text(kind: NodeType, text: str) -> str:
    """What a node's vector is made of: a subgoal's text whole, else `embedding_text`."""
    return text if kind is NodeType.SUBGOAL else embedding_text(text)


def wordings(embedder: Embedder, timeout: float) -> Embed:
    """A forget's or a revert's `Embed`: `embedding_text` of each text, within `timeout` seconds."""
    return lambda texts: embed_within(embedder, [embedding_text(t) for t in texts], timeout)


async def embedded_again(changeset: Changeset, embedder: Embedder, generation: int,
                         seconds: float) -> Changeset:
    """`changeset` with every node's vector made again by `embedder` for the vectors of
    `generation`, in one embedding call within `seconds` (EmbeddingError)."""
    vectors = await embed_within(
        embedder, [vector_text(n.type, n.text) for n in changeset.nodes], seconds)
    nodes = [replace(n, vector=v) for n, v in zip(changeset.nodes, vectors, strict=True)]
    return replace(changeset, nodes=nodes, generation=generation)


def speaker_of(text: str) -> str | None:
    """Who says a transcript line ("Caroline (8 May 2023): ..." -> "Caroline"), or None."""
    match = _SPEAKER.match(text)
    return match.group(1) if match else None


def entity_names(text: str) -> list[str]:
    """The speaker and the names `text` mentions, in order, each once (case-insensitive)."""
    found: list[str] = []
    speaker = _SPEAKER.match(text)
    if speaker:
        found.append(speaker.group(1))
        text = text[speaker.end() :]
    for sentence in _text.sentences(text) or [text]:
        words = [_text.without_clitic(word) for word in _text.words(sentence)]
        i = 1  # the first word of a sentence is capitalised whatever it is
        while i < len(words):
            j = i
            while j < len(words) and _is_name(words[j]) and j - i < 3:
                j += 1
            if j > i:
                found.append(" ".join(words[i:j]))
                i = j
            else:
                i += 1
    names: dict[str, str] = {}
    for name in found:
        names.setdefault(normalise_label(name), name)
    return list(names.values())[:MAX_NAMES]


def _is_name(word: str) -> bool:
    return _text.is_name(word, sentence_initial=False) and word.lower() not in _CALENDAR


async def with_entity_tags(changeset: Changeset, embedder: Embedder) -> Changeset:
    """`changeset` with a TAG per name in each EPISODIC node's text and a MEMBERSHIP link to
    the node; one embedding call."""
    labels: dict[str, str] = {}
    links: list[Link] = []
    for node in changeset.nodes:
        if node.type is not NodeType.EPISODIC:
            continue
        observation = node.data.get("observation")
        for name in entity_names(observation if isinstance(observation, str) else node.text):
            key = normalise_label(name)
            labels.setdefault(key, " ".join(name.split()))
            links.append(Link(_tag_id(changeset, key), node.id, LinkType.MEMBERSHIP))
    if not links:
        return changeset
    keys = list(labels)
    vectors = await embed(embedder, [labels[key] for key in keys])
    source = next((n.source_id for n in changeset.nodes if n.source_id is not None), None)
    tags = [
        NodeDraft(id=_tag_id(changeset, key), type=NodeType.TAG, text=labels[key],
                  data={"label": labels[key]}, vector=vector, key=key, source_id=source)
        for key, vector in zip(keys, vectors, strict=True)]
    return replace(changeset, nodes=[*changeset.nodes, *tags], links=[*changeset.links, *links])


def _tag_id(changeset: Changeset, key: str) -> str:
    # Unique within the changeset; the commit maps a tag whose key exists onto that node.
    return f"tag_{changeset.id}_{hashlib.sha1(key.encode()).hexdigest()[:16]}"
