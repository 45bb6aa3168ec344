"""`mnemo mcp`: an MCP server (the `mcp` SDK's `MCPServer`) over a store, on stdio or
streamable HTTP (`Http`); each tool carries MCP's hints and its arguments are checked strictly.
On stdio, one JSON-RPC message a line, and an answer to every line (an unreadable or oversized
one gets an error at once); while it runs, file descriptor 1 points at stderr, so a stray print
never lands in the protocol's stream."""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import uvicorn
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server import MCPServer
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, TransportSecuritySettings
from mcp.shared.message import SessionMessage
from mcp_types import (
    INVALID_REQUEST,
    PARSE_ERROR,
    ErrorData,
    JSONRPCError,
    ToolAnnotations,
    jsonrpc_message_adapter,
)
from pydantic import AnyHttpUrl, ValidationError

from mnemo.access import check_token, hosts_of, is_loopback, same_token
from mnemo.errors import InvalidInputError
from mnemo.mcp.server import INSTRUCTIONS, TOOL_NAMES, MemoryTools
from mnemo.tools import ERROR_CHARS, clip, described
from mnemo.version import installed_version

# The most one request may take, over stdio as over HTTP (the SDK's default body bound).
MAX_REQUEST_BYTES = DEFAULT_MAX_REQUEST_BODY_SIZE
# JSON's tokens: a string (escapes included), a structural character, or a bare word.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')


# MCP's tool hints: read-only (changes nothing), destructive (may erase or overwrite what is
# stored: a correction retires a fact, a memory file drops entries), idempotent.
READ_ONLY = frozenset({"recall", "get_node", "search_messages", "view_messages", "list_repos",
                       "list_sessions", "recall_memory"})
DESTRUCTIVE = frozenset({"discard_session", "end_session", "forget", "correct",
                         "persist_memory", "purge_thread"})
IDEMPOTENT = READ_ONLY | {"save_messages", "discard_session", "end_session", "forget",
                          "purge_thread", "remember"}
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8766
PATH = "/mcp"


def validation_message(tool: str, exc: ValidationError) -> str:
    """A rejected call's arguments as one line: each field and what is wrong with it (never
    the value, which is the caller's data)."""
    problems = [
        f"{'.'.join(str(part) for part in error['loc']) or 'arguments'}: {error['msg']}"
        for error in exc.errors()]
    return clip(f"invalid arguments for {tool}: {'; '.join(problems)}", ERROR_CHARS)


def check_arguments(tool: Tool, arguments: dict[str, Any]) -> None:
    """Refuses an unknown argument or a value of another type than its parameter's (strict)
    before the tool runs, as a tool error naming the arguments (the model sees it: SEP-1303)."""
    taken = tool.parameters.get("properties", {})
    unknown = [repr(clip(name, 64)) for name in arguments if name not in taken]
    if unknown:
        raise ToolError(clip(
            f"unknown arguments for {tool.name}: {', '.join(unknown)} (it takes "
            f"{', '.join(taken)})", ERROR_CHARS))
    try:
        tool.fn_metadata.arg_model.model_validate(arguments, strict=True)
    except ValidationError as exc:
        raise ToolError(validation_message(tool.name, exc)) from exc


class _Bearer:
    """The SDK's token verifier for one shared token (`same_token`)."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def verify_token(self, token: str) -> AccessToken | None:
        if not same_token(token, self._token):
            return None
        return AccessToken(token=token, client_id="mnemo", scopes=[])


def build_server(tools: MemoryTools, *, token: str | None = None, url: str = "") -> MCPServer:
    """An `MCPServer` named "mnemo" exposing `tools`' methods (`TOOL_NAMES`), described by their
    docstrings, with hints and checked arguments; with `token`, every HTTP request must show it."""
    read_only = READ_ONLY - ({"recall", "recall_memory"} if tools.reinforce else set())
    checked = {
        name: Tool.from_function(
            getattr(tools, name), name=name,
            description=described(inspect.cleandoc(getattr(tools, name).__doc__ or "")),
            annotations=ToolAnnotations(
                read_only_hint=name in read_only, destructive_hint=name in DESTRUCTIVE,
                idempotent_hint=name in IDEMPOTENT, open_world_hint=False),
            # The result is the JSON text itself, not wrapped again.
            structured_output=False)
        for name in TOOL_NAMES}

    class _Server(MCPServer):
        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            if name in checked:
                check_arguments(checked[name], arguments)
            return await super().call_tool(name, arguments, context)

        async def run_stdio_async(self) -> None:
            # The SDK's own stdio transport leaves malformed lines unanswered (`stdio_streams`).
            low = self._lowlevel_server
            async with stdio_streams() as (read, write):
                await low.run(read, write, low.create_initialization_options())

    auth: dict[str, Any] = {}
    if token is not None:
        # No OAuth server: the issuer is named because the SDK's settings require one.
        auth = {"token_verifier": _Bearer(token),
                "auth": AuthSettings(issuer_url=AnyHttpUrl(url), resource_server_url=None)}
    return _Server("mnemo", instructions=INSTRUCTIONS, log_level="WARNING",
                   version=installed_version(), tools=list(checked.values()), **auth)


@dataclass(frozen=True, slots=True)
class Http:
    """Where `serve` answers over streamable HTTP (`http://HOST:PORT/mcp`), the `token` every
    request must show, and the Host names answered (`allow_hosts`). InvalidInputError: a bind
    beyond the loopback without a token, a malformed token or a bad allowed host."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = None
    allow_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.token is not None:
            check_token(self.token)
        elif not is_loopback(self.host):
            raise InvalidInputError(
                f"serving MCP on {self.host!r} needs a bearer token (--token or "
                "MNEMO_MCP_TOKEN): whoever reaches the port could read and erase the memory")
        names = hosts_of(self.host, self.allow_hosts)
        if any(name.startswith("*") for name in names):
            raise InvalidInputError("an allowed host is a name or an address, not a pattern")
        object.__setattr__(self, "allow_hosts", names)

    def security(self) -> TransportSecuritySettings:
        """The SDK's Host and Origin checks, allowing `allow_hosts` on any port."""
        hosts = [f"[{name}]" if ":" in name else name for name in self.allow_hosts]
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=[h for name in hosts for h in (name, f"{name}:*")],
            allowed_origins=[f"{scheme}://{h}" for name in hosts for scheme in ("http", "https")
                             for h in (name, f"{name}:*")])


