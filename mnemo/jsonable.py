"""mnemo's values as JSON values: the shapes `mnemo ... --json` prints and the MCP tools answer
with bounded versions of; `fields` reads a value's named fields."""

from __future__ import annotations

import enum
from datetime import datetime
from functools import partial

from mnemo.conversation.model import MessageView
from mnemo.graph.history import CommitDiff, CommitRecord
from mnemo.recall.engine import RecallResult


def label(value: object) -> str:
    """An enum member's value (`episodic`), anything else as text."""
    return str(value.value) if isinstance(value, enum.Enum) else str(value)


def fields(value: object, names: str) -> dict[str, object]:
    """The attributes `names` (space-separated) of `value` as JSON values."""
    out: dict[str, object] = {}
    for name in names.split():
        item = getattr(value, name)
        out[name] = (label(item) if isinstance(item, enum.Enum)
                    else item.isoformat() if isinstance(item, datetime) else item)
    return out


node_json = partial(fields, names="id type text data metadata created_at")
link_json = partial(fields, names="src dst type")
session_json = partial(fields, names="id repo state goal steps holder lease_until")
hit_json = partial(fields, names="message_id thread_id seq role snippet rank")
message_json = partial(fields, names="id thread_id seq role content recorded_at")
snapshot_json = partial(fields, names="id level start_seq end_seq text")
step_json = partial(fields, names="index trajectory_id boundary_detected annotated")


def recall_json(result: RecallResult) -> dict[str, object]:
    memories = [{**fields(m, "score phase hop"), "node": node_json(m.node)}
                for m in result.memories]
    return with_degraded({"query": result.query, "reasoned": result.reasoned,
                          "memories": memories}, result)


def with_degraded(out: dict[str, object], result: RecallResult) -> dict[str, object]:
    """`out` with the stages the recall did without (`RecallResult.degraded`), when any."""
    return {**out, "degraded": result.degraded} if result.degraded else out


def view_json(view: MessageView) -> dict[str, object]:
    return {
        "target": message_json(view.target), "messages": [message_json(m) for m in view.messages],
        "snapshots_before": [snapshot_json(s) for s in view.snapshots_before],
        "snapshots_after": [snapshot_json(s) for s in view.snapshots_after]}


def commit_json(commit: CommitRecord, goal: str | None = None) -> dict[str, object]:
    """A commit's record, and the goal it served (`mnemo.graph.history.goals`) when known."""
    return {
        "id": commit.id, "goal": goal, **fields(commit, "seq committed_at session_id source_id"),
        "nodes": commit.node_count, "links": commit.link_count, "retired": commit.retired_count,
        "joined": len(commit.joined),
        **fields(commit, "reverted_by reverts maintenance corrects"),
        "removed": len(commit.removed)}


def diff_json(diff: CommitDiff) -> dict[str, object]:
    return {
        **commit_json(diff.commit), "node_ids": list(diff.commit.node_ids),
        "retired_ids": list(diff.commit.retired), "removed_ids": list(diff.commit.removed)}
