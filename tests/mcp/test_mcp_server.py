"""`mnemo mcp`: the stdio MCP server, driven by the official SDK's own client.

No `__init__.py` in this folder: as a package, `tests/mcp` would be imported as `mcp` and
shadow the SDK.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import TextContent

from mnemo.storage.ports import is_postgres
from mnemo.tools import PAGE_CHARS
from mnemo.version import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[2]

TOOLS = {
    "recall",
    "get_node",
    "search_messages",
    "view_messages",
    "start_session",
    "append",
    "close_and_commit",
    "persist_memory",
    "recall_memory",
    "save_messages",
    "append_messages",
    "purge_thread",
    "list_repos",
    "list_sessions",
    "discard_session",
    "end_session",
    "forget",
    "correct",
    "remember",
}


async def call(session: ClientSession, tool: str, **arguments: Any) -> Any:
    """Calls a tool that must succeed; its JSON text, parsed."""
    result = await session.call_tool(tool, arguments)
    block = result.content[0]
    assert isinstance(block, TextContent)
    assert not result.is_error, block.text
    return json.loads(block.text)


async def call_failing(session: ClientSession, tool: str, **arguments: Any) -> str:
    """Calls a tool that must fail; its error message."""
    result = await session.call_tool(tool, arguments)
    block = result.content[0]
    assert isinstance(block, TextContent)
    assert result.is_error
    return block.text


@pytest.mark.slow
async def test_a_session_committed_over_mcp_is_recalled(tmp_path: Path, store: str) -> None:
    """Over stdio, on each backend: the tools are listed, a session is started, appended to
    and committed, and recall then finds it; memory files go beside a SQLite db (a store URL
    names their folder); mnemo's errors are tool errors."""
    args = ["-m", "mnemo", "mcp", "--db", store]
    files = Path(f"{store}.memory")
    if is_postgres(store):
        files = tmp_path / "files"
        args += ["--memory-dir", str(files)]
    params = StdioServerParameters(command=sys.executable, args=args, cwd=str(ROOT))
    with (tmp_path / "server.log").open("w") as errlog, anyio.fail_after(60):
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            init = await session.initialize()
            assert init.server_info.name == "mnemo"
            assert init.server_info.version == version(DISTRIBUTION)
            listed = await session.list_tools()
            assert {tool.name for tool in listed.tools} == TOOLS
            for tool in listed.tools:
                assert tool.description
                assert "\n    " not in tool.description, tool.name
            get_node = next(tool for tool in listed.tools if tool.name == "get_node")
            assert f"a page of {PAGE_CHARS:,} characters" in (get_node.description or "")

            refused = await session.call_tool("recall", {"repo": "assistant", "query": "x", "k": 0})
            assert refused.is_error
            (content,) = refused.content
            assert isinstance(content, TextContent)
            assert "\n" not in content.text
            assert "invalid arguments for recall: k:" in content.text

            started = await call(
                session, "start_session", goal="Deploy the blog", repo="assistant"
            )
            sid = started["session_id"]
            assert sid.startswith("session_")
            step = await call(
                session,
                "append",
                session_id=sid,
                observation="nginx returns 502: gunicorn listens on port 8001.",
                action="Bind gunicorn to 127.0.0.1:8000 and reload nginx.",
            )
            assert step["index"] == 0
            committed = await call(session, "close_and_commit", session_id=sid)
            assert committed["node_ids"]

            found = await call(
                session, "recall", repo="assistant", query="which port does gunicorn use?", k=5
            )
            texts = [m["node"]["text"] for m in found["memories"]]
            assert any("gunicorn" in text for text in texts), texts
            assert {m["node"]["id"] for m in found["memories"]} & set(committed["node_ids"])

            assert "unknown repo" in await call_failing(session, "recall", repo="nope", query="x")
            assert await call(session, "search_messages", query="gunicorn") == []

            filed = await call(session, "persist_memory", what="The blog runs on port 8000.")
            assert Path(filed["path"]).parent == files
            recalled = await call(session, "recall_memory", query="blog port")
            assert [f["path"] for f in recalled] == [filed["path"]]
            escape = await call_failing(
                session, "persist_memory", what="x", directory="../elsewhere"
            )
            assert "inside the memory directory" in escape
    assert is_postgres(store) or await anyio.Path(store).exists()
