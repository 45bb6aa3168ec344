"""Choosing messages for `load`: semantic ranking, and keeping tool calls with their results
(OpenAI's and Anthropic's ids), since chat APIs refuse a result without its call."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from mnemo.conversation.model import Message


def call_ids(message: Message) -> set[str]:
    calls = message.data.get("tool_calls")
    return _ids([*(calls if isinstance(calls, list) else []), *message.parts("tool_use")], "id")


def result_ids(message: Message) -> set[str]:
    answered = message.data.get("tool_call_id")
    return ({answered} if isinstance(answered, str) else set()) | _ids(
        message.parts("tool_result"), "tool_use_id")


def _ids(items: Iterable[object], field: str) -> set[str]:
    return {item[field] for item in items
            if isinstance(item, dict) and isinstance(item.get(field), str)}


def with_tool_pairs(picked: Sequence[Message], pool: Sequence[Message]) -> list[Message]:
    """`picked` plus the messages of `pool` that complete their tool calls, by seq."""
    chosen = {m.seq: m for m in picked}
    calls = {m.seq: call_ids(m) for m in pool}
    results = {m.seq: result_ids(m) for m in pool}
    frontier = list(chosen.values())
    while frontier:
        message = frontier.pop()
        wanted_calls = result_ids(message)
        wanted_results = call_ids(message)
        for other in pool:
            if other.seq in chosen:
                continue
            if calls[other.seq] & wanted_calls or results[other.seq] & wanted_results:
                chosen[other.seq] = other
                frontier.append(other)
    return [chosen[seq] for seq in sorted(chosen)]


def without_orphaned_results(messages: Sequence[Message]) -> list[Message]:
    """`messages` less each tool result none of whose calls an earlier one makes (its call
    was compacted, expired, or never saved): chat APIs refuse such a result."""
    made: set[str] = set()
    kept: list[Message] = []
    for message in messages:
        answered = result_ids(message)
        if answered and not answered & made:
            continue
        made |= call_ids(message)
        kept.append(message)
    return kept


def top_k(
    messages: Sequence[Message], vectors: npt.NDArray[np.float32], query: npt.NDArray[np.float32],
    k: int,
) -> list[Message]:
    """The `k` messages whose vectors are most cosine-similar to `query`; ties go to the newer
    message. Returned by seq."""
    if not messages:
        return []
    norms = np.linalg.norm(vectors, axis=1)
    q_norm = float(np.linalg.norm(query))
    scores = np.zeros(len(messages), dtype=np.float64)
    if q_norm > 0:
        np.divide(vectors @ query, norms * q_norm, out=scores, where=norms > 0)
    # Sort by score, then by recency (seq): lexsort takes its primary key last.
    order = np.lexsort((-np.array([m.seq for m in messages]), -scores))[:k]
    return sorted((messages[i] for i in order), key=lambda m: m.seq)
