"""What a model call may spend: its task's retry budget, the deadlines of the work it serves,
and a slot of its provider's limiter (`Limits`, with the book of what the calls spent).

Every call a task makes (transport retries, adapter retries, `ask`'s re-asks and shortened
prompts) is charged to one `Budget`, shared through a context variable (`task_budget`)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

import anyio

from mnemo.config import DURATION_CEILINGS
from mnemo.errors import MAX_JSON_DEPTH, MAX_TEXT_CHARS_LIMIT, LLMError, check_count, check_seconds
from mnemo.ports import LLM, LLMRequest, LLMResponse, Usage

if TYPE_CHECKING:
    from mnemo.config import Config

# A task's seconds when its policy sets none and the work it serves has no longer deadline.
DEFAULT_SECONDS = 120.0

class Pausable(Protocol):
    """A clock that `waiting()` stops: a deadline or a retry budget."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


_OPEN: ContextVar[tuple[Pausable, ...]] = ContextVar("mnemo_deadlines", default=())


class Deadline:
    """One deadline's cancel scope, pushed back by the time calls inside it wait (and, when it
    `stretches`, by what a request inside it needs: `allow`)."""

    def __init__(self, seconds: float, *, stretches: bool = False) -> None:
        self.scope = anyio.CancelScope(deadline=anyio.current_time() + seconds)
        self.stretches = stretches
        self.granted = seconds  # the seconds allowed so far, stretches included
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
        more = seconds - self.left()
        if more > 0:
            self.granted += more
            self._left += more  # what it has left while paused
            self.scope.deadline += more  # while paused, infinite: unchanged

    def left(self) -> float:
        return self._left if self._paused else self.scope.deadline - anyio.current_time()


def remaining() -> float | None:
    """Seconds left before the nearest deadline open in this context, waits excluded."""
    left = [clock.left() for clock in _OPEN.get() if isinstance(clock, Deadline)]
    return min(left) if left else None


def allow(seconds: float) -> None:
    """Leaves every stretching deadline open in this context at least `seconds`."""
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
    """`anyio.fail_after(seconds)`, not counting the time calls inside it spend `waiting()`; with
    `stretches`, a slow server's requests lengthen `seconds` (`allow`). Raises `Expired`."""
    deadline = Deadline(seconds, stretches=stretches)
    with registered(deadline), deadline.scope:
        yield deadline.scope
    if deadline.scope.cancelled_caught and anyio.current_time() >= deadline.scope.deadline:
        raise Expired(deadline.granted)


class Expired(TimeoutError):
    """A `fail_after` deadline passed: `seconds` is the time it allowed, stretches included."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the deadline passed after {seconds:g} s")
        self.seconds = seconds


def allowed(exc: TimeoutError, seconds: float) -> float:
    """The seconds the deadline that raised `exc` allowed (`seconds` for another timeout)."""
    return exc.seconds if isinstance(exc, Expired) else seconds


@contextmanager
def waiting() -> Iterator[None]:
    """A wait for a turn inside mnemo: every deadline and budget open here stands still."""
    clocks = _OPEN.get()
    for clock in clocks:
        clock.pause()
    try:
        yield
    finally:
        for clock in clocks:
            clock.resume()


class Clock(Protocol):
    """Monotonic time and sleeping: `SystemClock` in production, a virtual one in tests."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


@dataclass(frozen=True, slots=True)
class Backoff:
    """The wait before retry n (0-based): `jitter() * min(cap, base * 2**n)`; a `Retry-After` is
    waited in full, up to `max_retry_after`."""

    base: float = 0.5
    cap: float = 20.0
    max_retry_after: float = 60.0
    jitter: Callable[[], float] = field(default=random.Random().random)

    def delay(self, failures: int, retry_after: float | None) -> float:
        """The wait after `failures` (>= 1) failed attempts: the Retry-After, else the backoff."""
        if retry_after is not None:
            return max(retry_after, 0.0)
        return self.jitter() * min(self.cap, self.base * 2.0 ** (failures - 1))

    def accepts(self, retry_after: float | None) -> bool:
        """Whether a retry may wait out the server's Retry-After."""
        return retry_after is None or retry_after <= self.max_retry_after


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """One task's budget (`max_calls` calls and `max_seconds` in all, at most `max_re_asks`
    re-asks), the backoff and the clock; `max_seconds` None is `DEFAULT_SECONDS`, or longer when
    the work served has longer left. Raises InvalidInputError for a bad value."""

    max_calls: int = 3
    max_seconds: float | None = None
    backoff: Backoff = field(default_factory=Backoff)
    clock: Clock = field(default_factory=SystemClock, compare=False)
    max_re_asks: int = 1

    def __post_init__(self) -> None:
        check_count("max_calls", self.max_calls, minimum=1)
        check_count("max_re_asks", self.max_re_asks, minimum=0)
        if self.max_seconds is not None:
            check_seconds("max_seconds", self.max_seconds, DURATION_CEILINGS["wait"])


