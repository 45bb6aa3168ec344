"""Deadlines on model work that stop while a call waits for its turn inside mnemo.

A model call may wait inside mnemo before it is sent: for a slot of the adapter's concurrency
limit, of the repo's `Config.llm_concurrency`, or of a client-side rate limit. That wait is
mnemo's own queue, not the model's time, so it never counts against a timeout:
`fail_after(seconds)` is `anyio.fail_after` whose clock stands still while any call inside it
is `waiting()`; a task's retry budget (`mnemo.calls.retry.Budget`) registers itself the same way.
Tasks started inside a deadline share it (a context variable carries it), so an extraction's
time limit stops while any of its calls waits, and runs while one of them is being answered.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

import anyio


class Pausable(Protocol):
    """A clock that `waiting()` stops: a deadline or a retry budget."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


_OPEN: ContextVar[tuple[Pausable, ...]] = ContextVar("mnemo_deadlines", default=())


class Deadline:
    """One deadline's cancel scope, its deadline pushed back by the time calls inside it wait
    (and, when it `stretches`, by what a request inside it needs: `allow`)."""

    def __init__(self, seconds: float, *, stretches: bool = False) -> None:
        self.scope = anyio.CancelScope(deadline=anyio.current_time() + seconds)
        self.stretches = stretches
        self._paused = 0
        self._left = seconds

    def pause(self) -> None:
        if self._paused == 0:
            self._left = self.scope.deadline - anyio.current_time()
            self.scope.deadline = math.inf
        self._paused += 1

    def resume(self) -> None:
        self._paused -= 1
        if self._paused == 0:
            self.scope.deadline = anyio.current_time() + self._left

    def allow(self, seconds: float) -> None:
        """Leaves at least `seconds` before the deadline, waits excluded."""
        if self._paused:
            self._left = max(self._left, seconds)
        else:
            self.scope.deadline = max(self.scope.deadline, anyio.current_time() + seconds)

    def left(self) -> float:
        """Seconds left, not counting waits."""
        if self._paused:
            return self._left
        return self.scope.deadline - anyio.current_time()


def remaining() -> float | None:
    """Seconds left before the nearest deadline open in this context (`fail_after`), not
    counting waits; None outside any."""
    left = [clock.left() for clock in _OPEN.get() if isinstance(clock, Deadline)]
    return min(left) if left else None


def allow(seconds: float) -> None:
    """Leaves every deadline open in this context that `stretches` at least `seconds`: a
    request the server's measured speed says needs that long (`Transport.needed_time`) is not
    cut by the work it serves (a step's annotation, a trajectory's extraction), whose time
    follows the server's speed too. A deadline that does not stretch is the caller's fixed
    time."""
    for clock in _OPEN.get():
        if isinstance(clock, Deadline) and clock.stretches:
            clock.allow(seconds)


@contextmanager
def registered(clock: Pausable) -> Iterator[None]:
    """Makes `clock` stop while a call in this context (or a task started from it) waits."""
    token = _OPEN.set((*_OPEN.get(), clock))
    try:
        yield
    finally:
        _OPEN.reset(token)


@contextmanager
def fail_after(seconds: float, *, stretches: bool = False) -> Iterator[anyio.CancelScope]:
    """`anyio.fail_after(seconds)`, not counting the time calls inside it spend `waiting()`;
    with `stretches`, `seconds` is a first guess a slow server's requests lengthen (`allow`).

    Raises:
        TimeoutError: the work inside took longer than `seconds`, waits excluded.
    """
    deadline = Deadline(seconds, stretches=stretches)
    with registered(deadline), deadline.scope:
        yield deadline.scope
    if deadline.scope.cancelled_caught and anyio.current_time() >= deadline.scope.deadline:
        raise TimeoutError


@contextmanager
def waiting() -> Iterator[None]:
    """Marks a wait for a turn inside mnemo: every deadline and budget open in this context
    stands still meanwhile."""
    clocks = _OPEN.get()
    for clock in clocks:
        clock.pause()
    try:
        yield
    finally:
        for clock in clocks:
            clock.resume()
