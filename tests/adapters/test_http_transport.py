"""`Transport`: retries, Retry-After, timeouts, rate limits and the concurrency cap.

Over a real socket (`ProviderServer`) for the wire behaviours, over `httpx.MockTransport` where
a test must hold requests; waits go through a `VirtualClock`, so no test sleeps.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from email.utils import formatdate
from typing import Any

import anyio
import httpx
import pytest

import mnemo
from mnemo.adapters._http import HTTPFailure, Transport, parse_retry_after
from mnemo.adapters.embeddings import Embeddings
from mnemo.adapters.limit import Paused, RateGate
from mnemo.adapters.openai import Completion
from mnemo.calls.retry import Backoff, Budget, registered
from mnemo.errors import EmbeddingError, LLMError, LLMTimeout
from tests.adapters.provider_server import (
    Answer,
    AnyReply,
    Fail,
    Hangup,
    ProviderServer,
    Raw,
    Slow,
    VirtualClock,
    rate_limited,
    retry_at,
)

PAYLOAD = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as s:
        yield s


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@asynccontextmanager
async def transport(
    base_url: str, clock: VirtualClock, **options: Any
) -> AsyncIterator[Transport]:
    options.setdefault("backoff", Backoff(base=0.1, jitter=lambda: 1.0))
    options.setdefault("error", LLMError)
    async with Transport(
        base_url, name="test provider", timeout_error=LLMTimeout, clock=clock, **options
    ) as t:
        yield t


# ---- retries -------------------------------------------------------------------------------


async def test_retries_5xx_with_exponential_backoff(
    server: ProviderServer, clock: VirtualClock
) -> None:
    """500 and 502 are retried after base and 2*base delays, then the reply is returned."""
    server.script(Fail(500), Fail(502), Answer(text="hi"))
    async with transport(server.openai_url, clock) as t:
        reply = await t.post_json("/chat/completions", PAYLOAD, Completion)
    assert reply.choices[0].message.content == "hi"
    assert clock.sleeps == [0.1, 0.2]
    assert server.statuses == [500, 502, 200]


def test_backoff_is_full_jitter_capped() -> None:
    """The delay is jitter() times min(cap, base * 2**(n-1)); Retry-After replaces it in full,
    accepted up to max_retry_after."""
    backoff = Backoff(base=1.0, cap=5.0, max_retry_after=7.0, jitter=lambda: 0.25)
    assert [backoff.delay(n, None) for n in (1, 2, 3, 4, 5)] == [0.25, 0.5, 1.0, 1.25, 1.25]
    assert backoff.delay(1, 3.0) == 3.0
    assert backoff.delay(1, 100.0) == 100.0
    assert backoff.accepts(None)
    assert backoff.accepts(7.0)
    assert not backoff.accepts(7.5)


async def test_retry_after_seconds_is_honoured(server: ProviderServer, clock: VirtualClock) -> None:
    """A 429 with Retry-After: 3 waits exactly 3 s before the retry."""
    server.script(rate_limited("3"), Answer())
    async with transport(server.openai_url, clock) as t:
        await t.post_json("/chat/completions", PAYLOAD, Completion)
    assert clock.sleeps == [3.0]
    assert server.statuses == [429, 200]


async def test_retry_after_http_date_is_honoured(
    server: ProviderServer, clock: VirtualClock
) -> None:
    """A Retry-After HTTP date 30 s ahead waits about 30 s (the date has 1 s resolution)."""
    server.script(retry_at(time.time() + 30), Answer())
    async with transport(server.openai_url, clock) as t:
        await t.post_json("/chat/completions", PAYLOAD, Completion)
    assert len(clock.sleeps) == 1
    assert 28.0 <= clock.sleeps[0] <= 30.5


async def test_a_long_retry_after_is_waited_in_full(
    server: ProviderServer, clock: VirtualClock
) -> None:
    """A Retry-After of 90 s within max_retry_after and the 120 s budget: the retry goes at 90 s."""
    server.script(rate_limited("90"), Answer())
    backoff = Backoff(max_retry_after=100.0)
    async with transport(server.openai_url, clock, backoff=backoff) as t:
        await t.post_json("/chat/completions", PAYLOAD, Completion)
    assert clock.sleeps == [90.0]
    assert server.statuses == [429, 200]


async def test_retry_after_past_max_retry_after_fails_at_once(
    server: ProviderServer, clock: VirtualClock
) -> None:
    """A Retry-After of 90 s past the default 60 s max_retry_after fails at once, naming both
    (never a retry before the server allows it)."""
    server.script(rate_limited("90"), Answer())
    async with transport(server.openai_url, clock, backoff=Backoff()) as t:
        with pytest.raises(
            LLMError, match=r"HTTP 429.*wait 90 s \(Retry-After\), past max_retry_after 60 s"
        ):
            await t.post_json("/chat/completions", PAYLOAD, Completion)
    assert clock.sleeps == []
    assert server.statuses == [429]


async def test_calls_after_a_retry_after_past_the_cap_fail_at_once_until_it_is_near(
    server: ProviderServer, clock: VirtualClock
) -> None:
    """After a 429 asking for 90 s (past the 60 s max_retry_after), the next call fails at once,
    unsent, naming the wait left (it was held back 60 s, then sent before the server allowed);
    once the wait left is within the cap, a call waits it out and is sent."""
    server.script(rate_limited("90"), Answer())
    async with transport(server.openai_url, clock, backoff=Backoff()) as t:
        with pytest.raises(LLMError, match="HTTP 429"):
            await t.post_json("/chat/completions", PAYLOAD, Completion)
        with pytest.raises(LLMError, match=r"asked to wait 90 s more .*max_retry_after 60 s"):
            await t.post_json("/chat/completions", PAYLOAD, Completion)
        assert clock.sleeps == []
        assert server.statuses == [429]
        clock.time += 40
        await t.post_json("/chat/completions", PAYLOAD, Completion)
    assert clock.sleeps == [50.0]
    assert server.statuses == [429, 200]


async def test_a_call_refused_at_the_gate_charges_no_call(
    server: ProviderServer, clock: VirtualClock
) -> None:
    """A call the Retry-After gate refuses was never sent: its budget (what `usage().calls`
    counts) holds no call."""
    server.script(rate_limited("90"), Answer())
    async with transport(server.openai_url, clock, backoff=Backoff()) as t:
        sent, refused = Budget(t.retry_policy), Budget(t.retry_policy)
        with pytest.raises(LLMError, match="HTTP 429"):
            await t.post_json("/chat/completions", PAYLOAD, Completion, budget=sent)
        with pytest.raises(LLMError, match="asked to wait"):
            await t.post_json("/chat/completions", PAYLOAD, Completion, budget=refused)
    assert (sent.calls, refused.calls) == (1, 0)
    assert server.statuses == [429]


def test_parse_retry_after_forms() -> None:
    """Seconds, milliseconds and HTTP dates are read; garbage is None; the past is 0."""
    now = 1_700_000_000.0
    assert parse_retry_after({"retry-after": "2.5"}, now=now) == 2.5
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}, now=now) == 1.5
    date = formatdate(now + 12, usegmt=True)
    assert parse_retry_after({"retry-after": date}, now=now) == pytest.approx(12.0)
    assert parse_retry_after({"retry-after": formatdate(now - 60)}, now=now) == 0.0
    assert parse_retry_after({"retry-after": "soon"}, now=now) is None
    assert parse_retry_after({"retry-after": "-3"}, now=now) == 0.0
    assert parse_retry_after({}, now=now) is None


async def test_gives_up_naming_status_and_message(
    server: ProviderServer, clock: VirtualClock
) -> None:
    """After max_retries the error names the attempts, the HTTP status and the body's message."""
    server.script(*[Fail(503, "upstream overloaded")] * 3)
    async with transport(server.openai_url, clock, max_retries=2) as t:
        with pytest.raises(LLMError, match=r"3 attempts.*503.*upstream overloaded") as caught:
            await t.post_json("/chat/completions", PAYLOAD, Completion)
    assert isinstance(caught.value.__cause__, HTTPFailure)
    assert caught.value.__cause__.status == 503
    assert len(server.requests) == 3
    assert len(clock.sleeps) == 2


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_client_errors_are_not_retried(
    server: ProviderServer, clock: VirtualClock, status: int
) -> None:
    """A 4xx other than 408/409/429 fails at once, naming the status and the message."""
    server.script(Fail(status, "field 'messages' is invalid"))
    async with transport(server.openai_url, clock) as t:
        with pytest.raises(LLMError, match=rf"refused.*HTTP {status}.*field 'messages' is invalid"):
            await t.post_json("/chat/completions", PAYLOAD, Completion)
    assert len(server.requests) == 1
    assert clock.sleeps == []