def policy_from(
    retry: RetryPolicy | None,
    *,
    max_retries: int | None = None,
    backoff: Backoff | None = None,
    clock: Clock | None = None,
) -> RetryPolicy:
    """`retry` (default `RetryPolicy()`) with the adapters' shorthands applied."""
    policy = retry if retry is not None else RetryPolicy()
    if max_retries is not None:
        policy = replace(policy, max_calls=check_count("max_retries", max_retries) + 1)
    if backoff is not None:
        policy = replace(policy, backoff=backoff)
    return policy if clock is None else replace(policy, clock=clock)


def policy_of(llm: object) -> RetryPolicy:
    policy = getattr(llm, "retry_policy", None)
    return policy if isinstance(policy, RetryPolicy) else RetryPolicy()


Kind = Literal["retry", "re_ask"]


class Budget:
    """What one task spent of its `RetryPolicy`; its seconds stop while a call is `waiting`.
    `task_reads`, set by `ask`, is what the task checks itself, which an adapter leaves to it:
    "keys" (a JSON object's keys), "any" (any reply: prose, a bare value)."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.task_reads: Literal["keys", "any"] | None = None
        self.started = policy.clock.now()
        self.calls = self.retries = self.re_asks = 0
        self._next: Kind | None = None
        self.taken = 0  # calls a transport took up (charging those it sends)
        self._paused = 0
        self._paused_at = 0.0

    def pause(self) -> None:
        if self._paused == 0:
            self._paused_at = self.policy.clock.now()
        self._paused += 1

    def resume(self) -> None:
        self._paused -= 1
        if self._paused == 0:
            self.started += self.policy.clock.now() - self._paused_at

    def _total(self) -> float:
        if self.policy.max_seconds is not None:
            return self.policy.max_seconds
        work = remaining()
        used = self.policy.clock.now() - self.started
        return DEFAULT_SECONDS if work is None else max(DEFAULT_SECONDS, used + work)

    def seconds_left(self) -> float:
        return self._total() - (self.policy.clock.now() - self.started)

    def can_call(self) -> bool:
        return self.calls < self.policy.max_calls and self.seconds_left() > 0

    def can_re_ask(self) -> bool:
        return self.re_asks < self.policy.max_re_asks and self.can_call()

    def can_wait(self, seconds: float) -> bool:
        """Whether a call after waiting `seconds` would still be within the budget."""
        return self.calls < self.policy.max_calls and seconds < self.seconds_left()

    def next_call(self, kind: Kind) -> None:
        self._next = kind

    def charge(self, *, retry: bool = False) -> None:
        """Counts one call being sent (a retry when `retry`, else of the kind `next_call` set)."""
        kind = "retry" if retry else self._next
        self._next = None
        self.calls += 1
        self.retries += kind == "retry"
        self.re_asks += kind == "re_ask"

    def mark(self) -> tuple[int, int, int, int]:
        """The calls, retries, re-asks and calls a transport took up, for `charge_bare`."""
        return self.calls, self.retries, self.re_asks, self.taken

    def charge_bare(self, before: tuple[int, int, int, int]) -> None:
        """Charges one call if none was charged, nor taken up by a transport, since `before`
        (`mark()`): an LLM without a transport (one a transport refused unsent is no call)."""
        if self.calls == before[0] and self.taken == before[3]:
            self.charge()

    def describe(self) -> str:
        used = self.policy.clock.now() - self.started
        return (
            f"{self.calls} of {self.policy.max_calls} calls ({self.re_asks} of "
            f"{self.policy.max_re_asks} re-asks), {used:.1f} of "
            f"{self._total():g} s of the task's retry budget"
        )


_current: ContextVar[Budget | None] = ContextVar("mnemo_task_budget", default=None)


@contextmanager
def task_budget(policy: RetryPolicy) -> Iterator[Budget]:
    """The budget an outer layer opened in this context (its policy wins), else a new one."""
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


class LimitedLLM:
    """An LLM whose calls each wait for a slot of `slots` (a wait no deadline counts), whose usage
    goes to `meter`, and whose `generate` runs inside `calling()`, when given."""

    def __init__(
        self,
        llm: LLM,
        slots: anyio.CapacityLimiter,
        meter: Callable[[Usage], None] | None = None,
        calling: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> None:
        self._llm, self._slots, self._meter = llm, slots, meter
        self._calling = calling or nullcontext

    @property
    def retry_policy(self) -> RetryPolicy:
        return policy_of(self._llm)

    async def generate(self, request: LLMRequest) -> LLMResponse:
        with task_budget(self.retry_policy) as budget, self._calling():
            before, called = budget.mark(), False
            try:
                try:  # anyio's `acquire` always yields once, even with a token free
                    self._slots.acquire_nowait()
                except anyio.WouldBlock:
                    with waiting():
                        await self._slots.acquire()
                try:
                    called = True
                    response = await self._llm.generate(request)
                except LLMError as exc:
                    # Replies given up on (a `Cut`) spent their tokens all the same.
                    if isinstance(spent := getattr(exc, "usage", None), Usage):
                        self._book_tokens(spent)
                    raise
                finally:
                    self._slots.release()
            finally:
                # Booked even when the call failed (a 429 storm's calls were spent all the
                # same), not when it was cancelled waiting for its slot.
                if called:
                    budget.charge_bare(before)
                counts = Usage(calls=budget.calls - before[0], retries=budget.retries - before[1],
                               re_asks=budget.re_asks - before[2])
                self.book(counts)
        # The text whole (a JSON reply is cut only once decoded: `reply_data`), its data cut.
        response = replace(response, text=clean(response.text), data=storable(response.data))
        if response.usage is not None:  # its tokens booked, and this call's counts carried
            self._book_tokens(response.usage)
            response = replace(response, usage=replace(
                response.usage, calls=counts.calls, retries=counts.retries, re_asks=counts.re_asks))
        return response

    def book(self, usage: Usage) -> None:
        if self._meter is not None:
            self._meter(usage)

    def _book_tokens(self, usage: Usage) -> None:
        """Books a reply's tokens and cost; its calls are the budget's, booked by `generate`."""
        self.book(replace(usage, calls=0, retries=0, re_asks=0))


def clean(text: str) -> str:
    """`text` without NUL, its lone surrogates as "?" (neither backend stores them)."""
    return text.replace("\x00", "").encode("utf-8", "replace").decode()


def storable(value: Any, depth: int = 0) -> Any:
    """A reply's strings as both backends store and index them: cut to `MAX_TEXT_CHARS_LIMIT`,
    `clean`."""
    if isinstance(value, str):
        return clean(value[:MAX_TEXT_CHARS_LIMIT])
    if isinstance(value, list) and depth < MAX_JSON_DEPTH:
        return [storable(item, depth + 1) for item in value]
    if isinstance(value, dict) and depth < MAX_JSON_DEPTH:
        return {storable(k): storable(v, depth + 1) for k, v in value.items()}
    return value


def book(llm: LLM, usage: Usage) -> None:
    """Books `usage` no reply carried (what a retry saved) on `llm`'s meter, if it has one."""
    if isinstance(llm, LimitedLLM):
        llm.book(usage)


