"""The MCP tools' answers as bounded JSON values: none passes `MAX_OUTPUT_CHARS`, a list shares
it among its items, a text cut says how long it was (`chars`, `truncated`) and can be read
whole (`get_node`, a viewed message by `offset`). Nothing echoes the caller's input back."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial

from mnemo.conversation.model import Message, MessageView, SearchHit, Snapshot
from mnemo.graph.model import Node
from mnemo.jsonable import fields, hit_json, message_json, snapshot_json, with_degraded
from mnemo.memoryfiles.model import MemoryFile
from mnemo.recall.engine import RecallResult
from mnemo.tools import (
    MAX_OUTPUT_CHARS,
    MESSAGE_CHARS,
    PAGE_CHARS,
    SNIPPET_CHARS,
    clip,
    nearest,
    page,
)

dumps = partial(json.dumps, sort_keys=True, ensure_ascii=False)
# What one list item costs besides its text.
_ITEM_OVERHEAD = 250
# A node's data (JSON) is shown whole up to this size, else as a clipped preview.
DATA_CHARS = 2_000
# At most this many ids or dropped entries are listed; the count says how many there were.
MAX_LISTED = 200


def _share(n: int, cap: int) -> int:
    """Each of `n` items' share of the budget for its text, at most `cap`."""
    return max(40, min(cap, MAX_OUTPUT_CHARS // max(n, 1) - _ITEM_OVERHEAD))


def _text(text: str, limit: int, key: str = "text") -> dict[str, object]:
    return {key: clip(text, limit), "chars": len(text), "truncated": len(text) > limit}


def recall_output(result: RecallResult) -> dict[str, object]:
    """Each memory's score, phase, hop and node (id, type, a snippet of its text); the
    query is not echoed (`recall_in_context` makes it the goal and steps again)."""
    limit = _share(len(result.memories), SNIPPET_CHARS)
    memories = [{**fields(m, "score phase hop"),
                 "node": {**fields(m.node, "id type"), **_text(m.node.text, limit)}}
                for m in result.memories]
    reasoned = None if result.reasoned is None else clip(result.reasoned, SNIPPET_CHARS * 4)
    return with_degraded({"reasoned": reasoned, "memories": memories}, result)


def node_output(node: Node, offset: int) -> dict[str, object]:
    """One page of a node's text (`next_offset` reads on), whether it is retired, and its data."""
    part = page(node.text, offset)
    data = dumps(node.data, default=str)
    out = {**fields(node, "id type created_at retired"),
           **fields(part, "text offset next_offset"), "chars": part.total}
    if len(data) <= DATA_CHARS:
        return {**out, "data": node.data}
    return {**out, "data": None, "data_preview": clip(data, DATA_CHARS)}


def hits_output(hits: Sequence[SearchHit]) -> list[dict[str, object]]:
    limit = _share(len(hits), SNIPPET_CHARS)
    return [{**hit_json(h), "snippet": clip(h.snippet, limit)} for h in hits]


def _message(message: Message, limit: int) -> dict[str, object]:
    return {**message_json(message), **_text(message.content, limit, "content")}


def _snapshot(snapshot: Snapshot) -> dict[str, object]:
    return {**snapshot_json(snapshot), **_text(snapshot.text, MESSAGE_CHARS)}


def view_output(view: MessageView, offset: int) -> dict[str, object]:
    """The target (a page of its content), the snapshots around it, and as many of the
    messages around it as fit, nearest first; `messages_left_out` counts the rest."""
    part = page(view.target.content, offset)
    target = {**_message(view.target, PAGE_CHARS), "content": part.text, "offset": part.offset,
              "next_offset": part.next_offset, "truncated": len(part.text) < part.total}
    out: dict[str, object] = {
        "target": target, "snapshots_before": [_snapshot(s) for s in view.snapshots_before],
        "snapshots_after": [_snapshot(s) for s in view.snapshots_after], "messages": [],
        "messages_left_out": 0}
    shown = {m.id: _message(m, MESSAGE_CHARS) for m in view.messages}
    kept = nearest(view.messages, view.target.seq, MAX_OUTPUT_CHARS - len(dumps(out)) - 100,
                   lambda m: len(dumps(shown[m.id])) + 2)
    out["messages"] = [shown[m.id] for m in kept]
    out["messages_left_out"] = len(view.messages) - len(kept)
    return out


def memory_file_output(file: MemoryFile, limit: int = PAGE_CHARS) -> dict[str, object]:
    """A memory file with its content within `limit`, and what writing it cost."""
    return {
        **fields(file, "topic description updated condensed skipped"), "path": str(file.path),
        **_text(file.content, limit, "content"), "entry_truncated": file.truncated,
        "dropped": [clip(line, SNIPPET_CHARS) for line in file.dropped[:MAX_LISTED]],
        "dropped_count": len(file.dropped)}


def memory_files_output(files: Sequence[MemoryFile]) -> list[dict[str, object]]:
    limit = _share(len(files), PAGE_CHARS)
    return [memory_file_output(f, limit) for f in files]
