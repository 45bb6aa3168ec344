"""The MCP tools that forget and correct memories, the hints every tool carries, and the
checks every call's arguments pass (in process, on each backend)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import TextContent

import mnemo
from mnemo.adapters.hashing import HashEmbedder
from mnemo.mcp.server import TOOL_NAMES, MemoryTools
from mnemo.mcp.transport import DESTRUCTIVE, READ_ONLY, build_server
from tests.memoryfiles.fakes import stamps

REPO = "ops"
PORT = mnemo.Step("The blog's gunicorn worker binds port 8001.", "Point nginx at port 8001.")
DISK = mnemo.Step("The backup disk of the db host is full.", "Prune the old snapshots.")


@pytest.fixture
async def mem(store: str) -> AsyncIterator[mnemo.Memory]:
    async with mnemo.Memory(store, embedder=HashEmbedder()) as m:
        await m.open_repo(REPO)
        await m.ingest(REPO, mnemo.Trajectory("Deploy the blog", [PORT]), source_id="port")
        await m.ingest(REPO, mnemo.Trajectory("Free the disk", [DISK]), source_id="disk")
        yield m


@pytest.fixture
def tools(mem: mnemo.Memory, tmp_path: Path) -> MemoryTools:
    return MemoryTools(mem, tmp_path / "memory")


async def fact_about(mem: mnemo.Memory, word: str) -> mnemo.Node:
    facts = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
    return next(f for f in facts if word in f.text and not f.retired)


async def test_purge_thread_erases_a_users_messages_that_forget_leaves(
    mem: mnemo.Memory, tools: MemoryTools
) -> None:
    """A thread saved with a user's scope is not the repo's: `forget(where=)` leaves it, and
    `purge_thread` erases it, saying how many messages went; a thread of that id then starts
    again."""
    said = [{"role": "user", "content": "My PIN is 4321 and my dog is Fluffernutter."}]
    await tools.save_messages("bob-chat", said, metadata={"user_id": "bob"})
    await tools.forget(REPO, where={"user_id": "bob"})
    assert json.loads(await tools.search_messages("Fluffernutter"))
    assert json.loads(await tools.purge_thread("bob-chat")) == {
        "thread_id": "bob-chat", "purged": 1}
    assert json.loads(await tools.search_messages("Fluffernutter")) == []
    assert await mem.conversation().raw("bob-chat") == []
    assert json.loads(await tools.purge_thread("bob-chat"))["purged"] == 0


async def test_forget_erases_nodes_or_a_source(mem: mnemo.Memory, tools: MemoryTools) -> None:
    """forget erases the nodes named, or every node of a source, and says how many went;
    without either, with both, or in an unknown repo it is a tool error that erases
    nothing."""
    fact = await fact_about(mem, "8001")
    assert json.loads(await tools.forget(REPO, node_ids=[fact.id])) == {"forgotten": 1}
    assert await mem.get_node(REPO, fact.id) is None
    disk = (await mem.ingest(REPO, mnemo.Trajectory("Free the disk", [DISK]),
                             source_id="disk")).node_ids
    with pytest.raises(ToolError, match="node_ids or source_id"):
        await tools.forget(REPO)
    with pytest.raises(ToolError, match="node_ids or source_id"):
        await tools.forget(REPO, node_ids=[disk[0]], source_id="disk")
    with pytest.raises(ToolError, match="unknown repo"):
        await tools.forget("nope", source_id="disk")
    assert json.loads(await tools.forget(REPO, source_id="disk")) == {"forgotten": len(disk)}
    assert [await mem.get_node(REPO, node_id) for node_id in disk] == [None] * len(disk)


async def test_correct_retires_the_fact_in_a_commit(
    mem: mnemo.Memory, tools: MemoryTools
) -> None:
    """correct stores the new wording, retires the old fact (recall ranks it below its
    successor), and answers with the new fact's id and the commit's, which the history
    lists; the retired fact cannot be corrected again."""
    old = await fact_about(mem, "8001")
    text = "The blog's gunicorn worker binds port 8000."
    done = json.loads(await tools.correct(REPO, old.id, text))
    assert set(done) == {"node_id", "commit_id"}
    assert (await mem.history(REPO, limit=1))[0].id == done["commit_id"]
    found = json.loads(await tools.recall(REPO, "which port does the gunicorn worker bind?"))
    ids = [m["node"]["id"] for m in found["memories"]]
    assert ids.index(done["node_id"]) < ids.index(old.id)
    with pytest.raises(ToolError, match="not a live fact"):
        await tools.correct(REPO, old.id, "The worker binds port 8002.")


async def test_remember_stores_a_fact_once_in_its_scope_and_forget_erases_it(
    mem: mnemo.Memory, tools: MemoryTools
) -> None:
    """`remember` stores a fact as given in one call; the same call again stores nothing and
    names the same fact; its scope keeps it from another user's recall; `forget` by the source
    id it returns erases it; a blank text is refused before anything is stored."""
    text = "Alice's preferred deploy window is Tuesday 10:00 UTC."
    first = json.loads(await tools.remember(REPO, text, metadata={"user_id": "alice"}))
    commits = len(await mem.history(REPO))
    again = json.loads(await tools.remember(REPO, text, metadata={"user_id": "alice"}))
    assert again == first
    assert len(await mem.history(REPO)) == commits
    node = await mem.get_node(REPO, first["node_id"])
    assert node is not None
    assert (node.text, node.type, node.metadata) == (
        text, mnemo.NodeType.SEMANTIC, {"user_id": "alice"})

    def found(recalled: str) -> list[str]:
        return [m["node"]["id"] for m in json.loads(recalled)["memories"]]

    assert first["node_id"] in found(
        await tools.recall(REPO, "deploy window", where={"user_id": "alice"}))
    assert found(await tools.recall(REPO, "deploy window", where={"user_id": "bob"})) == []
    assert json.loads(await tools.forget(REPO, source_id=first["source_id"])) == {
        "forgotten": 1}
    assert await mem.get_node(REPO, first["node_id"]) is None
    history = await mem.history(REPO)
    with pytest.raises(ToolError, match="text"):
        await tools.remember(REPO, "   ")
    assert await mem.history(REPO) == history


def hints_of(listed: Any) -> dict[str, Any]:
    return {tool.name: tool.annotations for tool in listed.tools}


async def test_every_tool_says_whether_it_reads_or_destroys(
    mem: mnemo.Memory, tmp_path: Path
) -> None:
    """Every tool carries its hints: the reads are read-only (recall only when it counts no
    access), forget and correct are destructive, the session tools write without
    destroying, and no tool reaches beyond the memory."""
    async with Client(build_server(MemoryTools(mem, tmp_path))) as client:
        hints = hints_of(await client.list_tools())
    assert set(hints) == set(TOOL_NAMES)
    assert {n for n, h in hints.items() if h.read_only_hint} == READ_ONLY
    assert {n for n, h in hints.items() if h.destructive_hint} == DESTRUCTIVE
    assert {"forget", "correct"} <= DESTRUCTIVE
    assert not hints["start_session"].read_only_hint
    assert not hints["append"].destructive_hint
    assert hints["forget"].idempotent_hint
    assert not hints["append"].idempotent_hint
    assert not any(h.open_world_hint for h in hints.values())
    async with Client(build_server(MemoryTools(mem, tmp_path, reinforce=True))) as client:
        assert not hints_of(await client.list_tools())["recall"].read_only_hint


@pytest.mark.parametrize("reinforce", [False, True])
async def test_recall_memory_writes_only_with_reinforce(
    mem: mnemo.Memory, tmp_path: Path, reinforce: bool
) -> None:
    """recall_memory, read-only, leaves every file's bytes and time as they were; with
    `--reinforce` it stamps the files it returns as used and says it writes."""
    directory = tmp_path / "memory"
    await mnemo.MemoryFiles(directory).persist("Deploys happen on Tuesdays.", llm=None)
    before = stamps(directory)
    async with Client(build_server(MemoryTools(mem, directory, reinforce=reinforce))) as client:
        hint = hints_of(await client.list_tools())["recall_memory"].read_only_hint
        found = await client.call_tool("recall_memory", {"query": "when do we deploy?"})
    (block,) = found.content
    assert isinstance(block, TextContent)
    assert "Deploys happen on Tuesdays." in block.text
    assert hint is not reinforce
    after = stamps(directory)
    (name,) = {p.name for p in directory.glob("*.md")}
    assert (after == before) is not reinforce
    assert ("\nused: " in after[name][0].decode()) is reinforce


async def error_of(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    """The text of the tool error a call is refused with (SEP-1303: a result the model reads,
    not a JSON-RPC error)."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error
    (content,) = result.content
    assert isinstance(content, TextContent)
    return content.text


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"k": "5"}, "k"),
        ({"k": True}, "k"),
        ({"k": 5.0}, "k"),
        ({"repo": 7}, "repo"),
        ({"query": ["gunicorn"]}, "query"),
    ],
)
async def test_arguments_of_another_type_are_refused_not_coerced(
    mem: mnemo.Memory, tmp_path: Path, arguments: dict[str, Any], named: str
) -> None:
    """A recall whose argument is of another type than its parameter's ("5", true or 5.0 for
    an integer, a number or a list for a string) is a tool error naming the argument; the
    same call with the right type answers."""
    call = {"repo": REPO, "query": "gunicorn port", "k": 5}
    async with Client(build_server(MemoryTools(mem, tmp_path))) as client:
        text = await error_of(client, "recall", {**call, **arguments})
        assert text.startswith(f"invalid arguments for recall: {named}: ")
        assert not (await client.call_tool("recall", call)).is_error


async def test_unknown_arguments_are_named(mem: mnemo.Memory, tmp_path: Path) -> None:
    """A call with arguments the tool does not take is a tool error naming them (and what
    the tool takes) instead of a call that drops them; a JSON string for a list is not
    parsed into one."""
    async with Client(build_server(MemoryTools(mem, tmp_path))) as client:
        text = await error_of(client, "recall", {"repo": REPO, "query": "x", "limit": 5,
                                                 "filter": {"user": "a"}})
        assert text == ("unknown arguments for recall: 'limit', 'filter' "
                        "(it takes repo, query, k, where)")
        history = json.dumps([{"role": "user", "content": "hello"}])
        text = await error_of(client, "save_messages", {"thread_id": "t", "messages": history})
        assert text.startswith("invalid arguments for save_messages: messages: ")