@pytest.mark.parametrize("status", [408, 409, 429, 500, 529])
async def test_transient_statuses_are_retried(
    server: ProviderServer, clock: VirtualClock, status: int
) -> None:
    """408, 409, 429 and 5xx (Anthropic's 529 too) are retried."""
    server.script(Fail(status), Answer())
    async with transport(server.openai_url, clock) as t:
        await t.post_json("/chat/completions", PAYLOAD, Completion)
    assert server.statuses == [status, 200]


async def test_error_class_is_the_callers(server: ProviderServer, clock: VirtualClock) -> None:
    """An embedder's transport raises EmbeddingError."""
    server.script(Fail(500), Fail(500))
    async with transport(server.openai_url, clock, error=EmbeddingError, max_retries=1) as t:
        with pytest.raises(EmbeddingError, match="HTTP 500"):
            await t.post_json("/embeddings", {"model": "e", "input": ["x"]}, Embeddings)


async def test_ollama_style_error_body_is_read(server: ProviderServer, clock: VirtualClock) -> None:
    """A body {"error": "..."} (Ollama) gives its message."""
    server.script(Raw(json.dumps({"error": "model 'llama9' not found"}).encode(), status=404))
    async with transport(server.openai_url, clock) as t:
        with pytest.raises(LLMError, match="HTTP 404 Not Found: model 'llama9' not found"):
            await t.post_json("/chat/completions", PAYLOAD, Completion)


