"""`Limit`: how many requests one model server gets at once, adapted to the server; `RateGate`:
the client-side rate limits (requests and tokens per minute).

The limit follows TCP Vegas: a reply slower per unit of work than the fastest recent one of its
kind means a queue, and the limit drops by one; no queue grows it (slow start first). A timeout,
a 429 or 503 halves it. It stays within 1..`ceiling`, a `pinned` one never moves, and
`request_time` learns the seconds a reply token takes."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Literal

import anyio
import msgspec

from mnemo.calls.retry import Clock, waiting

# A server mnemo has not met gets this many requests at once (the adapter's ceiling if lower).
INITIAL = 2
# Recent replies of one kind, whose fastest is the baseline.
WINDOW = 32
# A kind's baseline is at most this many times the fastest reply of any kind, per unit of work.
SLACK = 1.5
# A prompt token costs this fraction of a reply token (prefill is batched, decoding is not).
PROMPT_WEIGHT = 0.1
# Reply tokens a request costs even when its reply is empty (the request's own overhead).
BASE_TOKENS = 8.0
# Requests queued ahead at or below which a reply shows no queue, at or above which the limit
# drops; a reply that used this share of its timeout drops it too.
NO_QUEUE = 0.5
QUEUE = 2.0
TIMEOUT_SHARE = 0.5
# A reply less than this many seconds slower than the fastest shows no queue (a server's jitter).
NOISE = 0.05
# A request gets this many times what its max_tokens needs at the measured speed (more than
# twice: a reply that used half its time counts as slow).
MARGIN = 3.0
# How far toward a faster measure a reply moves the speed (toward a slower one: all the way).
FOLLOW = 0.25


@dataclass(slots=True, eq=False)
class Ticket:
    """One request's slot: when it was sent, the most requests in flight while it was out."""

    kind: str
    sent: float
    in_flight: int
    epoch: int
    # "answered": a reply (any status that says nothing of load); "overloaded": a timeout, 429,
    # 503 or refused connection; "failed": anything else, no signal.
    outcome: Literal["answered", "overloaded", "failed"] = "failed"
    input_tokens: int | None = None
    output_tokens: int | None = None
    timeout: float | None = None
    max_tokens: int | None = None
    prompt_tokens: int = 0  # estimated
    timed_out: bool = False

    def answered(self, input_tokens: int | None = None, output_tokens: int | None = None) -> None:
        self.outcome = "answered"
        self.input_tokens, self.output_tokens = input_tokens, output_tokens

    def overloaded(self, *, timed_out: bool = False) -> None:
        self.outcome = "overloaded"
        self.timed_out = timed_out


class LimitState(msgspec.Struct, frozen=True):
    """What a limit learned of its server, to start from next time (`Limit.restore`)."""

    limit: Annotated[int, msgspec.Meta(ge=1)]
    slow_start: bool = False
    unit_seconds: Annotated[float, msgspec.Meta(gt=0)] | None = None


