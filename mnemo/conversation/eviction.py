"""Eviction: the oldest part of the viewport leaves it, and the LLM (task "eviction", three
tools, up to `MAX_ROUNDS` rounds under one deadline) decides what stays; the snapshot, the pins
and the boundary's move are written in one transaction. The boundary always advances: when the
LLM fails the snapshot is a note pointing to `search_messages`. Five uncovered level-1 snapshots
fold into one level-2 snapshot (task "snapshot_fold")."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import product

from mnemo.calls.retry import allowed, fail_after
from mnemo.calls.tasks import read_reply, reply_data
from mnemo.conversation.model import Message
from mnemo.conversation.prompts import EVICTION_ARGUMENTS, AttachMessagesToGoals, SaveSnapshot
from mnemo.ports import LLM, REQUIRED, LLMRequest, LLMResponse, ToolCall, Usage, add_usage

log = logging.getLogger("mnemo")

MAX_ROUNDS = 3
# Evictions of one call whose commit found the boundary moved back (a clear) before giving up.
MAX_ATTEMPTS = 3
# The newest lines of `done` the model is shown.
MAX_DONE = 20

@dataclass(slots=True)
class EvictionTools:
    """The tools of one eviction and what the model did with them."""

    zone: Sequence[Message]
    goal_ids: set[str]
    max_words: int
    snapshot_parts: list[str] = field(default_factory=list)
    pins: list[tuple[str, str]] = field(default_factory=list)
    finished: bool = False
    calls: list[ToolCall] = field(default_factory=list)
    done: list[str] = field(default_factory=list)

    def call(self, call: ToolCall) -> str:
        self.calls.append(call)
        result = self._run(call)
        self.done.append(f"{call.name}: {result}")
        return result

    def _run(self, call: ToolCall) -> str:
        kind = EVICTION_ARGUMENTS.get(call.name)
        if kind is None:
            return f"error: unknown tool {call.name!r}"
        try:
            args = read_reply(LLMResponse(data=call.arguments), kind, call.name)
        except ValueError as exc:
            return f"error: {exc}"
        if isinstance(args, SaveSnapshot):
            return self.save_snapshot(args.text)
        if isinstance(args, AttachMessagesToGoals):
            return self.attach(args.message_ids, args.goal_ids)
        if not self.snapshot_parts:
            # Every zone needs a snapshot: the boundary never passes messages none covers.
            return "error: call save_snapshot first; every eviction saves a snapshot"
        self.finished = True
        return "ok: eviction finished"

    def save_snapshot(self, text: str) -> str:
        if not text.strip():
            return "error: text must be a non-empty string"
        words = text.split()
        # Twice the asked length, all parts together; more would crowd out other snapshots.
        limit = self.max_words * 2 - sum(len(part.split()) for part in self.snapshot_parts)
        if limit <= 0:
            return f"error: the snapshot holds the most words it may ({self.max_words * 2})"
        clipped = " ".join(words[:limit]) + (" ..." if len(words) > limit else "")
        self.snapshot_parts.append(clipped)
        return f"ok: snapshot saved ({min(len(words), limit)} words)"

    def attach(self, message_ids: list[int | str], goal_ids: list[str]) -> str:
        by_seq = {m.seq: m.id for m in self.zone}
        found = [(raw, _message_ref(raw, by_seq)) for raw in message_ids]
        messages = [mid for _, mid in found if mid is not None]
        goals = [g for g in goal_ids if g in self.goal_ids]
        self.pins += dict.fromkeys(p for p in product(messages, goals) if p not in self.pins)
        problems = [f"{what}: {', '.join(map(repr, bad))}" for what, bad in (
            ("not messages of the zone", [raw for raw, mid in found if mid is None]),
            ("not open goals", [g for g in goal_ids if g not in self.goal_ids])) if bad]
        pinned = f"pinned {len(messages)} message(s) to {len(goals)} goal(s)"
        return f"ok: {pinned}" + (f"; ignored {'; '.join(problems)}" if problems else "")


def _message_ref(raw: int | str, by_seq: dict[int, str]) -> str | None:
    """A message id from what the model wrote: a seq (int or digits, "message 12") or an id."""
    text = str(raw).strip().removeprefix("message").strip()
    if text.isdigit():
        return by_seq.get(int(text))
    return str(raw) if raw in by_seq.values() else None


NO_TOOL_CALL = (
    "error: your reply called no tool and was discarded; answer only through the tools")
NO_SNAPSHOT_DATA = (
    'error: your reply was not save_snapshot\'s arguments {"text": "<the summary>"} and was '
    "discarded")


# The forms of `tool_choice` tried in turn while no snapshot is saved, before asking for it as
# structured output (`as_data`), which a call refused with tools asks at once; any tool once
# one is saved.
SNAPSHOT_CHOICES = ("save_snapshot", REQUIRED)


def snapshot_calls(response: LLMResponse) -> list[ToolCall]:
    """A reply's tool calls asked `as_data`: its own, else `save_snapshot` with its data."""
    if response.tool_calls:
        return list(response.tool_calls)
    try:
        snapshot = read_reply(response, SaveSnapshot, "eviction")
    except ValueError:
        return []
    return [ToolCall("save_snapshot", {"text": snapshot.text})]