# ---- connection errors, timeouts, broken bodies ------------------------------------------------


async def test_dropped_connection_is_retried(server: ProviderServer, clock: VirtualClock) -> None:
    """A connection closed without a reply is retried."""
    server.script(Hangup(), Answer(text="back"))
    async with transport(server.openai_url, clock) as t:
        reply = await t.post_json("/chat/completions", PAYLOAD, Completion)
    assert reply.choices[0].message.content == "back"
    assert len(server.requests) == 2
    assert len(clock.sleeps) == 1


async def test_refused_connection_gives_up(clock: VirtualClock) -> None:
    """Nothing listening: every attempt fails to connect, then LLMError says so."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with transport(f"http://127.0.0.1:{port}/v1", clock, max_retries=2) as t:
        with pytest.raises(LLMError, match="3 attempts: connection failed"):
            await t.post_json("/chat/completions", PAYLOAD, Completion)
    assert len(clock.sleeps) == 2


async def test_timeout_is_retried_then_raises_llm_timeout(
    server: ProviderServer, clock: VirtualClock
) -> None:
    """A reply slower than `timeout` is abandoned and retried; then LLMTimeout (an LLMError)."""
    server.script(Slow(5.0), Slow(5.0))
    # Long enough for a loaded machine's server to take the connection before it is given up.
    async with transport(server.openai_url, clock, timeout=0.5, max_retries=1) as t:
        with pytest.raises(LLMTimeout, match=r"2 attempts: no reply within 0.5s") as caught:
            await t.post_json("/chat/completions", PAYLOAD, Completion)
    assert isinstance(caught.value, LLMError)
    assert isinstance(caught.value, TimeoutError)
    assert len(server.requests) == 2


async def test_slow_reply_within_timeout_is_fine(
    server: ProviderServer, clock: VirtualClock
) -> None:
    """A reply that comes before the timeout is used, with no retry."""
    server.script(Slow(0.05, Answer(text="late but fine")))
    async with transport(server.openai_url, clock, timeout=5.0) as t:
        reply = await t.post_json("/chat/completions", PAYLOAD, Completion)
    assert reply.choices[0].message.content == "late but fine"
    assert clock.sleeps == []


async def test_body_that_is_not_json_is_retried(
    server: ProviderServer, clock: VirtualClock
) -> None:
    """A 200 whose body is cut short is retried; for good, the error quotes the body."""
    server.script(Raw(b'{"choices": [{"mess'), Answer(text="whole"))
    async with transport(server.openai_url, clock, max_retries=1) as t:
        reply = await t.post_json("/chat/completions", PAYLOAD, Completion)
        assert reply.choices[0].message.content == "whole"
        server.script(Raw(b"<html>oops</html>", content_type="text/html"), Raw(b"[1, 2]"))
        with pytest.raises(LLMError, match=r"HTTP 200 OK: the body is not the reply expected "
                           r"\(Expected `object`, got `array`\): \[1, 2\]"):
            await t.post_json("/chat/completions", PAYLOAD, Completion)


async def test_a_body_its_encoding_does_not_decode_is_retried_then_an_error(
    server: ProviderServer, clock: VirtualClock
) -> None:
    """A 200 saying gzip whose body is not gzip (a broken proxy) is retried; for good, the
    adapter's error, never httpx's."""
    broken = Raw(b"not gzip at all", headers={"content-encoding": "gzip"})
    server.script(broken, Answer(text="whole"))
    async with transport(server.openai_url, clock, max_retries=1) as t:
        reply = await t.post_json("/chat/completions", PAYLOAD, Completion)
        assert reply.choices[0].message.content == "whole"
        server.script(broken, broken)
        with pytest.raises(LLMError, match=r"2 attempts: .*DecodingError"):
            await t.post_json("/chat/completions", PAYLOAD, Completion)


async def test_a_body_that_is_sloppy_but_whole_json_is_read(
    server: ProviderServer, clock: VirtualClock
) -> None:
    """A raw tab inside a string, UTF-16 and an integer past 64 bits are whole replies (read
    as `json` reads them when msgspec refuses), not cut ones: no retry."""
    for body in (b'{"choices": [{"message": {"content": "a\tb"}}]}',
                 '{"choices": [{"message": {"content": "a\\tb"}}]}'.encode("utf-16"),
                 b'{"choices": [{"message": {"content": "a\\tb"}}], "n": 123456789012345678901}'):
        server.script(Raw(body))
        async with transport(server.openai_url, clock, max_retries=0) as t:
            reply = await t.post_json("/chat/completions", PAYLOAD, Completion)
        assert reply.choices[0].message.content == "a\tb"
    assert len(server.requests) == 3


# ---- client-side rate limits ------------------------------------------------------------------


async def test_requests_per_minute_bucket() -> None:
    """rpm=120 with a one-second burst: two requests pass, the third waits 0.5 s."""
    clock = VirtualClock()
    gate = RateGate(requests_per_minute=120, tokens_per_minute=None, clock=clock)
    for _ in range(3):
        await gate.acquire(1)
    assert clock.sleeps == [0.5]


async def test_a_slow_rate_holds_one_request_and_then_waits_its_interval() -> None:
    """rpm=N below 60 holds a burst of one request: the next waits 60/N s."""
    clock = VirtualClock()
    gate = RateGate(requests_per_minute=5, tokens_per_minute=None, clock=clock)
    await gate.acquire(1)
    assert clock.sleeps == []
    await gate.acquire(1)
    assert clock.sleeps == [pytest.approx(12.0)]


async def test_tokens_per_minute_bucket_with_correction() -> None:
    """tpm=600: a big request passes a full bucket, its debt delays the next; a smaller real
    usage than estimated is refunded."""
    clock = VirtualClock()
    gate = RateGate(requests_per_minute=None, tokens_per_minute=600, clock=clock)
    await gate.acquire(100)
    assert clock.sleeps == []
    gate.settle(estimated=100, actual=40)
    await gate.acquire(5)
    # Level 10 - 100 + 60 = -30; 5 more tokens need 35 at 10 tokens/s.
    assert clock.sleeps == [pytest.approx(3.5)]


async def test_pause_holds_everyone_back() -> None:
    """After pause(2), the next request waits 2 s; a shorter pause never shortens it."""
    clock = VirtualClock()
    gate = RateGate(requests_per_minute=None, tokens_per_minute=None, clock=clock)
    gate.pause(2.0)
    gate.pause(1.0)
    await gate.acquire(1)
    assert clock.sleeps == [2.0]


async def test_a_pause_longer_than_a_caller_accepts_is_refused_even_once_waiting() -> None:
    """A caller waiting out a 30 s pause is refused (`Paused`, with the seconds left) when a
    later 429 extends the pause past the longest it accepts, instead of waiting an hour."""
    class Clock(VirtualClock):
        async def sleep(self, seconds: float) -> None:
            slept.set()
            await super().sleep(seconds)

    slept, clock = anyio.Event(), Clock()
    gate = RateGate(requests_per_minute=None, tokens_per_minute=None, clock=clock)
    gate.pause(30.0)
    refused: list[Paused] = []

    async def waiting() -> None:
        try:
            await gate.acquire(1, longest_pause=60.0)
        except Paused as exc:
            refused.append(exc)

    async def extend() -> None:  # another caller's 429, while the first one waits
        await slept.wait()
        gate.pause(3600.0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiting)
        tg.start_soon(extend)
    assert [exc.seconds for exc in refused] == [3600.0]
    assert clock.sleeps == [30.0]


def _ok_handler(usage_tokens: int) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"usage": {"total_tokens": usage_tokens}})

    return httpx.MockTransport(handle)


async def test_transport_applies_requests_per_minute(clock: VirtualClock) -> None:
    """With rpm=60 three quick calls wait 1 s before the second and the third."""
    async with transport(
        "http://provider.test", clock, requests_per_minute=60, transport=_ok_handler(1)
    ) as t:
        for _ in range(3):
            await t.post_json("/x", PAYLOAD, AnyReply)
    assert clock.sleeps == [1.0, 1.0]


@pytest.mark.parametrize(("used", "waits"), [(20, False), (1000, True)])
async def test_tokens_per_minute_uses_reported_usage(
    clock: VirtualClock, used: int, waits: bool
) -> None:
    """The reply's usage corrects the estimate: a reply that used many tokens delays the next."""

    async with transport(
        "http://provider.test", clock, tokens_per_minute=6000, transport=_ok_handler(used)
    ) as t:
        await t.post_json("/x", PAYLOAD, AnyReply)
        await t.post_json("/x", PAYLOAD, AnyReply)
    assert bool(clock.sleeps) is waits


