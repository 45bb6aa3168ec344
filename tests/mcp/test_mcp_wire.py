"""`mnemo mcp` over stdio answers every line a client writes, as raw JSON-RPC lines to a real
server process: a line it cannot read gets a JSON-RPC error carrying the request's id, a call
whose arguments are of the wrong type or unknown gets a tool error naming them, and the server
goes on answering."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from mnemo.mcp.transport import MAX_REQUEST_BYTES, request_id
from mnemo.storage.ports import is_postgres

ROOT = Path(__file__).resolve().parents[2]
INITIALIZE = {
    "jsonrpc": "2.0", "id": 0, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "raw", "version": "1"}},
}
DEEP = b"[" * 100_000 + b"]" * 100_000


def recall(request: object, arguments: str) -> bytes:
    """A tools/call of recall whose arguments are the raw JSON text given."""
    return (
        b'{"jsonrpc":"2.0","id":' + json.dumps(request).encode()
        + b',"method":"tools/call","params":{"name":"recall","arguments":'
        + arguments.encode("utf-8", "surrogatepass") + b"}}"
    )


# (line, the id of its answer, its JSON-RPC error code)
PROTOCOL_ERRORS: list[tuple[bytes, object, int]] = [
    (recall(1, '{"repo":"r","query":"caf\\ud800"}'), 1, -32700),
    # The id after 100,000 levels of nesting: found without parsing them.
    (b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"recall","arguments":'
     b'{"repo":"r","query":' + DEEP + b'}},"id":"deep"}', "deep", -32700),
    (recall(3, '{"repo":"r","query":"caf\ud800"}'), 3, -32700),  # invalid UTF-8
    (b"this is not JSON", None, -32700),
    (b'{"jsonrpc":"2.0","id":5,"method":7}', 5, -32600),
    (recall(6, '{"repo":"r","query":"' + "a" * (MAX_REQUEST_BYTES + 10) + '"}'), 6, -32600),
]
# Refused as tool errors, which the model reads (SEP-1303).
INVALID_ARGUMENTS: list[tuple[bytes, object, str]] = [
    (recall(7, '{"repo":"r","query":"x","k":"5"}'), 7, "invalid arguments for recall: k: "),
    (recall(8, '{"repo":"r","query":"x","k":true}'), 8, "invalid arguments for recall: k: "),
    (recall(9, '{"repo":"r","query":"x","bogus":1}'), 9, "unknown arguments for recall: 'bogus'"),
]


def test_the_id_is_read_from_the_top_level_only() -> None:
    """The id of a line is its top-level object's `id` member, wherever it stands: not an
    `id` key nested deeper, nor a string value "id"; none when absent or not a string or an
    integer."""
    assert request_id(b'{"method":"id","params":{"id":9},"id":"a"}') == "a"
    assert request_id(b'{"params":' + DEEP + b',"id":12}') == 12
    assert request_id(b'{"params":{"id":9}}') is None
    assert request_id(b'{"id":true}') is None
    assert request_id(b'{"id":"caf\\ud800"}') is None
    assert request_id(b"not json") is None


@pytest.mark.slow
async def test_every_line_is_answered(store: str, tmp_path: Path) -> None:
    """Over stdio, on each backend: a lone surrogate, 100,000-deep JSON, invalid UTF-8, a
    line that is not JSON, one that is not JSON-RPC and one past MAX_REQUEST_BYTES each get
    a JSON-RPC error with their id (null when the line names none); "5" or true for an
    integer and an unknown argument get tool errors naming them; the server then still
    answers."""
    args = [sys.executable, "-m", "mnemo", "mcp", "--db", store]
    if is_postgres(store):
        args += ["--memory-dir", str(tmp_path / "files")]
    with (tmp_path / "server.log").open("w") as log, anyio.fail_after(120):
        async with await anyio.open_process(
            args, cwd=ROOT, stderr=log, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        ) as process:
            assert process.stdin is not None
            assert process.stdout is not None
            stdin, replies = process.stdin, BufferedByteReceiveStream(process.stdout)

            async def ask(line: bytes) -> dict[str, Any]:
                await stdin.send(line + b"\n")
                reply: dict[str, Any] = json.loads(await replies.receive_until(b"\n", 1 << 20))
                return reply

            assert (await ask(json.dumps(INITIALIZE).encode()))["id"] == 0
            await stdin.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
            for line, request, code in PROTOCOL_ERRORS:
                reply = await ask(line)
                assert (reply["id"], reply["error"]["code"]) == (request, code), reply
            for line, request, text in INVALID_ARGUMENTS:
                reply = await ask(line)
                assert (reply["id"], reply["result"]["isError"]) == (request, True), reply
                assert reply["result"]["content"][0]["text"].startswith(text), reply
            listed = await ask(b'{"jsonrpc":"2.0","id":10,"method":"tools/call","params":'
                               b'{"name":"list_repos","arguments":{}}}')
            assert json.loads(listed["result"]["content"][0]["text"])["repos"] == []
            await stdin.aclose()
            assert await process.wait() == 0
