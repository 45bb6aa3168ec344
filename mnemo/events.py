"""`Event`: what mnemo reports to an `on_event` callback, and how it is delivered."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import anyio

from mnemo.ports import JSONObject, JSONValue

log = logging.getLogger("mnemo")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened: `kind` is e.g. "transition", "step_appended",
    "trajectory_committed", "changeset_applied", "recall_executed", "session_expired"."""

    kind: str
    session_id: str | None
    repo: str | None
    data: JSONObject = field(default_factory=dict)


EventCallback = Callable[[Event], Awaitable[None] | None]


class Events:
    """Delivers events to the user's callback, in order, in the task that caused them.

    A callback that raises is logged, never propagated into the session; once called, it
    runs to its end, whatever is cancelled meanwhile.
    """

    def __init__(self, callback: EventCallback | None) -> None:
        self._callback = callback

    async def emit(
        self, kind: str, *, session_id: str | None = None, repo: str | None = None,
        **data: JSONValue,
    ) -> None:
        if self._callback is None:
            return
        await deliver(self._callback, Event(kind, session_id, repo, data), f"on_event ({kind})")


async def deliver(callback: Callable[[T], Awaitable[None] | None], value: T, what: str) -> None:
    """Calls the user's sync or async `callback` with `value`; an exception it raises is
    logged (naming `what`), never propagated.

    Shielded, as an operation's callback (`session.machine.deliver`): the task that reports may
    be cancelled by the very change it reports (an expiry ends its own session), and an async
    callback cut off at its first await never saw the value.
    """
    with anyio.CancelScope(shield=True):
        try:
            result = callback(value)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("%s callback failed", what)
