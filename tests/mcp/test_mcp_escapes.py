"""Every MCP tool's answer, as the official SDK's client receives it over stdio, holds at most
MAX_OUTPUT_CHARS characters however much its texts grow when escaped as JSON (a quote or a
backslash doubles, a control character becomes six), and says what it cut."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import TextContent

import mnemo
from mnemo.adapters.hashing import HashEmbedder
from mnemo.storage.ports import is_postgres
from mnemo.tools import MAX_OUTPUT_CHARS

ROOT = Path(__file__).resolve().parents[2]
# Nine characters that are 18 once escaped: a quote, a backslash and a control character.
ESCAPED = '"\\\x01 deploy '
NAME = "\\" * 400
THREAD = "t" + "\\" * 900


def write_files(files: Path) -> None:
    """20 memory files of escaped entries."""
    files.mkdir(parents=True, exist_ok=True)
    for i in range(20):
        (files / f"deploy-{i}.md").write_text(
            f'---\ntopic: "deploy {i}"\ndescription: "deploy"\n---\n- ' + ESCAPED * 1_000)


async def seed(store: str) -> str:
    """50 repos and 50 sessions with long escaped names and goals, 50 facts of control
    characters and a thread of 100 escaped messages; a fact's id."""
    async with mnemo.Memory(store, embedder=HashEmbedder()) as mem:
        for i in range(50):
            await mem.open_repo(f"r{i:02d}{NAME}")
            await mem.start_session(f"goal {i} " + ESCAPED * 120, repo=f"r{i:02d}{NAME}")
        await mem.open_repo("q")
        receipts = [await mem.remember("q", f"deploy fact {i} " + "\x01" * 10_000,
                                       source_id=f"s{i}", data={"note": ESCAPED * 200})
                    for i in range(50)]
        await mem.conversation().save(
            THREAD, [{"role": "user", "content": f"deploy {i} " + ESCAPED * 1_000}
                     for i in range(100)])
    return receipts[0].node_ids[0]


async def answer(session: ClientSession, tool: str, **arguments: Any) -> Any:
    """A tool's answer, checked to be bounded JSON text; parsed."""
    result = await session.call_tool(tool, arguments)
    block = result.content[0]
    assert isinstance(block, TextContent)
    assert not result.is_error, block.text[:500]
    assert len(block.text) <= MAX_OUTPUT_CHARS, (tool, len(block.text))
    return json.loads(block.text)


@pytest.mark.slow
async def test_every_answer_is_bounded_as_sent(tmp_path: Path, store: str) -> None:
    """On each backend: list_repos and list_sessions keep pages of 50 with their names and
    goals cut short (an ellipsis); recall, search_messages, view_messages and recall_memory
    cut their texts and say so; get_node pages through an escaped text to its end."""
    files = tmp_path / "files"
    write_files(files)
    node_id = await seed(store)
    params = StdioServerParameters(command=sys.executable, cwd=str(ROOT), args=[
        "-m", "mnemo", "mcp", "--db", store, "--memory-dir", str(files)])
    with (tmp_path / "server.log").open("w") as errlog, anyio.fail_after(120):
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            repos = await answer(session, "list_repos")
            assert (len(repos["repos"]), repos["next_offset"]) == (50, 50)
            assert all(name.endswith("\u2026") for name in repos["repos"])
            sessions = (await answer(session, "list_sessions"))["sessions"]
            assert len(sessions) == 50
            assert all(s["goal"].endswith("\u2026") for s in sessions)

            memories = (await answer(session, "recall", repo="q", query="deploy", k=50))[
                "memories"]
            assert memories
            assert all(m["node"]["truncated"] for m in memories)
            hits = await answer(session, "search_messages", query="deploy", limit=100)
            assert len(hits) == 100
            assert all(h["thread_id"].endswith("\u2026") for h in hits)
            view = await answer(session, "view_messages", message_id=hits[0]["message_id"],
                                radius=100)
            assert view["target"]["truncated"]
            assert view["messages_left_out"] > 0
            found = await answer(session, "recall_memory", query="deploy", limit=50)
            assert len(found) == 20
            assert all(f["truncated"] for f in found)

            whole, offset = "", 0
            while offset is not None:
                part = await answer(session, "get_node", repo="q", node_id=node_id,
                                    offset=offset)
                whole += part["text"]
                offset = part["next_offset"]
            assert whole == "deploy fact 0 " + "\x01" * 10_000
            assert part["data"] is None
            assert part["data_preview"]
    assert is_postgres(store) or await anyio.Path(store).exists()