class Limits:
    """One Memory's limiters of LLM calls and the book of what the calls spent (`usage`)."""

    def __init__(self) -> None:
        self._limiters: dict[tuple[int, int], tuple[LLM, anyio.CapacityLimiter]] = {}
        self.usage = UsageBook()

    def slots(self, llm: LLM, config: Config) -> anyio.CapacityLimiter:
        """The limiter of calls to this LLM provider under configs with this `llm_concurrency`:
        each setting caps the calls made under it, and configs with the same setting share it."""
        key = (id(llm), config.llm_concurrency)
        if key not in self._limiters:  # the entry holds `llm`: its id is not reused meanwhile
            self._limiters[key] = (llm, anyio.CapacityLimiter(config.llm_concurrency))
        return self._limiters[key][1]

    def llm_for(self, llm: LLM, config: Config, repo: str, session_id: str | None = None) -> LLM:
        """`llm` within its provider's limiter under `config`, booked to the repo (and session)."""
        return LimitedLLM(llm, self.slots(llm, config),
                          lambda usage: self.usage.add(repo, session_id, usage),
                          lambda: self.usage.calling(session_id))


class UsageBook:
    """Sums the `Usage` of every LLM reply, by repo and by session, for the Memory's life."""

    def __init__(self) -> None:
        self._repos: dict[str | None, Usage] = {}  # None: conversation memory's calls
        self._sessions: dict[str, Usage] = {}
        self._active: dict[str, float] = {}
        self._calls: dict[str, int] = {}  # each session's model calls under way

    def add(self, repo: str | None, session_id: str | None, usage: Usage) -> None:
        self._repos[repo] = self._repos.get(repo, Usage()) + usage
        if session_id is not None:
            self._sessions[session_id] = self._sessions.get(session_id, Usage()) + usage
            self._active[session_id] = anyio.current_time()

    @contextmanager
    def calling(self, session_id: str | None) -> Iterator[None]:
        """Marks a model call of the session under way (`last_answer`)."""
        if session_id is None:
            yield
            return
        self._calls[session_id] = self._calls.get(session_id, 0) + 1
        try:
            yield
        finally:
            self._calls[session_id] -= 1
            if not self._calls[session_id]:
                del self._calls[session_id]

    def last_answer(self, session_id: str) -> float | None:
        """When (`anyio.current_time`) a model call of the session last ended here, now while
        one is under way; None when none did."""
        if session_id in self._calls:
            return anyio.current_time()
        return self._active.get(session_id)

    def of_repo(self, repo: str) -> Usage:
        return self._repos.get(repo, Usage())

    def of_session(self, session_id: str) -> Usage:
        return self._sessions.get(session_id, Usage())

    def total(self) -> Usage:
        return sum(self._repos.values(), Usage())
