"""The MCP server answers independent tool calls at once, each in a task of its own: a call
that waits (here, a recall whose query embedding is held) holds up no other call."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import anyio
from mcp import Client
from mcp.types import TextContent

import mnemo
from mnemo.mcp.server import MemoryTools
from mnemo.mcp.transport import build_server
from tests.fakes import FakeEmbedder

REPO = "r"


class HeldEmbedder(FakeEmbedder):
    """Embeds as FakeEmbedder; a text holding "slow" waits until released."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = False
        self.held = anyio.Event()
        self.released = anyio.Event()

    async def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        if self.holding and any("slow" in text for text in texts):
            self.held.set()
            await self.released.wait()
        return await super().embed(texts)


async def test_a_held_call_holds_up_no_other(store: str, tmp_path: Path) -> None:
    """While a recall waits in its embedding, a second recall, list_repos, list_sessions and
    search_messages through the same server all answer; the held recall then answers too."""
    embedder = HeldEmbedder()
    async with mnemo.Memory(store, embedder=embedder) as mem:
        await mem.open_repo(REPO)
        trajectory = mnemo.Trajectory("Deploy", [mnemo.Step("gunicorn binds 8000", "reload")])
        await mem.ingest(REPO, trajectory, source_id="s")
        server = build_server(MemoryTools(mem, tmp_path / "files"))
        async with Client(server) as client, anyio.create_task_group() as tg:
            embedder.holding = True
            answered = anyio.Event()

            async def held_recall() -> None:
                result = await client.call_tool("recall", {"repo": REPO, "query": "slow port"})
                assert not result.is_error
                answered.set()

            tg.start_soon(held_recall)
            with anyio.fail_after(10):
                await embedder.held.wait()
                for tool, arguments in [
                    ("recall", {"repo": REPO, "query": "gunicorn"}),
                    ("list_repos", {}),
                    ("list_sessions", {}),
                    ("search_messages", {"query": "gunicorn"}),
                ]:
                    result = await client.call_tool(tool, arguments)
                    block = result.content[0]
                    assert isinstance(block, TextContent)
                    assert not result.is_error, block.text
                    json.loads(block.text)
            assert not answered.is_set()
            embedder.released.set()
            with anyio.fail_after(10):
                await answered.wait()
