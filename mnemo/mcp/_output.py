"""The MCP tools' answers as JSON text of at most `MAX_OUTPUT_CHARS` characters as sent: `fit`
cuts an answer's texts to the longest length that fits, escapes counted, and each cut says so
(`chars`, `truncated`, an ellipsis, `next_offset` reads on). Nothing echoes the caller's input."""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Callable, Sequence
from functools import partial
from typing import TypeVar

from mnemo.conversation.model import Message, MessageView, SearchHit, Snapshot
from mnemo.graph.model import Node
from mnemo.jsonable import fields, hit_json, message_json, snapshot_json, with_degraded
from mnemo.memoryfiles.model import MemoryFile
from mnemo.recall.engine import RecallResult
from mnemo.tools import (
    MAX_OUTPUT_CHARS,
    MESSAGE_CHARS,
    SNIPPET_CHARS,
    clip,
    nearest,
    page,
)

T = TypeVar("T")
dumps = partial(json.dumps, sort_keys=True, ensure_ascii=False)
# A node's data (JSON) is shown whole up to this size, else as a clipped preview.
DATA_CHARS = 2_000
# At most this many ids or dropped entries are listed; the count says how many there were.
MAX_LISTED = 200
# At most this many repos or sessions a page (`offset` reads on).
PAGE_ITEMS = 50


def fit(build: Callable[[int], object], most: int) -> str:
    """The JSON text of `build(limit)` for the largest `limit` from 1 to `most` whose text holds
    at most MAX_OUTPUT_CHARS characters as sent, escapes counted (1 when none does): `build`
    cuts the answer's texts and names (never mnemo's ids) to at most `limit` characters."""
    if len(text := dumps(build(most))) <= MAX_OUTPUT_CHARS:
        return text
    # Limit i + 1 is at index i: the first index too long is the longest limit that fits.
    over = bisect_left(range(1, most), True,
                       key=lambda limit: len(dumps(build(limit))) > MAX_OUTPUT_CHARS)
    return dumps(build(max(over, 1)))


def _text(text: str, limit: int, key: str = "text") -> dict[str, object]:
    return {key: clip(text, limit), "chars": len(text), "truncated": len(text) > limit}


def recall_output(result: RecallResult, limit: int) -> dict[str, object]:
    """Each memory's score, phase, hop and node (id, type, a snippet of its text); the
    query is not echoed (`recall_in_context` makes it the goal and steps again)."""
    memories = [{**fields(m, "score phase hop"),
                 "node": {**fields(m.node, "id type"), **_text(m.node.text, limit)}}
                for m in result.memories]
    reasoned = None if result.reasoned is None else clip(result.reasoned, limit * 4)
    return with_degraded({"reasoned": reasoned, "memories": memories}, result)


def node_output(node: Node, offset: int, limit: int) -> dict[str, object]:
    """One page of a node's text (`next_offset` reads on), whether it is retired, and its data."""
    part = page(node.text, offset, limit)
    data = dumps(node.data, default=str)
    out = {**fields(node, "id type created_at retired"),
           **fields(part, "text offset next_offset"), "chars": part.total}
    if len(data) <= DATA_CHARS:
        return {**out, "data": node.data}
    return {**out, "data": None, "data_preview": clip(data, DATA_CHARS)}


def hits_output(hits: Sequence[SearchHit], limit: int) -> list[dict[str, object]]:
    return [{**hit_json(h), "thread_id": clip(h.thread_id, limit), "role": clip(h.role, limit),
             "snippet": clip(h.snippet, limit)} for h in hits]


def _message(message: Message, limit: int) -> dict[str, object]:
    return {**message_json(message), **_text(message.content, min(limit, MESSAGE_CHARS), "content")}


def _snapshot(snapshot: Snapshot, limit: int) -> dict[str, object]:
    return {**snapshot_json(snapshot), **_text(snapshot.text, min(limit, MESSAGE_CHARS))}


def view_output(view: MessageView, offset: int, limit: int) -> dict[str, object]:
    """The target (a page of its content), the snapshots around it, and as many of the
    messages around it as fit, nearest first; `messages_left_out` counts the rest."""
    part = page(view.target.content, offset, limit)
    target = {**_message(view.target, limit), "content": part.text, "offset": part.offset,
              "next_offset": part.next_offset, "truncated": len(part.text) < part.total}
    out = {"target": target,
           "snapshots_before": [_snapshot(s, limit) for s in view.snapshots_before],
           "snapshots_after": [_snapshot(s, limit) for s in view.snapshots_after]}
    shown = {m.id: _message(m, limit) for m in view.messages}
    kept = nearest(view.messages, view.target.seq, MAX_OUTPUT_CHARS - len(dumps(out)) - 100,
                   lambda m: len(dumps(shown[m.id])) + 2)
    return {**out, "messages": [shown[m.id] for m in kept],
            "messages_left_out": len(view.messages) - len(kept)}


def page_output(key: str, items: Sequence[T], offset: int, row: Callable[[T, int], object],
                limit: int) -> dict[str, object]:
    """A page of `items` (PAGE_ITEMS from `offset`) under `key`, the total and `next_offset`."""
    end = offset + PAGE_ITEMS
    return {
        key: [row(item, limit) for item in items[offset:end]], "total": len(items),
        "offset": offset, "next_offset": end if end < len(items) else None}


def memory_file_output(file: MemoryFile, limit: int) -> dict[str, object]:
    """A memory file with its content within `limit`, and what writing it cost."""
    return {
        **fields(file, "topic updated condensed skipped"),
        "description": clip(file.description, limit), "path": clip(str(file.path), limit),
        **_text(file.content, limit, "content"), "entry_truncated": file.truncated,
        "dropped": [clip(line, min(limit, SNIPPET_CHARS)) for line in file.dropped[:MAX_LISTED]],
        "dropped_count": len(file.dropped)}