async def run_loop(
    llm: LLM, tools: EvictionTools, ask_round: Callable[..., LLMRequest], *, goals: bool,
    time_limit: float,
) -> tuple[str | None, Usage | None]:
    """Runs the eviction rounds through `ask_round`; returns the failure (or None) and the
    usage. `time_limit` is a first guess a slow server's requests lengthen; a snapshot saved
    before it ends is kept."""
    usage: Usage | None = None
    silent = 0
    try:
        with fail_after(time_limit, stretches=True):
            for _ in range(MAX_ROUNDS):
                if tools.snapshot_parts and not goals:
                    break  # saved, and no goal to pin a message to: nothing is left to do
                choice = REQUIRED if tools.snapshot_parts else (
                    SNAPSHOT_CHOICES[silent] if silent < len(SNAPSHOT_CHOICES) else None)
                request = ask_round(done=tools.done[-MAX_DONE:], tool_choice=choice,
                                    as_data=choice is None)
                try:
                    response = await llm.generate(request)
                except Exception as exc:
                    if tools.snapshot_parts:  # pins are optional; the snapshot covers the zone
                        log.warning("eviction: a round after the snapshot failed: %r", exc)
                        break
                    if choice is not None:
                        # A model or server without tools may still answer with data.
                        log.info("eviction asked with tools failed (%r): asked for data", exc)
                        silent = len(SNAPSHOT_CHOICES)
                        continue
                    # Whatever the model did wrong, the boundary must still move: report.
                    log.warning("eviction LLM call failed", exc_info=True)
                    return f"the eviction model failed: {exc!r}", usage
                usage = add_usage(usage, response.usage)
                calls = snapshot_calls(response) if choice is None else response.tool_calls
                if not calls:
                    if tools.snapshot_parts:
                        break  # pins are optional; the snapshot covers the zone
                    silent += 1
                    data = choice is None and reply_data(response) is not None
                    tools.done.append(NO_SNAPSHOT_DATA if data else NO_TOOL_CALL)
                    continue
                for call in calls:
                    tools.call(call)
                if tools.finished:
                    break
    except TimeoutError as exc:
        kept = " (the snapshot it saved is kept)" if tools.snapshot_parts else ""
        return f"the eviction model timed out after {allowed(exc, time_limit):g} s{kept}", usage
    if tools.snapshot_parts:
        return None, usage
    last = next((line for line in reversed(tools.done) if "error:" in line), "")
    if silent == MAX_ROUNDS and last == NO_TOOL_CALL:
        return f"the eviction model replied {MAX_ROUNDS} times without calling a tool", usage
    cause = f" (last: {last})" if last else ""
    return f"the eviction model saved no snapshot in {MAX_ROUNDS} rounds{cause}", usage
