"""`Pool`: the aiohttp connection pool under every `Transport` made without a `transport=`.

Over a real socket to `ProviderServer` on 127.0.0.1.
"""

from __future__ import annotations

import gzip
import json
import logging
import sys
from collections.abc import Iterator
from types import FrameType

import anyio
import httpx
import pytest

from mnemo.adapters._http import Transport
from mnemo.adapters._pool import Pool
from mnemo.adapters.openai import Completion
from mnemo.errors import LLMError
from tests.adapters.provider_server import ProviderServer, Raw

PAYLOAD = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as s:
        yield s


def _transport(url: str, **options: object) -> Transport:
    return Transport(url, name="test provider", error=LLMError, **options)  # type: ignore[arg-type]


async def test_a_transport_without_one_given_sends_through_the_pool(
    server: ProviderServer,
) -> None:
    """A Transport made without `transport=` sends over aiohttp's pool, with its headers and
    JSON body as given."""
    async with _transport(server.openai_url,
                          headers={"authorization": "Bearer k", "x-trace": "1"}) as t:
        assert isinstance(t._client._transport, Pool)
        reply = await t.post_json("/chat/completions", PAYLOAD, Completion)
    assert reply.choices[0].message.content is not None
    (request,) = server.requests
    assert request.body == PAYLOAD
    assert request.headers["authorization"] == "Bearer k"
    assert request.headers["x-trace"] == "1"
    assert request.headers["content-type"] == "application/json"


async def test_a_request_without_headers_of_its_own_goes_out_whole(
    server: ProviderServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The path that builds a request from its path's template (no headers of the call's own)
    sends the body whole, the client's headers and httpx's, and logs the "HTTP Request" line
    httpx logs."""
    caplog.set_level(logging.INFO, logger="httpx")
    async with _transport(server.openai_url, headers={"authorization": "Bearer k"}) as t:
        for _ in range(2):
            await t.post_json("/chat/completions", PAYLOAD, Completion)
    for request in server.requests:
        assert request.body == PAYLOAD
        assert request.headers["authorization"] == "Bearer k"
        assert request.headers["content-type"] == "application/json"
        assert request.headers["user-agent"].startswith("python-httpx/")
    lines = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert lines == [f'HTTP Request: POST {server.openai_url}/chat/completions '
                     '"HTTP/1.1 200 OK"'] * 2


async def test_a_cookie_a_server_sets_is_sent_back(server: ProviderServer) -> None:
    """A reply that sets a cookie has it kept, and the next request carries it, as httpx's
    client does."""
    body = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()
    server.script(Raw(body, headers={"set-cookie": "session=abc; Path=/"}))
    async with _transport(server.openai_url) as t:
        for _ in range(2):
            await t.post_json("/chat/completions", PAYLOAD, Completion)
    first, second = server.requests
    assert "cookie" not in first.headers
    assert second.headers["cookie"] == "session=abc"
    assert second.body == PAYLOAD


async def test_a_compressed_reply_is_decoded(server: ProviderServer) -> None:
    """A gzip-encoded reply reaches the caller decoded (httpx decodes it, aiohttp does not)."""
    body = gzip.compress(json.dumps({"choices": [{"message": {"content": "zipped"}}]}).encode())
    server.script(Raw(body, headers={"content-encoding": "gzip"}))
    async with _transport(server.openai_url) as t:
        reply = await t.post_json("/chat/completions", PAYLOAD, Completion)
    assert reply.choices[0].message.content == "zipped"


async def test_a_proxy_from_the_environment_is_used(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY is honoured as httpx honours it without a transport of its own: the request
    goes to the proxy, naming the host it is for."""
    for name in ("NO_PROXY", "no_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", server.url)
    async with _transport("http://provider.invalid/v1", max_retries=0) as t:
        await t.post_json("/chat/completions", PAYLOAD, Completion)
    (request,) = server.requests
    assert request.path == "http://provider.invalid/v1/chat/completions"


async def _calls_in_one_request(t: Transport) -> int:
    """Python and C function calls on this thread while one request is sent and read."""
    count = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        await t.post_json("/chat/completions", PAYLOAD, Completion)
    finally:
        sys.setprofile(None)
    return count


async def test_a_calls_work_does_not_grow_with_the_idle_connections_held() -> None:
    """One request costs about the same client work whether the pool holds one idle
    connection or 32 (httpx's own pool probed every idle one's socket on each request and
    each reply: about 2.5 times the work at 32)."""
    with ProviderServer(latency=0.5) as server:
        async with (
            _transport(server.openai_url, max_concurrency=32, concurrency=32) as one,
            _transport(server.openai_url, max_concurrency=32, concurrency=32) as many,
        ):
            with anyio.fail_after(20):
                await one.post_json("/chat/completions", PAYLOAD, Completion)
                async with anyio.create_task_group() as tg:
                    for _ in range(32):
                        tg.start_soon(many.post_json, "/chat/completions", PAYLOAD, Completion)
                assert server.max_in_flight >= 32  # so `many` holds 32 connections
                server.latency = 0.0
                # Warmed once each, then counted.
                await one.post_json("/chat/completions", PAYLOAD, Completion)
                await many.post_json("/chat/completions", PAYLOAD, Completion)
                alone = await _calls_in_one_request(one)
                among_32 = await _calls_in_one_request(many)
    assert among_32 <= 1.2 * alone, (alone, among_32)


async def test_a_transport_call_costs_less_than_the_httpx_clients_post(
    server: ProviderServer,
) -> None:
    """A request through `Transport` (its limit, budget and reply checks included) makes
    fewer Python and C calls than `httpx.AsyncClient.post` alone makes for the same request
    over the same pool: the client's request building, auth, redirect and cookie steps are
    left out (913 calls against 1,377; 1,549 through the client)."""
    async with (
        _transport(server.openai_url) as t,
        httpx.AsyncClient(base_url=server.openai_url, transport=Pool()) as client,
    ):
        body = json.dumps(PAYLOAD).encode()
        headers = {"content-type": "application/json"}
        await t.post_json("/chat/completions", PAYLOAD, Completion)
        await client.post("/chat/completions", content=body, headers=headers)
        ours = await _calls_in_one_request(t)
        count = 0

        def profile(frame: FrameType, event: str, arg: object) -> None:
            nonlocal count
            if event in ("call", "c_call"):
                count += 1

        sys.setprofile(profile)
        try:
            await client.post("/chat/completions", content=body, headers=headers)
        finally:
            sys.setprofile(None)
    assert ours < count, (ours, count)


def test_pool_errors_are_httpx_errors() -> None:
    """Nothing listening: the pool raises httpx.ConnectError, which Transport reads as a
    refused connection."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def send() -> None:
        pool = Pool(max_connections=1)
        try:
            async with httpx.AsyncClient(transport=pool) as client:
                await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=PAYLOAD)
        finally:
            await pool.aclose()

    with pytest.raises(httpx.ConnectError):
        anyio.run(send)