class ServerProfile(msgspec.Struct, frozen=True, omit_defaults=True):
    """What an adapter learned of its server, kept per repo and model in the store: its limit and
    speed, the structured mode "auto" settled on, the vectors' encoding it accepts."""

    concurrency: LimitState | None = None
    structured: str | None = None
    encoding: str | None = None

    def encode(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def decode(cls, stored: str) -> ServerProfile:
        """A stored profile; an unreadable one as an empty one (the server is learned again)."""
        try:
            return msgspec.json.decode(stored, type=cls)
        except msgspec.DecodeError:
            return cls()


class Limit:
    """The adaptive concurrency limit of one server (the module doc): 1..`ceiling`, or `pinned`."""

    def __init__(self, ceiling: int, *, pinned: int | None = None,
                 initial: int | None = None,
                 clock: Callable[[], float] = anyio.current_time) -> None:
        self.ceiling = ceiling
        self.pinned = pinned
        self._clock = clock
        self._limit = float(max(1, min(pinned or initial or INITIAL, ceiling)))
        self._slow_start = True
        self.in_flight = 0
        self._epoch = 0
        self._waiters: deque[anyio.Event] = deque()
        self._fastest: dict[str, deque[float]] = {}  # per kind, per unit of work
        self._sized: set[str] = set()  # the kinds whose replies reported their tokens
        self._out: set[Ticket] = set()
        self.decreases = 0
        # Seconds a unit of work takes at this server (the module doc); None: not measured.
        self.unit_seconds: float | None = None

    @property
    def current(self) -> int:
        """Requests that may be in flight now."""
        return max(1, min(self.ceiling, int(self._limit)))

    def state(self) -> LimitState:
        return LimitState(self.current, self._slow_start, self.unit_seconds)

    def restore(self, state: LimitState) -> None:
        """Starts from what an earlier limit learned (a pinned one's number stays)."""
        if self.unit_seconds is None:
            self.unit_seconds = state.unit_seconds
        if self.pinned is None:
            self._limit = float(max(1, min(state.limit, self.ceiling)))
            self._slow_start = state.slow_start
            self._wake()

    def request_time(self, max_tokens: int, prompt_tokens: int = 0) -> float | None:
        """The seconds a request gets at the measured speed; None while none is measured."""
        return None if self.unit_seconds is None else (
            MARGIN * self.unit_seconds * _size(max_tokens, prompt_tokens))

    @asynccontextmanager
    async def slot(self, kind: str, request_timeout: float | None = None, *,
                   max_tokens: int | None = None, prompt_tokens: int = 0
                   ) -> AsyncIterator[Ticket]:
        """Holds one slot for a request of `kind` (its task), waiting in line (a wait no timeout
        counts); the caller marks the ticket `answered` or `overloaded`."""
        if self.in_flight >= self.current or self._waiters:
            with waiting():
                await self._wait_turn()
        ticket = self.begin(kind, request_timeout)
        ticket.max_tokens, ticket.prompt_tokens = max_tokens, prompt_tokens
        try:
            yield ticket
        finally:
            self.end(ticket)
            self._wake()

    def begin(self, kind: str, request_timeout: float | None = None) -> Ticket:
        """Takes a slot now (the caller checked there is one)."""
        self.in_flight += 1
        for other in self._out:
            other.in_flight = max(other.in_flight, self.in_flight)
        ticket = Ticket(kind, self._clock(), self.in_flight, self._epoch,
                        timeout=request_timeout)
        self._out.add(ticket)
        return ticket

    def end(self, ticket: Ticket) -> None:
        """Gives the slot back and learns from how the request ended."""
        self.in_flight -= 1
        self._out.discard(ticket)
        self._learn(ticket, self._clock() - ticket.sent)

    async def _wait_turn(self) -> None:
        turn = anyio.Event()
        self._waiters.append(turn)
        try:
            while self.in_flight >= self.current or self._waiters[0] is not turn:
                await turn.wait()
                # An anyio Event fires once: a fresh one takes its place in the line.
                fresh = anyio.Event()
                self._waiters[self._waiters.index(turn)] = fresh
                turn = fresh
        finally:
            self._waiters.remove(turn)
            self._wake()

    def _wake(self) -> None:
        if self._waiters and self.in_flight < self.current:
            self._waiters[0].set()

    def _learn(self, ticket: Ticket, took: float) -> None:
        cost = took / self._work(ticket)
        if ticket.timed_out and ticket.timeout is not None and ticket.max_tokens is not None:
            # Its reply needed longer than it had: at least that, and twice what was thought.
            needed = ticket.timeout / _size(ticket.max_tokens, ticket.prompt_tokens)
            self.unit_seconds = max(needed, 2 * (self.unit_seconds or 0.0))
        elif ticket.outcome == "answered" and ticket.output_tokens is not None:
            known = self.unit_seconds
            self.unit_seconds = cost if known is None or cost > known else (
                known + FOLLOW * (cost - known))
        if self.pinned is not None or ticket.outcome == "failed":
            return
        if ticket.outcome == "overloaded":
            self._decrease(ticket, halve=True)
            return
        recent = self._fastest.setdefault(ticket.kind, deque(maxlen=WINDOW))
        fastest = min(recent, default=math.inf)
        if ticket.output_tokens is not None or ticket.input_tokens is not None:
            # Sized by tokens, kinds compare with each other too.
            self._sized.add(ticket.kind)
            overall = min((min(self._fastest[kind], default=math.inf) for kind in self._sized),
                          default=math.inf)
            fastest = min(fastest, SLACK * overall)
        # Only a request alone with the server may raise the baseline; others may lower it.
        if ticket.in_flight == 1 or cost < fastest:
            recent.append(cost)
        if cost <= 0 or not math.isfinite(fastest):
            return
        queued = ticket.in_flight * max(0.0, 1.0 - fastest / cost)
        if took - fastest * self._work(ticket) < NOISE:
            queued = 0.0
        slow = (ticket.timeout is not None and ticket.in_flight > 1
                and took >= TIMEOUT_SHARE * ticket.timeout)
        # As TCP Vegas, the queue tolerated grows with the log of the requests in flight.
        scale = math.log10(ticket.in_flight) if ticket.in_flight > 1 else 0.0
        if queued >= max(QUEUE, 6 * scale) or slow:
            self._decrease(ticket, halve=self._slow_start)
        # No queue grows it while more than half of it was in use (a request alone says
        # nothing of a second one), or requests wait for it.
        elif queued <= max(NO_QUEUE, scale) and (
            ticket.in_flight * 2 > self.current or self._waiters
        ):
            self._limit += 1.0 if self._slow_start else 1.0 / self._limit
            self._limit = min(self._limit, float(self.ceiling))

    def _decrease(self, ticket: Ticket, *, halve: bool) -> None:
        self._slow_start = False
        if ticket.epoch != self._epoch:
            return  # sent before the last decrease: already answered for
        self._epoch += 1
        self.decreases += 1
        self._limit = max(1.0, math.floor(self._limit / 2) if halve else self._limit - 1.0)

    @staticmethod
    def _work(ticket: Ticket) -> float:
        """The request's size in reply tokens (1 when unreported)."""
        if ticket.output_tokens is None and ticket.input_tokens is None:
            return 1.0
        return _size(ticket.output_tokens or 0, ticket.input_tokens or 0)


def _size(reply_tokens: int, prompt_tokens: int) -> float:
    """A request's size in reply tokens, its own overhead included."""
    return BASE_TOKENS + reply_tokens + PROMPT_WEIGHT * prompt_tokens


class _Bucket:
    """A token bucket of `per_minute` units up to `capacity`; its level may go negative (a debt)."""

    def __init__(self, per_minute: float, capacity: float, now: float) -> None:
        self.rate = per_minute / 60.0
        self.capacity = capacity
        self.level = capacity
        self.stamp = now

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_for(self, amount: float) -> float:
        need = min(amount, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) / self.rate


class Paused(Exception):
    """A request would wait out a pause longer than it accepts: `seconds` of it are left."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"paused for {seconds:.0f} s more")
        self.seconds = seconds


class RateGate:
    """Client-side rate limits with a shared pause after a 429; buckets hold one second of their
    rate, and callers pass in arrival order."""

    def __init__(self, *, requests_per_minute: float | None, tokens_per_minute: float | None,
                 clock: Clock) -> None:
        now = clock.now()
        self._clock = clock
        self._requests, self._tokens = (
            _Bucket(rate, max(1.0, rate / 60.0), now) if rate else None
            for rate in (requests_per_minute, tokens_per_minute))
        self._paused_until = -math.inf
        self._lock = anyio.Lock()

    @property
    def open(self) -> bool:
        """Whether `acquire` has nothing to wait for: no limits, no pause, nobody in line."""
        return self._requests is None and self._tokens is None and not self._lock.locked() \
            and self._paused_until <= self._clock.now()

    async def acquire(self, tokens: int, *, longest_pause: float = math.inf) -> None:
        """Waits until a request of about `tokens` tokens fits the limits, and takes it; raises
        `Paused` instead of waiting out a pause longer than `longest_pause` seconds (one set
        while it waits included)."""
        if self.open:
            # No trip through the event loop (anyio's Lock yields once even when free).
            return
        async with self._lock:
            while (wait := self._wait(tokens)) > 0:
                if (held := self._paused_until - self._clock.now()) > longest_pause:
                    raise Paused(held)
                await self._clock.sleep(wait)
            if self._requests is not None:
                self._requests.level -= 1
            if self._tokens is not None:
                self._tokens.level -= tokens

    def settle(self, estimated: int, actual: int) -> None:
        if self._tokens is not None:
            self._tokens.refill(self._clock.now())
            self._tokens.level = min(self._tokens.capacity, self._tokens.level + estimated - actual)

    def pause(self, seconds: float) -> None:
        """Holds every request back `seconds` from now (never shortening a longer pause)."""
        self._paused_until = max(self._paused_until, self._clock.now() + seconds)

    def _wait(self, tokens: int) -> float:
        now = self._clock.now()
        wait = self._paused_until - now
        for bucket, amount in ((self._requests, 1), (self._tokens, tokens)):
            if bucket is not None:
                bucket.refill(now)
                wait = max(wait, bucket.wait_for(amount))
        return wait
