"""`Transport`: JSON over HTTP POST for every HTTP adapter, through one `httpx.AsyncClient` over
aiohttp's pool (`Pool`).

Each attempt waits (against no budget) for a slot of the concurrency limit (`Limit`) and the rate
limits (`RateGate`), then runs under a timeout. 408, 409, 429, 5xx, connection errors, timeouts
and an unreadable 2xx body are retried with backoff, honouring `Retry-After`; giving up raises
the adapter's error class naming the status and the provider's message."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from email.utils import parsedate_to_datetime
from typing import Protocol, Self, TypedDict, TypeVar, Unpack, cast

import anyio
import httpx
import msgspec

from mnemo.adapters._pool import Pool
from mnemo.adapters.limit import Limit, Paused, RateGate, Ticket
from mnemo.calls.retry import (
    Backoff,
    Budget,
    Clock,
    RetryPolicy,
    allow,
    policy_from,
    remaining,
    waiting,
)
from mnemo.errors import AdapterError, InvalidInputError, check_count
from mnemo.text import shorten

logger = logging.getLogger("mnemo.adapters")

# Statuses worth another attempt (and 5xx); any other 4xx says the request itself is wrong.
RETRY_STATUSES = frozenset({408, 409, 429})
# One attempt's seconds when the adapter sets none and the work served has no longer deadline;
# the most the server's measured speed gives.
DEFAULT_TIMEOUT = 60.0
MOST_TIMEOUT = 600.0
# A reply's (input, output) tokens, each None when the server did not say.
Tokens = tuple[int | None, int | None]
# Statuses that say the server has more than it can take: the concurrency limit drops.
OVERLOAD_STATUSES = frozenset({429, 503})
CHARS_PER_TOKEN = 4


class WireReply(Protocol):
    """A provider's reply: a msgspec struct of the fields read, and the tokens it used."""

    def tokens(self) -> Tokens: ...


R = TypeVar("R", bound=WireReply)


class Counts(msgspec.Struct):  # a reply's token counts, under each provider's names
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None


# What servers say when a prompt does not fit the model's context.
_CONTEXT_WORDS = ("context size", "context length", "context window", "exceed_context",
                  "maximum context", "too many tokens", "prompt is too long", "n_ctx")


class HTTPFailure(Exception):
    """A provider's error reply: the `__cause__` of the `AdapterError` a `Transport` raises."""

    def __init__(self, status: int, message: str) -> None:
        reason = httpx.codes.get_reason_phrase(status) or "error"
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status, self.message = status, message

    @property
    def context_overflow(self) -> bool:
        return self.status in (400, 413, 422, 500) and self.names_any(_CONTEXT_WORDS)

    def names_any(self, words: tuple[str, ...]) -> bool:
        """Whether the message names one of `words` (never for a 408 or 429)."""
        return self.status not in (408, 429) and any(word in self.message.lower() for word in words)


def parse_retry_after(headers: Mapping[str, str], *, now: float) -> float | None:
    """Seconds to wait by `retry-after-ms` or `Retry-After` (seconds or a date); None if unread."""
    if (millis := headers.get("retry-after-ms")) is not None:
        with suppress(ValueError):
            return max(float(millis) / 1000.0, 0.0)
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - now
    return max(seconds, 0.0) if math.isfinite(seconds) else None


class Closing:
    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _Retryable(Exception):  # one attempt failed in a way another attempt may fix
    def __init__(self, problem: str, cause: BaseException, *, retry_after: float | None = None,
                 timed_out: bool = False, rate_limited: bool = False) -> None:
        super().__init__(problem)
        self.problem, self.cause, self.retry_after = problem, cause, retry_after
        self.timed_out, self.rate_limited = timed_out, rate_limited


class HTTPOptions(TypedDict, total=False):
    """What every HTTP adapter passes to its `Transport`: the attempt `timeout`, rate limits,
    `max_concurrency` (8) or a pinned `concurrency`, the retry policy (`retry`, or `max_retries`,
    `backoff` and `clock`), and `transport`, which replaces the network."""

    timeout: float | None
    max_retries: int | None
    requests_per_minute: float | None
    tokens_per_minute: float | None
    max_concurrency: int
    concurrency: int | None
    transport: httpx.AsyncBaseTransport | None
    backoff: Backoff | None
    clock: Clock | None
    retry: RetryPolicy | None


