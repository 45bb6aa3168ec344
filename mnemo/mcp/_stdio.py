"""The MCP server's stdio transport: one JSON-RPC message a line, and an answer to every line
(an unreadable or oversized one gets an error at once). While it runs, file descriptor 1
points at stderr, so a stray print never lands in the protocol's stream."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError, jsonrpc_message_adapter
from pydantic import ValidationError

from mnemo.tools import ERROR_CHARS, clip

# The most one request may take, over stdio as over HTTP (the SDK's default body bound).
MAX_REQUEST_BYTES = DEFAULT_MAX_REQUEST_BODY_SIZE
# JSON's tokens: a string (escapes included), a structural character, or a bare word.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')


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
