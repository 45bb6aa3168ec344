"""The MCP tools' scopes: start_session's metadata, `where` on recall and search_messages,
and forget of a scope (in process, on each backend)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp.server.mcpserver.exceptions import ToolError

import mnemo
from mnemo.adapters.hashing import HashEmbedder
from mnemo.mcp.server import MemoryTools

REPO = "ops"


@pytest.fixture
async def mem(store: str) -> AsyncIterator[mnemo.Memory]:
    async with mnemo.Memory(store, embedder=HashEmbedder()) as m:
        await m.open_repo(REPO)
        yield m


async def test_tools_keep_to_a_scope(mem: mnemo.Memory, tmp_path: Path) -> None:
    """A session started, and messages saved or appended, with metadata are of that scope;
    recall and search_messages with where return only the scope's; forget with where erases
    it."""
    tools = MemoryTools(mem, tmp_path / "memory")
    for user in ("alice", "bob"):
        started = json.loads(await tools.start_session("deploy", REPO,
                                                       metadata={"user_id": user}))
        await tools.append(started["session_id"], f"{user}'s gunicorn binds port 8001.",
                           "Point nginx there.")
        await tools.close_and_commit(started["session_id"])  # and ends it
        await tools.save_messages(f"t-{user}", [{"role": "user", "content": "gunicorn?"}],
                                  metadata={"user_id": user})
    await tools.append_messages("t-alice", [{"role": "user", "content": "gunicorn!"}],
                                metadata={"user_id": "alice"})
    found = json.loads(await tools.recall(REPO, "gunicorn port", where={"user_id": "alice"}))
    ids = [m["node"]["id"] for m in found["memories"]]
    assert ids
    for node_id in ids:
        node = await mem.get_node(REPO, node_id)
        assert node is not None
        assert node.metadata == {"user_id": "alice"}
    hits = json.loads(await tools.search_messages("gunicorn", where={"user_id": "alice"}))
    assert [h["thread_id"] for h in hits] == ["t-alice", "t-alice"]  # both saved in scope
    with pytest.raises(ToolError, match="node_ids or source_id or where"):
        await tools.forget(REPO, source_id="x", where={"user_id": "alice"})
    assert json.loads(await tools.forget(REPO, where={"user_id": "alice"}))["forgotten"] > 0
    left = await mem.get_nodes_by_type(REPO, list(mnemo.NodeType))
    assert left
    assert {n.metadata.get("user_id") for n in left} == {"bob"}
