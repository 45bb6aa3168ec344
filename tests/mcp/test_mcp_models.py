"""The MCP server's memory-file tool asks the model the server was started with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp.server.mcpserver.exceptions import ToolError

import mnemo
from mnemo.adapters.hashing import HashEmbedder
from mnemo.mcp.server import MemoryTools
from tests.memoryfiles.fakes import RecordingLLM


async def test_persist_memory_uses_the_configured_model(store: str, tmp_path: Path) -> None:
    """persist_memory files the statement through the server's LLM, not the offline one."""
    llm = RecordingLLM()
    llm.reply = lambda request: {
        "topic": "web server", "description": "How the blog is served",
        "entry": "The blog runs on port 8000.",
    }
    async with mnemo.Memory(store, llm=llm, embedder=HashEmbedder()) as mem:
        tools = MemoryTools(mem, tmp_path / "memory", llm=llm)
        filed = json.loads(await tools.persist_memory("The blog runs on port 8000."))
    assert [r.task for r in llm.calls] == ["memory_persist"]
    assert filed["topic"] == "web server"


async def test_get_node_reads_a_repo_whose_embedder_the_server_cannot_run(
    store: str, tmp_path: Path
) -> None:
    """`get_node` reads no vector: a server started with another embedder than the repo's
    reads the node (it failed naming both dimensions), while `recall` still refuses."""
    async with mnemo.Memory(store, embedder=HashEmbedder(384)) as mem:
        await mem.open_repo("r")
        receipt = await mem.ingest("r", mnemo.Trajectory("notes", [
            mnemo.Step("The blog runs on port 8000.", "Note it.")]), source_id="s")
    async with mnemo.Memory(store, embedder=HashEmbedder(256)) as mem:
        tools = MemoryTools(mem, tmp_path / "memory")
        node = json.loads(await tools.get_node("r", receipt.node_ids[0]))
        assert node["id"] == receipt.node_ids[0]
        with pytest.raises(ToolError, match="dimension 384"):
            await tools.recall("r", "which port")