async def test_429_pauses_without_double_waiting(clock: VirtualClock) -> None:
    """A 429's Retry-After pauses the gate; the retry itself then waits only once."""
    replies = iter(
        [httpx.Response(429, headers={"Retry-After": "2"}), httpx.Response(200, json={})]
    )
    mock = httpx.MockTransport(lambda request: next(replies))
    async with transport("http://provider.test", clock, transport=mock) as t:
        await t.post_json("/x", PAYLOAD, AnyReply)
    assert clock.sleeps == [2.0]


async def test_concurrency_cap(clock: VirtualClock) -> None:
    """With max_concurrency=2, five calls at once put exactly two in flight until released."""
    arrived = 0
    release = anyio.Event()

    async def handle(request: httpx.Request) -> httpx.Response:
        nonlocal arrived
        arrived += 1
        await release.wait()
        return httpx.Response(200, json={})

    async with (
        transport(
            "http://provider.test", clock, max_concurrency=2, transport=httpx.MockTransport(handle)
        ) as t,
        anyio.create_task_group() as tg,
    ):
        for _ in range(5):
            tg.start_soon(t.post_json, "/x", PAYLOAD, AnyReply)
        await anyio.wait_all_tasks_blocked()
        assert arrived == 2
        assert t.limit.in_flight == 2
        release.set()
    assert arrived == 5
    assert t.limit.in_flight == 0


