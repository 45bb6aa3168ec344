"""The MCP server's memory-file tool asks the model the server was started with."""

from __future__ import annotations

import json
from pathlib import Path

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
