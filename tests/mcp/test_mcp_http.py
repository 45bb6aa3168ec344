"""`mnemo mcp --http`: the MCP server over streamable HTTP, a real server process on
127.0.0.1 started by each test, driven by the official SDK's HTTP client (sessions, edits,
concurrent calls) and by raw HTTP requests (malformed bodies, foreign Host and Origin
headers, the bearer token)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import TextContent
from typer.testing import CliRunner

import mnemo
from mnemo.cli import app
from mnemo.mcp.transport import Http
from mnemo.storage.ports import is_postgres

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "mcp-token-0123456789abcdef"
REPO = "ops"
JSON = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


@asynccontextmanager
async def served(store: str, tmp_path: Path, *options: str,
                 env: dict[str, str] | None = None) -> AsyncIterator[str]:
    """`mnemo mcp --http --port 0` on `store`, running while the block runs; its address."""
    args = [sys.executable, "-m", "mnemo", "mcp", "--db", store, "--http", "--port", "0",
            *options]
    if is_postgres(store):
        args += ["--memory-dir", str(tmp_path / "files")]
    async with await anyio.open_process(
        args, cwd=ROOT, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    ) as process, anyio.create_task_group() as tg:
        assert process.stderr is not None
        lines = BufferedByteReceiveStream(process.stderr)
        with anyio.fail_after(60):
            found = None
            while found is None:
                line = (await lines.receive_until(b"\n", 100_000)).decode()
                found = re.search(r"at (http://127\.0\.0\.1:\d+/mcp)$", line)

        async def drain() -> None:
            # The server logs each refused request; its stderr must not fill up.
            async for _ in lines:
                pass

        tg.start_soon(drain)
        try:
            yield found[1]
        finally:
            process.terminate()
            with anyio.fail_after(30):
                assert await process.wait() == 0


async def call(session: ClientSession, tool: str, **arguments: Any) -> Any:
    return await ask(session, tool, arguments)


async def ask(session: ClientSession, tool: str, arguments: dict[str, Any]) -> Any:
    result = await session.call_tool(tool, arguments)
    block = result.content[0]
    assert isinstance(block, TextContent)
    assert not result.is_error, block.text
    return json.loads(block.text)


@asynccontextmanager
async def session_on(url: str, token: str | None = None) -> AsyncIterator[ClientSession]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@pytest.mark.slow
async def test_the_sdk_client_works_a_memory_over_http(store: str, tmp_path: Path) -> None:
    """Through the SDK's streamable HTTP client, on each backend: the tools are listed with
    their hints; a session is committed and recalled; one of its facts is corrected and the
    correction forgotten; and three clients' calls at once (recalls, saves, listings, a
    session each) all answer, with what each saved there."""
    async with served(store, tmp_path) as url, session_on(url) as session:
        hints = {t.name: t.annotations for t in (await session.list_tools()).tools}
        assert [(h.read_only_hint, h.destructive_hint) if h else None for h in (
            hints["recall"], hints["forget"], hints["correct"])] == [
            (True, False), (False, True), (False, True)]
        sid = (await call(session, "start_session", goal="Deploy the blog", repo=REPO))[
            "session_id"]
        await call(session, "append", session_id=sid,
                   observation="nginx returns 502: gunicorn listens on port 8001.",
                   action="Bind gunicorn to port 8000 and reload nginx.")
        committed = (await call(session, "close_and_commit", session_id=sid))["node_ids"]
        nodes = [await call(session, "get_node", repo=REPO, node_id=n) for n in committed]
        fact = next(n for n in nodes if n["type"] == "semantic" and not n["retired"])
        corrected = await call(session, "correct", repo=REPO, node_id=fact["id"],
                               text="gunicorn listens on port 8000 on the blog host.")
        found = await call(session, "recall", repo=REPO, query="which port does gunicorn use?")
        assert corrected["node_id"] in [m["node"]["id"] for m in found["memories"]]
        assert await call(session, "forget", repo=REPO,
                          node_ids=[corrected["node_id"]]) == {"forgotten": 1}

        async def client(number: int) -> None:
            async with session_on(url) as own, anyio.create_task_group() as tg:
                thread = f"thread-{number}"
                messages = [{"role": "user", "content": f"note {number}: the backup runs"}]
                tg.start_soon(ask, own, "save_messages", {"thread_id": thread,
                                                           "messages": messages})
                for _ in range(3):
                    tg.start_soon(ask, own, "recall", {"repo": REPO, "query": "gunicorn"})
                    tg.start_soon(ask, own, "list_repos", {})
                tg.start_soon(ask, own, "start_session", {"goal": "Check", "repo": REPO})

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for number in range(3):
                    tg.start_soon(client, number)
        hits = await call(session, "search_messages", query="backup", limit=10)
        assert sorted(h["thread_id"] for h in hits) == ["thread-0", "thread-1", "thread-2"]
        assert (await call(session, "list_sessions", repo=REPO))["total"] == 3


async def post(client: httpx.AsyncClient, url: str, body: bytes | str,
               headers: dict[str, str]) -> httpx.Response:
    return await client.post(url, content=body, headers={**JSON, **headers})


@pytest.mark.slow
async def test_every_request_is_answered_and_foreign_hosts_refused(
    store: str, tmp_path: Path
) -> None:
    """Raw POSTs, on each backend: a lone surrogate, 100,000-deep JSON and a body that is not
    JSON get a JSON-RPC parse error, and JSON that is no JSON-RPC message -32602 (per-request:
    -32600), all with id null (the SDK's answers, as README states them); a body past 4 MiB a
    413 before it is parsed; "5" for an integer and an unknown argument a tool error naming
    them; on both the session protocol and the per-request one. A foreign Host
    gets 421 and a foreign Origin 403, whatever the body."""
    call = ('{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{%s"name":"recall",'
            '"arguments":%s}}')
    meta = ('"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
            '"io.modelcontextprotocol/clientCapabilities":{}},')
    async with served(store, tmp_path) as url, httpx.AsyncClient(timeout=60) as client:
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}
        opened = await post(client, url, json.dumps(init), {})
        session = {"mcp-session-id": opened.headers["mcp-session-id"],
                   "mcp-protocol-version": "2025-06-18"}
        await post(client, url, '{"jsonrpc":"2.0","method":"notifications/initialized"}',
                   session)
        per_request = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call",
                       "mcp-name": "recall"}
        for headers, envelope, invalid in ((session, "", -32602), (per_request, meta, -32600)):
            for arguments in ('{"repo":"r","query":' + "[" * 100_000 + "]" * 100_000 + "}",
                              "not JSON at all"):
                answer = await post(client, url, call % (1, envelope, arguments), headers)
                assert answer.status_code == 400
                assert (answer.json()["id"], answer.json()["error"]["code"]) == (None, -32700)
            answer = await post(client, url, '{"id": 8}', headers)
            assert answer.status_code == 400
            assert (answer.json()["id"], answer.json()["error"]["code"]) == (None, invalid)
            huge = call % (2, envelope, '{"repo":"r","query":"' + "a" * (5 << 20) + '"}')
            answer = await post(client, url, huge, headers)
            assert (answer.status_code, answer.text) == (413, "Request body too large")
            for arguments, text in (
                ('{"repo":"r","query":"x","k":"5"}', "invalid arguments for recall: k: "),
                ('{"repo":"r","query":"x","bogus":1}', "unknown arguments for recall: 'bogus'"),
                ('{"repo":"r","query":"caf\\ud800"}', None),
            ):
                answer = await post(client, url, call % (3, envelope, arguments), headers)
                reply = answer.json()
                if text is None:  # refused by the parser, or by mnemo's own check of text
                    assert reply.get("error") or reply["result"]["isError"], reply
                    continue
                assert (reply["id"], reply["result"]["isError"]) == (3, True), reply
                assert reply["result"]["content"][0]["text"].startswith(text), reply

        good = call % (4, "", '{"repo":"r","query":"x","k":"5"}')
        port = url.split(":")[2].split("/")[0]
        assert (await post(client, url, good, {**session, "Host": "evil.example"})
                ).status_code == 421
        assert (await post(client, url, good, {**session, "Host": f"evil.example:{port}"})
                ).status_code == 421
        assert (await post(client, url, good, {**session, "Origin": "http://evil.example"})
                ).status_code == 403
        assert (await post(client, url, good, {**session, "Host": f"localhost:{port}"})
                ).status_code == 200


@pytest.mark.slow
async def test_a_token_set_is_required(store: str, tmp_path: Path) -> None:
    """With MNEMO_MCP_TOKEN set, a request without the bearer token or with another one is
    refused (401) and the SDK's client showing it works the memory."""
    async with (
        served(store, tmp_path, env={"MNEMO_MCP_TOKEN": TOKEN}) as url,
        httpx.AsyncClient(timeout=60) as client,
    ):
        init = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}})
        for shown in ({}, {"Authorization": f"Bearer {TOKEN[:-1]}x"},
                      {"Authorization": TOKEN}):
            assert (await post(client, url, init, shown)).status_code == 401
        async with session_on(url, TOKEN) as session:
            assert (await call(session, "list_repos"))["repos"] == []


def test_a_bind_beyond_the_loopback_needs_a_token(tmp_path: Path) -> None:
    """`--http --host 0.0.0.0` without a token, a malformed token, a host pattern, or
    `--host` without `--http` is refused before the store is created or anything listens."""
    db = str(tmp_path / "agent.db")
    for args, message in (
        (["--http", "--host", "0.0.0.0"], "needs a bearer token"),
        (["--http", "--host", "192.168.1.5", "--token", "short"], "16 to 512 characters"),
        (["--http", "--allow-host", "*.example.org"], "not a pattern"),
        (["--host", "127.0.0.1"], "go with --http"),
    ):
        result = CliRunner().invoke(app, ["mcp", "--db", db, *args])
        assert result.exit_code == 2, result.output
        assert message in result.output
    assert not Path(db).exists()
    with pytest.raises(mnemo.InvalidInputError, match="needs a bearer token"):
        Http(host="::")
    assert Http(host="0.0.0.0", token=TOKEN).allow_hosts == ("127.0.0.1", "localhost", "::1")
    assert "mnemo.lan" in Http(allow_hosts=("Mnemo.LAN",)).allow_hosts