# ---- the HTTP path's own cost --------------------------------------------------------------------


class Stops:
    """A `Pausable` that counts how often a wait stopped it."""

    def __init__(self) -> None:
        self.stops = 0

    def pause(self) -> None:
        self.stops += 1

    def resume(self) -> None:
        pass


async def test_an_attempt_that_waits_for_nothing_stops_no_clock(
    server: ProviderServer, clock: VirtualClock
) -> None:
    """A request with a free slot and an open gate stops no deadline (each stop and start
    moved the deadlines' timers on every call); one that waits for the rate limit does."""
    stops = Stops()
    with registered(stops):
        async with transport(server.openai_url, clock) as t:
            await t.post_json("/chat/completions", PAYLOAD, Completion)
        assert stops.stops == 0
        async with transport(server.openai_url, clock, requests_per_minute=60) as t:
            for _ in range(2):
                await t.post_json("/chat/completions", PAYLOAD, Completion)
        assert stops.stops >= 1


async def test_gate_without_limits_does_not_yield(clock: VirtualClock) -> None:
    """With no limits and no pause, passing the gate takes no trip through the event loop."""
    gate = RateGate(requests_per_minute=None, tokens_per_minute=None, clock=clock)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await gate.acquire(100)
    assert not scope.cancelled_caught


