"""The pieces of a session's async operation queue: operations, their results, and the state
projection that validates a queued operation."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio

from mnemo.errors import SessionError
from mnemo.session.machine import State

log = logging.getLogger("mnemo")

S = State


@dataclass(frozen=True, slots=True)
class OpResult:
    """What an async operation's callback receives."""

    ok: bool
    value: str | None = None
    error: SessionError | None = None


Callback = Callable[[OpResult], Awaitable[None] | None]

# What each operation reports when it succeeds.
VALUES = {
    "commit": "committed",
    "discard": "discarded",
    "start_episode": "started",
    "close": "closed",
    "append": "appended",
}


@dataclass(slots=True)
class Op:
    """One accepted async operation. `applied` is set once its state change has happened."""

    kind: str
    args: tuple[Any, ...]
    callback: Callback | None
    ticket: int | None = None
    applied: bool = False
    done: bool = field(default=False)
    # The row of an operation taken from the store whose Memory waits for it (run only while
    # still taken here: `stored.answer_abandoned`).
    stored: str | None = None


def projected_move(state: State, kind: str, *, auto_commit: bool) -> State | None:
    """Where a queued operation takes the projected state; None when it is invalid there."""
    moves: dict[tuple[State, str], State] = {
        (S.READY, "commit"): S.IDLE,
        (S.READY, "discard"): S.IDLE,
        (S.IDLE, "start_episode"): S.COLLECTING,
        (S.COLLECTING, "close"): S.IDLE if auto_commit else S.READY,
        (S.COLLECTING, "append"): S.COLLECTING,
    }
    return moves.get((state, kind))


def project(start: State, ops: Iterable[Op], *, auto_commit: bool) -> State | None:
    """The state after `ops` from `start`, or None if one of them is invalid on the way."""
    state: State | None = start
    for op in ops:
        if state is None:
            return None
        state = projected_move(state, op.kind, auto_commit=auto_commit)
    return state


async def deliver(callback: Callback | None, result: OpResult) -> None:
    """Calls a sync or async callback; an exception it raises is logged, never propagated.

    The call is shielded: a callback runs in one of the session's tasks, which `end_session`
    cancels (the callback itself may end the session), and a callback cut off at its first
    await was as good as never called; so were the callbacks after it in the same loop.
    The cancellation reaches the task at its next await after the callback."""
    if callback is None:
        return
    with anyio.CancelScope(shield=True):
        try:
            outcome = callback(result)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:
            log.exception("an operation callback failed")
