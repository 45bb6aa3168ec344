"""The one retry policy of model calls, and the budget each task spends.

A *task* is one thing mnemo asks of a model: one `calls.tasks.ask` (a request and the reading of
its reply), or one `generate` called on its own. Every model call made for a task is charged to
one `Budget`, whichever layer makes it, and shows in `Usage` (so in `Memory.usage()`):

| call | made by | counted in |
| --- | --- | --- |
| the first | transport (or the LLM, without one) | `calls` |
| a retry: 408/409/429/5xx, connection error, timeout, cut body | transport | `calls`, `retries` |
| a retry: a reply cut at max_tokens, asked with more room | the adapter | `calls`, `retries` |
| a retry: a prompt too long for the model's context, shortened | `ask` | `calls`, `retries` |
| a re-ask: the task could not read the reply | `ask` | `calls`, `re_asks` |

`RetryPolicy` sets the budget of one task:

| limit | default | once reached |
| --- | --- | --- |
| `max_calls` | 3 | the last failure is raised: HTTP status, or what was wrong with the reply |
| `max_re_asks` | 1 | an unusable reply after that many re-asks is raised ("re-ask once") |
| `max_seconds` | 120 (or longer: *) | no call starts and no wait begins that would end past it |

(*) Unset, a task may take as long as the work it serves has left (an extraction's, an
append's deadline: `mnemo.calls.deadline.fail_after`) when that is longer than 120 s.

The seconds do not run while a call waits for its turn inside mnemo (a concurrency slot, a
rate limit: `mnemo.calls.deadline.waiting`).

A `Retry-After` is waited in full (a retry is never sent before the server allows it), so one
past the seconds left, or past `Backoff.max_retry_after`, fails at once. Each HTTP attempt's
timeout is cut to the seconds left. A single call of an LLM without a transport is not cut short
(the caller's own `fail_after` bounds it); the budget is checked before each further call.

Layers share the budget through a context variable: `calls.tasks.ask` opens it, and the adapter's
`generate` (and `LimitedLLM`) join it instead of opening their own, so no layer multiplies
another. The policy comes from the LLM (`retry_policy`, which every adapter has), else
`RetryPolicy()`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

import anyio

from mnemo.calls import deadline
from mnemo.calls.deadline import registered
from mnemo.errors import InvalidInputError
from mnemo.inputs import check_count

# A task's seconds when its policy sets none and the work it serves has no longer deadline.
DEFAULT_SECONDS = 120.0


class Clock(Protocol):
    """Monotonic time and sleeping: `SystemClock` in production, a virtual one in tests."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """`time.monotonic` and `anyio.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait before retry number n (0-based): `jitter() * min(cap, base * 2**n)`.

    "Full jitter" spreads the retries of many callers over the whole window, so they do not hit
    a recovering provider in lockstep. A `Retry-After` header replaces the computed delay and
    is waited in full: a retry sent sooner would be refused again. `max_retry_after` is the
    longest such wait accepted; past it (or past the task's seconds) the transport gives up at
    once instead of waiting.
    """

    base: float = 0.5
    cap: float = 20.0
    max_retry_after: float = 60.0
    jitter: Callable[[], float] = field(default=random.Random().random)

    def delay(self, failures: int, retry_after: float | None) -> float:
        """The wait after `failures` failed attempts (>= 1): the server's Retry-After in full
        when it gave one (`accepts` says whether to wait it), else the computed backoff."""
        if retry_after is not None:
            return max(retry_after, 0.0)
        return self.jitter() * min(self.cap, self.base * 2.0 ** (failures - 1))

    def accepts(self, retry_after: float | None) -> bool:
        """Whether a retry may wait out the server's Retry-After (none given, or at most
        `max_retry_after`)."""
        return retry_after is None or retry_after <= self.max_retry_after


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The budget of one task (`max_calls` model calls and `max_seconds` in all, of which at
    most `max_re_asks` re-ask an unusable reply; see the module's table), the backoff between
    retries, and the clock that times both.

    Raises:
        InvalidInputError: `max_calls` below 1, `max_re_asks` below 0 or `max_seconds` not
            positive.
    """

    max_calls: int = 3
    # None: `DEFAULT_SECONDS`, or longer when the work the task serves (an extraction, an
    # append: `mnemo.calls.deadline.fail_after`) has longer left.
    max_seconds: float | None = None
    backoff: Backoff = field(default_factory=Backoff)
    clock: Clock = field(default_factory=SystemClock, compare=False)
    max_re_asks: int = 1

    def __post_init__(self) -> None:
        check_count("max_calls", self.max_calls, minimum=1)
        check_count("max_re_asks", self.max_re_asks, minimum=0)
        if self.max_seconds is not None and not (
            isinstance(self.max_seconds, int | float) and self.max_seconds > 0
        ):
            raise InvalidInputError(
                f"max_seconds must be positive or None, got {self.max_seconds!r}"
            )


def policy_from(
    retry: RetryPolicy | None,
    *,
    max_retries: int | None = None,
    backoff: Backoff | None = None,
    clock: Clock | None = None,
) -> RetryPolicy:
    """`retry` (default `RetryPolicy()`) with the adapters' shorthands applied: `max_retries`
    (calls after the first, so `max_calls = max_retries + 1`), `backoff` and `clock`.

    Raises:
        InvalidInputError: a negative `max_retries`, or a bad policy.
    """
    policy = retry if retry is not None else RetryPolicy()
    if max_retries is not None:
        if max_retries < 0:
            raise InvalidInputError(f"max_retries must be >= 0, got {max_retries!r}")
        policy = replace(policy, max_calls=max_retries + 1)
    if backoff is not None:
        policy = replace(policy, backoff=backoff)
    if clock is not None:
        policy = replace(policy, clock=clock)
    return policy


Kind = Literal["retry", "re_ask"]


class Budget:
    """What one task has spent of its `RetryPolicy`, and may still spend.

    `calls` counts every model call (first ones, retries and re-asks); `retries` and `re_asks`
    count those two kinds. A layer about to make a retry or a re-ask says so (`next_call`),
    and the layer that really sends the call `charge`s it.
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.started = policy.clock.now()
        self.calls = 0
        self.retries = 0
        self.re_asks = 0
        self._next: Kind | None = None
        self._paused = 0
        self._paused_at = 0.0

    def pause(self) -> None:
        """Stops the budget's seconds while a call waits for its turn inside mnemo
        (`mnemo.calls.deadline.waiting`): that wait is not the model's time."""
        if self._paused == 0:
            self._paused_at = self.policy.clock.now()
        self._paused += 1

    def resume(self) -> None:
        self._paused -= 1
        if self._paused == 0:
            self.started += self.policy.clock.now() - self._paused_at

    def seconds_left(self) -> float:
        if self.policy.max_seconds is not None:
            return self.policy.max_seconds - (self.policy.clock.now() - self.started)
        own = DEFAULT_SECONDS - (self.policy.clock.now() - self.started)
        work = deadline.remaining()
        return own if work is None else max(own, work)

    def can_call(self) -> bool:
        """Whether one more call is within the budget (calls and seconds)."""
        return self.calls < self.policy.max_calls and self.seconds_left() > 0

    def can_re_ask(self) -> bool:
        """Whether an unusable reply may be asked again: a re-ask left (`max_re_asks`) and a
        call within the budget."""
        return self.re_asks < self.policy.max_re_asks and self.can_call()

    def can_wait(self, seconds: float) -> bool:
        """Whether a call after waiting `seconds` would still be within the budget."""
        return self.calls < self.policy.max_calls and seconds < self.seconds_left()

    def next_call(self, kind: Kind) -> None:
        """Marks the next charged call as a retry or a re-ask."""
        self._next = kind

    def charge(self, *, retry: bool = False) -> None:
        """Counts one call being sent (a retry when `retry`, else of the marked kind)."""
        kind = "retry" if retry else self._next
        self._next = None
        self.calls += 1
        if kind == "retry":
            self.retries += 1
        elif kind == "re_ask":
            self.re_asks += 1

    def counts(self) -> tuple[int, int, int]:
        """(calls, retries, re_asks) so far."""
        return self.calls, self.retries, self.re_asks

    def charge_bare(self, before: tuple[int, int, int]) -> None:
        """Charges one call if none was charged since `before`: an LLM without a transport
        (the offline one, a test fake) made exactly one call per `generate`."""
        if self.calls == before[0]:
            self.charge()

    def describe(self) -> str:
        """The budget in words, for error messages."""
        used = self.policy.clock.now() - self.started
        total = self.policy.max_seconds
        if total is None:
            work = deadline.remaining()
            total = DEFAULT_SECONDS if work is None else max(DEFAULT_SECONDS, used + work)
        return (
            f"{self.calls} of {self.policy.max_calls} calls ({self.re_asks} of "
            f"{self.policy.max_re_asks} re-asks), {used:.1f} of "
            f"{total:g} s of the task's retry budget"
        )


_current: ContextVar[Budget | None] = ContextVar("mnemo_task_budget", default=None)


@contextmanager
def task_budget(policy: RetryPolicy) -> Iterator[Budget]:
    """The budget of the task running in this context: the one an outer layer opened (its
    policy wins), else a new one for `policy`, current until the block ends."""
    outer = _current.get()
    if outer is not None:
        yield outer
        return
    budget = Budget(policy)
    token = _current.set(budget)
    try:
        with registered(budget):
            yield budget
    finally:
        _current.reset(token)


def policy_of(llm: object) -> RetryPolicy:
    """The LLM's own `retry_policy` (every adapter has one), else the default."""
    policy = getattr(llm, "retry_policy", None)
    return policy if isinstance(policy, RetryPolicy) else RetryPolicy()