async def test_gate_still_waits_out_a_pause(clock: VirtualClock) -> None:
    """A 429's pause holds the next request back even with no limits configured."""
    gate = RateGate(requests_per_minute=None, tokens_per_minute=None, clock=clock)
    gate.pause(2.5)
    await gate.acquire(100)
    assert clock.sleeps == [2.5]


def test_transport_dependencies_are_declared() -> None:
    """sniffio, which httpcore imports on every pool operation, is a declared dependency."""
    import tomllib
    from pathlib import Path

    import sniffio  # noqa: F401  (importable in the environment the tests run in)

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    assert any(dep.startswith("sniffio>=") for dep in dependencies)


# ---- the keywords every HTTP adapter takes ---------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda **kw: mnemo.OpenAICompatible("m", base_url="http://x/v1", **kw),
    lambda **kw: mnemo.Anthropic("m", base_url="http://x", **kw),
    lambda **kw: mnemo.OpenAIEmbedder("m", base_url="http://x/v1", dim=4, **kw),
])
async def test_every_http_adapter_takes_the_transport_keywords(make: Any) -> None:
    """Each HTTP adapter takes each of `HTTPOptions`' keywords and hands it to its transport;
    a bad one is refused by the same check, whichever adapter it was given to."""
    clock = VirtualClock()
    backoff = Backoff(base=0.1)
    async with make(timeout=5.0, max_retries=4, requests_per_minute=60.0,
                    tokens_per_minute=1000.0, max_concurrency=3, concurrency=2,
                    transport=httpx.MockTransport(lambda _: httpx.Response(500)),
                    backoff=backoff, clock=clock, retry=None) as adapter:
        assert adapter.retry_policy.max_calls == 5
        assert adapter.retry_policy.backoff is backoff
        assert adapter.retry_policy.clock is clock
        assert (adapter.concurrency.ceiling, adapter.concurrency.current) == (3, 2)
        assert adapter.transport.attempt_timeout(100) == 5.0
    with pytest.raises(mnemo.InvalidInputError, match="concurrency must be an integer"):
        make(max_concurrency=2, concurrency=3)
    for bad in ({"timeout": True}, {"requests_per_minute": True}, {"tokens_per_minute": "9"}):
        with pytest.raises(mnemo.InvalidInputError, match="must be positive or None"):
            make(**bad)
    with pytest.raises(TypeError):
        make(timeout_seconds=5)
