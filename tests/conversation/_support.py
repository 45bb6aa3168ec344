"""Helpers for the conversation tests: a settable clock, an offline LLM with failure controls,
and message builders."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import mnemo
from mnemo.adapters.offline import OfflineLLM
from mnemo.conversation.model import Message
from mnemo.conversation.viewport import safe_cuts
from mnemo.storage.threads import SqlThreads


class ManualClock:
    """A clock the test moves by hand (`advance`), for TTLs and recency."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2025, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


class OfflineFake:
    """The offline LLM, recording calls, with tasks that can be made to fail or answer junk."""

    def __init__(self) -> None:
        self._offline = OfflineLLM()
        self.calls: list[mnemo.LLMRequest] = []
        self.fail_tasks: set[str] = set()
        self.garbage_tasks: set[str] = set()

    def tasks(self) -> list[str]:
        return [request.task for request in self.calls]

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        self.calls.append(request)
        if request.task in self.fail_tasks:
            raise RuntimeError(f"{request.task} boom")
        if request.task in self.garbage_tasks:
            return mnemo.LLMResponse(text="", data={"nonsense": True})
        return await self._offline.generate(request)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


def tool_call(call_id: str, name: str = "run", arguments: str = "{}") -> dict[str, Any]:
    """An assistant message making one OpenAI-style tool call."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }


def tool_result(call_id: str, output: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def chat(turns: int, *, words: int = 8) -> list[dict[str, Any]]:
    """`turns` user/assistant exchanges of about `words` words each, distinct per turn."""
    out: list[dict[str, Any]] = []
    filler = " ".join(f"word{i}" for i in range(words))
    for i in range(turns):
        out.append(user(f"Question {i} about topic{i}: {filler}"))
        out.append(assistant(f"Answer {i} about topic{i}: {filler}"))
    return out


class ScriptedEviction:
    """An LLM whose "eviction" replies come from a script (the last one repeats); other tasks
    go to the offline LLM. Records every eviction request."""

    def __init__(self, *replies: mnemo.LLMResponse) -> None:
        self._offline = OfflineLLM()
        self.replies = list(replies)
        self.requests: list[mnemo.LLMRequest] = []

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        if request.task != "eviction":
            return await self._offline.generate(request)
        self.requests.append(request)
        return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]


def prose() -> mnemo.LLMResponse:
    """A reply in prose, without tool calls: what a chatty model does with a tool prompt."""
    return mnemo.LLMResponse(text="Sure! The zone discusses the deployment; nothing to pin.")


def snapshot_call(text: str) -> mnemo.LLMResponse:
    """A reply saving `text` as the snapshot and finishing."""
    return mnemo.LLMResponse(tool_calls=[
        mnemo.ToolCall("save_snapshot", {"text": text}, "c1"),
        mnemo.ToolCall("everything_ok", {}, "c2"),
    ])


def tagged(seq: int, role: str, words: int) -> dict[str, Any]:
    """A message holding the word `tag<seq>` (so search can find exactly it) and `words`
    filler words."""
    return {"role": role, "content": f"tag{seq} " + " ".join(["filler"] * words)}


async def hidden(mem: mnemo.Memory, thread_id: str, token_budget: int) -> list[str]:
    """What breaks "Nothing hides from the agent" (the API contract) in the thread's viewport of
    `token_budget` tokens, one line each; [] when nothing does.

    Every message must be in the viewport's messages, or before the boundary inside a
    snapshot's range (covered ones included), or pinned and in the viewport's pinned; and
    `search_messages(exclude_viewport_of=...)` must leave out only messages the viewport shows
    (each message holds the word `tag<seq>`, see `tagged`); and no tool result it shows may
    lack its call.
    """
    view = await mem.viewport(thread_id, token_budget=token_budget)
    raw = await mem.conversation().raw(thread_id)
    spans = [
        (s.start_seq, s.end_seq) for s in await mem._conversations.store.snapshots(thread_id)
    ]
    shown = {m.id for m in view.messages} | {m.id for m in view.pinned}
    problems: list[str] = []
    if view.tokens > token_budget:
        problems.append(f"the viewport costs {view.tokens} tokens, over {token_budget}")
    if not safe_cuts(view.messages)[0]:
        problems.append("the viewport shows a tool result without its call")
    unseen: list[Message] = []
    for message in raw:
        covered = message.seq < view.boundary_seq and any(
            start <= message.seq <= end for start, end in spans
        )
        if message.id not in shown:
            unseen.append(message)
            if not covered:
                problems.append(f"message {message.seq} is in no view and no snapshot")
    # 32 words a query (search's cap), each matching one message: all fit in one page of hits.
    for start in range(0, len(unseen), 32):
        batch = unseen[start : start + 32]
        hits = await mem.search_messages(
            " ".join(f"tag{m.seq}" for m in batch), thread_id=thread_id, limit=100,
            exclude_viewport_of=thread_id,
        )
        found = {h.message_id for h in hits}
        problems += [
            f"message {m.seq} is not shown, yet search leaves it out"
            for m in batch if m.id not in found
        ]
    return problems


def count_log_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many messages each read of a thread's log returns, from now on."""
    counts: list[int] = []
    raw = SqlThreads.raw

    async def counted(self: SqlThreads, *args: Any) -> list[Message]:
        messages = await raw(self, *args)
        counts.append(len(messages))
        return messages

    monkeypatch.setattr(SqlThreads, "raw", counted)
    return counts