class Transport(Closing):
    """JSON over HTTP POST to one provider (see the module doc), raising `error` (`timeout_error`
    when the last attempt timed out) on failure; InvalidInputError for a bad limit or policy."""

    def __init__(
        self,
        base_url: str,
        *,
        name: str,
        error: type[AdapterError],
        timeout_error: type[AdapterError] | None = None,
        headers: Mapping[str, str] | None = None,
        **options: Unpack[HTTPOptions],
    ) -> None:
        unknown = sorted(set(options) - HTTPOptions.__optional_keys__)
        if unknown:
            raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
        for label in ("timeout", "requests_per_minute", "tokens_per_minute"):
            value = cast(Mapping[str, object], options).get(label)
            if value is not None and (isinstance(value, bool) or not (
                    isinstance(value, int | float) and value > 0)):
                raise InvalidInputError(f"{label} must be positive or None, got {value!r}")
        timeout = options.get("timeout")
        most = check_count("max_concurrency", options.get("max_concurrency", 8), minimum=1)
        pinned = options.get("concurrency")
        if pinned is not None:
            check_count("concurrency", pinned, minimum=1, maximum=most,
                        setting="None adapts to the server; at most max_concurrency")
        self.name = name
        self._error = error
        self._timeout_error = timeout_error or error
        self._timeout = timeout
        self.retry_policy = policy_from(
            options.get("retry"), max_retries=options.get("max_retries"),
            backoff=options.get("backoff"), clock=options.get("clock"))
        self._backoff = self.retry_policy.backoff
        self._clock: Clock = self.retry_policy.clock
        self.limit = Limit(most, pinned=pinned)
        self._gate = RateGate(requests_per_minute=options.get("requests_per_minute"),
                              tokens_per_minute=options.get("tokens_per_minute"),
                              clock=self._clock)
        self._network = options.get("transport") or Pool(max_connections=most)
        # httpx's own timeout bounds each network phase; `fail_after` bounds the attempt.
        self._client = httpx.AsyncClient(base_url=base_url, headers=dict(headers or {}),
                                         timeout=httpx.Timeout(timeout), transport=self._network)
        # Per path, the URL, headers and timeouts `build_request` gives a POST (`_send`).
        self._templates: dict[
            str, tuple[httpx.URL, list[tuple[bytes, bytes]], dict[str, object]]] = {}

    def attempt_timeout(self, max_tokens: int | None = None, prompt_tokens: int = 0) -> float:
        """One attempt's seconds: the adapter's `timeout`, else `DEFAULT_TIMEOUT` stretched by the
        work served and the server's measured speed."""
        if self._timeout is not None:
            return self._timeout
        work = remaining()
        guess = DEFAULT_TIMEOUT if work is None else max(DEFAULT_TIMEOUT, work)
        needed = self.needed_time(max_tokens, prompt_tokens)
        return guess if needed is None else max(guess, needed)

    def needed_time(self, max_tokens: int | None, prompt_tokens: int = 0) -> float | None:
        """The seconds the measured speed says a request needs (None with a set `timeout`)."""
        if self._timeout is not None or max_tokens is None:
            return None
        needed = self.limit.request_time(max_tokens, prompt_tokens)
        return None if needed is None else min(MOST_TIMEOUT, needed)

    async def post_json(
        self,
        path: str,
        payload: Mapping[str, object],
        reply: type[R],
        *,
        budget: Budget | None = None,
        refusal: Callable[[HTTPFailure], bool] | None = None,
        kind: str = "",
    ) -> R:
        """The reply to `payload` POSTed to `path`, each attempt charged to `budget`; an error
        reply `refusal` recognises is final."""
        budget = budget if budget is not None else Budget(self.retry_policy)
        budget.taken += 1
        if not budget.can_call():
            raise self._error(f"{self.name}: no call left in {budget.describe()}")
        try:  # msgspec: a twentieth of `json.dumps`'s time
            body = _ENCODER.encode(payload)
        except msgspec.EncodeError as exc:
            raise TypeError(str(exc)) from exc
        estimate = max(1, len(body) // CHARS_PER_TOKEN)
        # The reply's cap, as the chat providers name it (embeddings have none).
        cap = payload.get("max_tokens", payload.get("max_completion_tokens"))
        max_tokens = cap if isinstance(cap, int) else None
        failures = 0
        while True:
            try:
                return await self._attempt(
                    path, body, reply, estimate, budget, refusal, kind, max_tokens,
                    retry=failures > 0,
                )
            except _Retryable as failed:
                failures += 1
                delay = self._backoff.delay(failures, failed.retry_after)
                if failed.rate_limited:
                    # Other callers hold back too: for the whole wait the server asked for (a
                    # call that will not wait that long fails at the gate).
                    self._gate.pause(delay)
                # The server's whole Retry-After: one we will not wait fails now.
                if not self._backoff.accepts(failed.retry_after):
                    raise self._give_up(
                        failed, failures, budget,
                        beyond=f"max_retry_after {self._backoff.max_retry_after:g} s",
                    ) from failed.cause
                if not budget.can_wait(delay):
                    beyond = (
                        f"the {max(budget.seconds_left(), 0.0):.1f} s left"
                        if budget.calls < budget.policy.max_calls else None
                    )
                    raise self._give_up(failed, failures, budget, beyond=beyond) from failed.cause
                logger.warning(
                    "%s: %s; retry %d in %.2fs (%s)",
                    self.name, failed.problem, failures, delay, budget.describe(),
                )
                await self._clock.sleep(delay)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _attempt(self, path: str, body: bytes, reply: type[R], estimate: int, budget: Budget,
                       refusal: Callable[[HTTPFailure], bool] | None, kind: str,
                       max_tokens: int | None, *, retry: bool) -> R:
        """One attempt, charged to `budget` once it is sent (not when the gate refuses it)."""
        allowed = self.attempt_timeout(max_tokens, estimate)
        async with self.limit.slot(kind, allowed, max_tokens=max_tokens,
                                   prompt_tokens=estimate) as ticket:
            if not self._gate.open:
                # Only a wait stops the clocks: each stop and start moves the deadlines' timers.
                with waiting():
                    try:
                        await self._gate.acquire(
                            estimate, longest_pause=self._backoff.max_retry_after)
                    except Paused as held:
                        raise self._error(
                            f"{self.name}: the provider asked to wait {held.seconds:.0f} s more"
                            " (Retry-After of an earlier request), past max_retry_after"
                            f" {self._backoff.max_retry_after:g} s") from None
            needed = self.needed_time(max_tokens, estimate)
            if needed is not None:
                # The work this request serves gives it the time the server's speed says it needs.
                allow(needed)
            # Cut to the budget's seconds only now: the waits above did not spend them.
            seconds = ticket.timeout = min(allowed, budget.seconds_left())
            budget.charge(retry=retry)
            try:
                with anyio.fail_after(seconds):
                    response = await self._send(path, body)
            except TimeoutError as exc:
                ticket.overloaded(timed_out=True)
                raise _Retryable(f"no reply within {seconds:g}s", exc, timed_out=True) from exc
            except httpx.TimeoutException as exc:
                ticket.overloaded(timed_out=True)
                raise _Retryable(f"timed out ({exc!r})", exc, timed_out=True) from exc
            except httpx.TransportError as exc:
                if isinstance(exc, httpx.ConnectError):
                    ticket.overloaded()
                raise _Retryable(f"connection failed: {exc!r}", exc) from exc
            except httpx.RequestError as exc:  # a body its encoding does not decode, ...
                raise _Retryable(f"the reply could not be read: {exc!r}", exc) from exc
            return self._read(response, reply, estimate, refusal, ticket)

    async def _send(self, path: str, body: bytes) -> httpx.Response:
        """`AsyncClient.post` of `body`, read whole, without the steps that do nothing here."""
        client = self._client
        if client.is_closed:
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        if client.cookies:
            request = client.build_request("POST", path, content=body, headers=_JSON_HEADERS)
        else:
            template = self._templates.get(path)
            if template is None:
                built = client.build_request("POST", path, headers=_JSON_HEADERS)
                raw = [(k, v) for k, v in built.headers.raw if k.lower() != b"content-length"]
                template = self._templates[path] = (built.url, raw, built.extensions)
            url, raw, extensions = template
            request = httpx.Request("POST", url, content=body, headers=raw,
                                    extensions={**extensions})
        response = await self._network.handle_async_request(request)
        response.request = request
        try:
            await response.aread()
        finally:
            await response.aclose()
        if "set-cookie" in response.headers:
            client.cookies.extract_cookies(response)
        if _HTTPX_LOG.isEnabledFor(logging.INFO):
            _HTTPX_LOG.info('HTTP Request: %s %s "%s %d %s"', request.method, request.url,
                            response.http_version, response.status_code,
                            response.reason_phrase)
        return response

    def _read(
        self,
        response: httpx.Response,
        reply: type[R],
        estimate: int,
        refusal: Callable[[HTTPFailure], bool] | None,
        ticket: Ticket,
    ) -> R:
        status = response.status_code
        if status in OVERLOAD_STATUSES:
            ticket.overloaded()
        if 200 <= status < 300:
            try:
                read = _decode(response.content, reply)
            except ValueError as exc:
                # A 2xx without the reply is cut short or garbage: another attempt may do.
                failure = HTTPFailure(status, f"{exc}: {shorten(response.text, 300)}")
                raise _Retryable(str(failure), failure) from None
            used = read.tokens()
            if used != (None, None):
                self._gate.settle(estimate, (used[0] or 0) + (used[1] or 0))
            ticket.answered(*used)
            return read
        failure = HTTPFailure(status, _error_message(response))
        if (status in RETRY_STATUSES or status >= 500) and not (refusal and refusal(failure)):
            retry_after = parse_retry_after(response.headers, now=time.time())
            raise _Retryable(
                str(failure), failure, retry_after=retry_after, rate_limited=status == 429
            )
        raise self._error(f"{self.name} refused the request: {failure}") from failure

    def _give_up(
        self, failed: _Retryable, attempts: int, budget: Budget, *, beyond: str | None = None
    ) -> AdapterError:
        error = self._timeout_error if failed.timed_out else self._error
        wait = "" if failed.retry_after is None else (
            f"; the provider asked to wait {failed.retry_after:g} s (Retry-After)"
            + ("" if beyond is None else f", past {beyond}"))
        return error(f"{self.name} failed after {attempts} attempts: {failed.problem} "
                     f"({budget.describe()}{wait})")


_JSON_HEADERS = {"content-type": "application/json"}
_HTTPX_LOG = logging.getLogger("httpx")
_ENCODER = msgspec.json.Encoder()


def _decode(content: bytes, reply: type[R]) -> R:
    """A body read as `reply` (through `json` when msgspec refuses the JSON: raw control characters,
    UTF-16); ValueError says what is wrong."""
    try:
        try:
            return msgspec.json.decode(content, type=reply, strict=False)
        except msgspec.DecodeError as exc:
            if isinstance(exc, msgspec.ValidationError):
                raise
            return msgspec.convert(json.loads(content, strict=False), reply, strict=False)
    except msgspec.ValidationError as exc:
        raise ValueError(f"the body is not the reply expected ({exc})") from None
    except ValueError:
        raise ValueError("the body is not a JSON object") from None


class _Detail(msgspec.Struct):
    message: str | None = None


class _ErrorBody(msgspec.Struct):
    error: _Detail | str | None = None
    message: str | None = None
    detail: str | None = None


def _error_message(response: httpx.Response) -> str:
    """The provider's message: at `error.message`, `error`, `message` or `detail`, else the body."""
    try:
        body = msgspec.json.decode(response.content, type=_ErrorBody)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return shorten(response.text, 300) or "(empty body)"
    error = body.error.message if isinstance(body.error, _Detail) else body.error
    return shorten(error or body.message or body.detail or response.text, 300)
