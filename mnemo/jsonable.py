"""mnemo's values as JSON values: the shapes `mnemo ... --json` prints, and the MCP server's
tools answer with bounded versions of (`mnemo.mcp._output`); neither imports the other.

Explicit functions rather than a generic dataclass walk, so that the machine output is a stable
shape and not whatever fields a value grows.
"""

from __future__ import annotations

import enum

from mnemo.conversation.model import Message, MessageView, SearchHit, Snapshot
from mnemo.episode.model import StepInfo
from mnemo.graph.history import CommitDiff, CommitRecord
from mnemo.graph.model import Link, Node
from mnemo.memoryfiles.model import MemoryFile
from mnemo.recall.engine import RecallResult
from mnemo.session.machine import SessionInfo


def label(value: object) -> str:
    """An enum member's value (`episodic`), anything else as text."""
    return str(value.value) if isinstance(value, enum.Enum) else str(value)


def node_json(node: Node) -> dict[str, object]:
    return {
        "id": node.id,
        "type": label(node.type),
        "text": node.text,
        "data": node.data,
        "metadata": node.metadata,
        "created_at": node.created_at.isoformat(),
    }


def link_json(link: Link) -> dict[str, object]:
    return {"src": link.src, "dst": link.dst, "type": label(link.type)}


def recall_json(result: RecallResult) -> dict[str, object]:
    out: dict[str, object] = {
        "query": result.query,
        "reasoned": result.reasoned,
        "memories": [
            {
                "score": m.score,
                "phase": label(m.phase),
                "hop": m.hop,
                "node": node_json(m.node),
            }
            for m in result.memories
        ],
    }
    return with_degraded(out, result)


def with_degraded(out: dict[str, object], result: RecallResult) -> dict[str, object]:
    """`out` with the stages the recall did without (`RecallResult.degraded`), when any."""
    return {**out, "degraded": result.degraded} if result.degraded else out


def session_json(info: SessionInfo) -> dict[str, object]:
    return {
        "id": info.id,
        "repo": info.repo,
        "state": label(info.state),
        "goal": info.goal,
        "steps": info.steps,
        "holder": info.holder,
        "lease_until": None if info.lease_until is None else info.lease_until.isoformat(),
    }


def hit_json(hit: SearchHit) -> dict[str, object]:
    return {
        "message_id": hit.message_id,
        "thread_id": hit.thread_id,
        "seq": hit.seq,
        "role": hit.role,
        "snippet": hit.snippet,
        "rank": hit.rank,
    }


def message_json(message: Message) -> dict[str, object]:
    return {
        "id": message.id,
        "thread_id": message.thread_id,
        "seq": message.seq,
        "role": message.role,
        "content": message.content,
        "recorded_at": message.recorded_at.isoformat(),
    }


def snapshot_json(snapshot: Snapshot) -> dict[str, object]:
    return {
        "id": snapshot.id,
        "level": snapshot.level,
        "start_seq": snapshot.start_seq,
        "end_seq": snapshot.end_seq,
        "text": snapshot.text,
    }


def view_json(view: MessageView) -> dict[str, object]:
    return {
        "target": message_json(view.target),
        "messages": [message_json(m) for m in view.messages],
        "snapshots_before": [snapshot_json(s) for s in view.snapshots_before],
        "snapshots_after": [snapshot_json(s) for s in view.snapshots_after],
    }


def memory_file_json(file: MemoryFile) -> dict[str, object]:
    return {
        "topic": file.topic,
        "description": file.description,
        "path": str(file.path),
        "updated": file.updated.isoformat(),
        "content": file.content,
    }


def step_json(info: StepInfo) -> dict[str, object]:
    return {
        "index": info.index,
        "trajectory_id": info.trajectory_id,
        "boundary_detected": info.boundary_detected,
        "annotated": info.annotated,
    }


def commit_json(commit: CommitRecord, goal: str | None = None) -> dict[str, object]:
    """A commit's record, and the goal it served (`mnemo.graph.history.goals`) when known."""
    return {
        "id": commit.id,
        "goal": goal,
        "seq": commit.seq,
        "committed_at": commit.committed_at.isoformat(),
        "session_id": commit.session_id,
        "source_id": commit.source_id,
        "nodes": commit.node_count,
        "links": commit.link_count,
        "retired": commit.retired_count,
        "joined": len(commit.joined),
        "reverted_by": commit.reverted_by,
        "reverts": commit.reverts,
    }


def diff_json(diff: CommitDiff) -> dict[str, object]:
    return {
        **commit_json(diff.commit),
        "node_ids": list(diff.commit.node_ids),
        "retired_ids": list(diff.commit.retired),
    }