class _Listener(uvicorn.Server):
    """uvicorn's server, stopped by `serve` on SIGINT or SIGTERM so the store is closed before
    the process ends."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(tools: MemoryTools, http: Http | None = None) -> None:
    """Serves MCP with `tools`, on stdin/stdout until the client closes it, or with `http`
    until interrupted."""
    if http is None:
        await build_server(tools).run_stdio_async()
        return
    shown = f"[{http.host}]" if ":" in http.host else http.host
    mcp = build_server(tools, token=http.token, url=f"http://{shown}:{http.port}")
    app = mcp.streamable_http_app(
        streamable_http_path=PATH, json_response=True, transport_security=http.security(),
        max_request_body_size=MAX_REQUEST_BYTES)
    family = socket.AF_INET6 if ":" in http.host else socket.AF_INET
    try:
        sock = socket.create_server((http.host, http.port), family=family)
    except OSError as exc:
        raise InvalidInputError(
            f"cannot listen on {http.host} port {http.port}: {exc.strerror or exc}") from exc
    lines = [f"serving MCP over streamable HTTP at http://{shown}:{sock.getsockname()[1]}{PATH}"]
    if not is_loopback(http.host):
        lines.append(
            "reachable beyond this machine; every request must show the bearer token. Host "
            f"names answered: {', '.join(http.allow_hosts)} (--allow-host adds one).")
    for line in lines:
        print(f"mnemo mcp: {line}", file=sys.stderr, flush=True)
    listener = _Listener(uvicorn.Config(app, host=http.host, port=http.port, log_level="warning"))

    async def stop_on_signal() -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                listener.should_exit = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_on_signal)
        await listener.serve(sockets=[sock])
        tg.cancel_scope.cancel()


def request_id(line: bytes) -> str | int | None:
    """The `id` a line's top-level JSON object names (a string or an integer), read without
    parsing the rest, which may nest deeper than any parser goes; None when it names none."""
    depth = 0
    tokens = _TOKEN.finditer(line)
    for match in tokens:
        token = match.group()
        if token in (b"{", b"["):
            depth += 1
        elif token in (b"}", b"]"):
            depth -= 1
        elif depth == 1 and token == b'"id"':
            colon, value = next(tokens, None), next(tokens, None)
            if colon is None or colon.group() != b":" or value is None:
                continue
            try:
                found = json.loads(value.group())
                if isinstance(found, str):
                    found.encode()  # a lone surrogate could not be written back
            except ValueError:
                return None
            return found if isinstance(found, str | int) and not isinstance(found, bool) else None
    return None


def answer(line: bytes) -> SessionMessage:
    """The line as a JSON-RPC message, or the error that answers it."""
    if len(line) > MAX_REQUEST_BYTES:
        return _error(line, INVALID_REQUEST, f"a request holds at most {MAX_REQUEST_BYTES:,} bytes")
    try:
        return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            return _error(line, PARSE_ERROR, f"Parse error: {first['msg']}")
        return _error(line, INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message")


def _error(line: bytes, code: int, message: str) -> SessionMessage:
    error = ErrorData(code=code, message=clip(message, ERROR_CHARS))
    return SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id(line), error=error))


@asynccontextmanager
async def stdio_streams() -> AsyncIterator[
    tuple[MemoryObjectReceiveStream[SessionMessage | Exception],
          MemoryObjectSendStream[SessionMessage]]]:
    """The messages read from stdin, and a stream whose messages are written to stdout, for
    as long as the block runs; a line that is no message is answered on stdout directly."""
    wire = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    stdout = anyio.wrap_file(wire)

    async def readline(limit: int) -> bytes:
        return await anyio.to_thread.run_sync(sys.stdin.buffer.readline, limit)

    inbox, messages = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    replies, outbox = anyio.create_memory_object_stream[SessionMessage](0)

    async def read(answers: MemoryObjectSendStream[SessionMessage]) -> None:
        async with inbox, answers:
            while line := await readline(MAX_REQUEST_BYTES + 1):
                if not line.strip():
                    continue
                rest = line
                while len(line) > MAX_REQUEST_BYTES and rest and not rest.endswith(b"\n"):
                    rest = await readline(MAX_REQUEST_BYTES)  # dropped, unparsed
                message = answer(line)
                target = answers if isinstance(message.message, JSONRPCError) else inbox
                await target.send(message)

    async def write() -> None:
        async with outbox:
            async for reply in outbox:
                text = reply.message.model_dump_json(by_alias=True, exclude_unset=True)
                await stdout.write(text.encode() + b"\n")
                await stdout.flush()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read, replies.clone())
            tg.start_soon(write)
            yield messages, replies
            replies.close()
    finally:
        os.dup2(wire.fileno(), 1)
        wire.close()
