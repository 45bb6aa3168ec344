"""The MCP tools' answers are bounded, and what they cut can be read whole (in process)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import anyio.lowlevel
import pytest
from mcp.server.mcpserver.exceptions import ToolError

import mnemo
from mnemo.adapters.hashing import HashEmbedder
from mnemo.mcp.server import TOOL_NAMES, MemoryTools
from mnemo.storage.threads import SqlThreads
from mnemo.tools import ERROR_CHARS, MAX_OUTPUT_CHARS, SNIPPET_CHARS

REPO = "blog"
LONG = "The gunicorn worker binds port 8000 on the blog host after the deploy, " * 80


@pytest.fixture
async def mem(store: str) -> AsyncIterator[mnemo.Memory]:
    async with mnemo.Memory(store, embedder=HashEmbedder()) as m:
        await m.open_repo(REPO)
        yield m


@pytest.fixture
def tools(mem: mnemo.Memory, tmp_path: Path) -> MemoryTools:
    return MemoryTools(mem, tmp_path / "memory")


async def ingest_long_steps(mem: mnemo.Memory, n: int) -> None:
    """One trajectory of `n` long steps: as many EPISODIC nodes of about 6,000 characters."""
    steps = [
        mnemo.Step(f"Step {i}: {LONG}", f"Reload nginx after binding gunicorn, attempt {i}.")
        for i in range(n)
    ]
    await mem.ingest(REPO, mnemo.Trajectory("Deploy the blog", steps), source_id="log")


async def test_recall_is_snippets_and_ids_without_the_query(
    mem: mnemo.Memory, tools: MemoryTools
) -> None:
    """recall answers with a bounded snippet and the id of each node, never its whole text,
    and does not echo the query; the answer stays within MAX_OUTPUT_CHARS."""
    await ingest_long_steps(mem, 12)
    query = "which port does the gunicorn worker bind on the blog host " * 20
    text = await tools.recall(REPO, query, k=50)
    assert len(text) <= MAX_OUTPUT_CHARS
    answer = json.loads(text)
    assert "query" not in answer
    assert query.strip() not in text
    nodes = [m["node"] for m in answer["memories"]]
    assert nodes
    assert all(len(n["text"]) <= SNIPPET_CHARS for n in nodes)
    cut = [n for n in nodes if n["truncated"]]
    assert cut, "the long EPISODIC nodes are cut"
    assert all(n["chars"] > len(n["text"]) for n in cut)


async def test_get_node_pages_through_a_node(mem: mnemo.Memory, tools: MemoryTools) -> None:
    """get_node returns a page of a node's text; following next_offset reads all of it."""
    step = mnemo.Step(LONG * 3, "Reload nginx after binding gunicorn.")
    await mem.ingest(REPO, mnemo.Trajectory("Deploy the blog", [step]), source_id="log")
    (node,) = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
    long_id = node.id

    read, offset, pages = "", 0, 0
    while offset is not None:
        text = await tools.get_node(REPO, long_id, offset)
        assert len(text) <= MAX_OUTPUT_CHARS
        part = json.loads(text)
        assert (part["id"], part["chars"], part["offset"]) == (long_id, len(node.text), offset)
        read += part["text"]
        offset = part["next_offset"]
        pages += 1
    assert read == node.text
    assert pages == 3
    with pytest.raises(ToolError, match="unknown node"):
        await tools.get_node(REPO, "node_missing")


@pytest.mark.slow
async def test_search_and_view_are_bounded(mem: mnemo.Memory, tools: MemoryTools) -> None:
    """search_messages with many long hits, and a view of many long messages, stay within
    MAX_OUTPUT_CHARS; the view keeps the target, pages its content and counts what it left."""
    words = "backup job details " * 400
    history = [{"role": "user", "content": f"message {i}: {words}"} for i in range(100)]
    stored = await mem.conversation().save("t", history)

    hits = await tools.search_messages("backup job", limit=100)
    assert len(hits) <= MAX_OUTPUT_CHARS
    assert len(json.loads(hits)) == 100

    target = stored[50]
    text = await tools.view_messages(target.id, radius=100)
    assert len(text) <= MAX_OUTPUT_CHARS
    view = json.loads(text)
    assert view["target"]["id"] == target.id
    assert view["target"]["chars"] == len(target.content)
    shown = [m["seq"] for m in view["messages"]]
    assert 50 in shown
    assert shown == sorted(shown)
    assert view["messages_left_out"] == 100 - len(shown) > 0
    rest = json.loads(await tools.view_messages(target.id, radius=0, offset=5_000))
    assert rest["target"]["content"] == target.content[5_000:13_000]


async def test_persist_memory_shows_what_bounding_cost(
    mem: mnemo.Memory, tmp_path: Path
) -> None:
    """persist_memory reports dropped, condensed and cut entries; with memory updates off it
    writes nothing and says so."""
    tools = MemoryTools(mem, tmp_path / "memory")
    first = json.loads(await tools.persist_memory("The staging cluster has three nodes."))
    assert (first["dropped"], first["condensed"], first["skipped"]) == ([], False, None)
    long = "The staging cluster deploy checklist: " + "verify the canary, " * 300
    second = json.loads(await tools.persist_memory(long))
    assert second["condensed"]
    assert second["dropped_count"] == len(second["dropped"]) >= 1
    assert len(json.dumps(second)) <= MAX_OUTPUT_CHARS

    off = MemoryTools(mem, tmp_path / "off", memory_updates=False)
    skipped = json.loads(await off.persist_memory("The staging cluster has three nodes."))
    assert skipped["skipped"] == "disabled"
    assert not (tmp_path / "off").exists()


async def test_errors_quoting_huge_input_are_clipped(tools: MemoryTools) -> None:
    """A MnemoError whose message quotes a huge input reaches the agent clipped."""
    with pytest.raises(ToolError) as caught:
        await tools.recall(REPO, " " * 100_000)
    assert len(str(caught.value)) <= ERROR_CHARS


def test_get_node_is_a_tool() -> None:
    """get_node is served next to recall."""
    assert "get_node" in TOOL_NAMES


def test_the_cli_switch_turns_memory_updates_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mnemo mcp --no-memory-updates` serves with memory-file writes off."""
    from typer.testing import CliRunner

    import mnemo.mcp.transport
    from mnemo.cli import app

    seen: list[bool] = []

    async def fake_serve(tools: MemoryTools, http: object = None) -> None:
        seen.append(tools.memory_updates)

    monkeypatch.setattr(mnemo.mcp.transport, "serve", fake_serve)
    db = str(tmp_path / "agent.db")
    for args in (["mcp", "--db", db, "--no-memory-updates"], ["mcp", "--db", db]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
    assert seen == [False, True]


# ---- conversation, repos and sessions ------------------------------------------------------------


async def test_save_messages_appends_only_the_new_ones(tools: MemoryTools) -> None:
    """save_messages takes the whole history; saving it again adds nothing, and the saved
    messages are found by search_messages."""
    history = [
        {"role": "user", "content": "Why does nginx return 502?"},
        {"role": "assistant", "content": "gunicorn listens on port 8001."},
    ]
    first = json.loads(await tools.save_messages("t1", history))
    assert first == {"thread_id": "t1", "added": 2, "messages": 2}
    longer = [*history, {"role": "user", "content": "ok"}]
    again = json.loads(await tools.save_messages("t1", longer))
    assert again == {"thread_id": "t1", "added": 1, "messages": 3}
    hits = json.loads(await tools.search_messages("gunicorn"))
    assert [h["thread_id"] for h in hits] == ["t1"]


async def test_save_and_append_count_the_thread_without_reading_it(
    tools: MemoryTools, monkeypatch: pytest.MonkeyPatch
) -> None:
    """save_messages and append_messages report the thread's length from a count: none reads
    the thread's messages."""

    async def refused(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the whole thread was read")

    monkeypatch.setattr(SqlThreads, "raw", refused)
    history = [{"role": "user", "content": f"message {i}"} for i in range(3)]
    assert json.loads(await tools.save_messages("t1", history))["messages"] == 3
    assert json.loads(await tools.append_messages("t1", history[:1]))["messages"] == 4


async def test_save_messages_refuses_a_window_and_append_messages_adds_it(
    tools: MemoryTools,
) -> None:
    """save_messages of a sliding window is a tool error naming the first seq that differs,
    and stores nothing; append_messages adds the window's new message, and search finds it."""
    assert "append_messages" in TOOL_NAMES
    history = [{"role": "user", "content": f"step {w}"} for w in ("one", "two", "three")]
    await tools.save_messages("t1", history)
    window = [*history[1:], {"role": "user", "content": "step four: rotate zebra-cert"}]
    with pytest.raises(ToolError, match=r"messages\[0\] differs .* seq 0"):
        await tools.save_messages("t1", window)
    added = json.loads(await tools.append_messages("t1", window[-1:]))
    assert added == {"thread_id": "t1", "added": 1, "messages": 4}
    hits = json.loads(await tools.search_messages("zebra"))
    assert [h["thread_id"] for h in hits] == ["t1"]


async def test_list_repos_pages_with_next_offset(mem: mnemo.Memory, tools: MemoryTools) -> None:
    """list_repos returns at most PAGE_ITEMS a page and a next_offset that reads the rest."""
    from mnemo.mcp._output import PAGE_ITEMS

    for i in range(PAGE_ITEMS + 5):
        await mem.open_repo(f"repo-{i:03d}")
    first = json.loads(await tools.list_repos())
    assert len(first["repos"]) == PAGE_ITEMS
    assert first["total"] == PAGE_ITEMS + 6
    rest = json.loads(await tools.list_repos(offset=first["next_offset"]))
    assert rest["next_offset"] is None
    assert first["repos"] + rest["repos"] == await mem.list_repos()


async def test_list_discard_and_end_sessions(mem: mnemo.Memory, tools: MemoryTools) -> None:
    """list_sessions shows live sessions (filtered by repo, goals clipped); discard_session
    drops a ready changeset; end_session ends it; their errors are one-line tool errors."""
    await mem.open_repo("other")
    sid = json.loads(await tools.start_session(LONG, REPO))["session_id"]
    await tools.start_session("Elsewhere", "other")
    listed = json.loads(await tools.list_sessions(repo=REPO))
    assert [s["id"] for s in listed["sessions"]] == [sid]
    assert len(listed["sessions"][0]["goal"]) <= SNIPPET_CHARS
    assert json.loads(await tools.list_sessions())["total"] == 2

    await tools.append(sid, "nginx returns 502.", "Restart gunicorn.")
    with pytest.raises(ToolError, match="not_discardable"):
        await tools.discard_session(sid)
    await mem.close(sid)
    with anyio.fail_after(30):
        # The offline extraction runs in the Memory's task group; yield until it has ended.
        while await mem.session_state(sid) is mnemo.State.EXTRACTING:
            await anyio.lowlevel.checkpoint()
    assert json.loads(await tools.discard_session(sid))["state"] == "idle"
    assert json.loads(await tools.end_session(sid)) == {"session_id": sid, "ended": True}
    assert json.loads(await tools.list_sessions(repo=REPO))["sessions"] == []
    with pytest.raises(ToolError, match="session"):
        await tools.end_session(sid)


@pytest.mark.parametrize(("repo", "says"), [
    ("nope", "unknown repo: 'nope'"), ("", "repo must not be blank"),
    (" ", "repo must not be blank")])
async def test_list_sessions_refuses_an_unknown_or_blank_repo(
    tools: MemoryTools, repo: str, says: str
) -> None:
    """list_sessions answers an unknown or blank repo as recall and get_node do, with a tool
    error, not with an empty page."""
    for call in (partial(tools.list_sessions, repo=repo), partial(tools.recall, repo, "q"),
                 partial(tools.get_node, repo, "x")):
        with pytest.raises(ToolError, match=says):
            await call()


def test_validation_errors_are_one_line_naming_the_field() -> None:
    """A pydantic rejection becomes one line naming the field and the rule, not the value."""
    from pydantic import BaseModel, Field, ValidationError

    from mnemo.mcp.transport import validation_message

    class Args(BaseModel):
        k: int = Field(ge=1)

    with pytest.raises(ValidationError) as caught:
        Args(k=-7)
    line = validation_message("recall", caught.value)
    assert line.startswith("invalid arguments for recall: k: ")
    assert "\n" not in line
    assert "-7" not in line


def test_a_recall_that_did_without_a_stage_says_so_in_its_output() -> None:
    """`RecallResult.degraded` reaches the agent (the MCP tool's output, the CLI's JSON)
    when a stage failed, and is left out when none did."""
    from mnemo.jsonable import recall_json
    from mnemo.mcp._output import recall_output

    healthy = mnemo.RecallResult([])
    degraded = mnemo.RecallResult([], degraded=["rerank: LLMError('HTTP 503')"])
    for render in (partial(recall_output, limit=SNIPPET_CHARS), recall_json):
        assert "degraded" not in render(healthy)
        assert render(degraded)["degraded"] == ["rerank: LLMError('HTTP 503')"]


async def test_memory_tools_never_follow_a_link_out_of_the_memory_directory(
    tools: MemoryTools, tmp_path: Path
) -> None:
    """A folder planted in the memory directory as a link to a folder outside: persist_memory
    and recall_memory into it are tool errors (the server wrote outside through it), and
    nothing lands outside; a NUL or an overlong folder name is a tool error too (a raw
    ValueError or OSError crashed the tool)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "memory").mkdir()
    os.symlink(outside, tmp_path / "memory" / "notes")
    with pytest.raises(ToolError, match="link"):
        await tools.persist_memory("The staging cluster has three nodes.", directory="notes")
    with pytest.raises(ToolError, match="link"):
        await tools.recall_memory("staging cluster", directory="notes/deeper")
    assert list(outside.iterdir()) == []
    for bad in ("notes\x00x", "x" * 300, "a/" * 2_100):
        with pytest.raises(ToolError):
            await tools.persist_memory("The staging cluster has three nodes.", directory=bad)
    assert json.loads(await tools.persist_memory("The staging cluster has three nodes.",
                                                 directory="team"))["topic"]


async def test_save_messages_past_the_bound_is_a_tool_error(tools: MemoryTools) -> None:
    """save_messages of more new messages than Config.max_messages_per_save (1,000) is a tool
    error naming the bound, and nothing is saved."""
    history = [{"role": "user", "content": f"message {i}"} for i in range(1_001)]
    with pytest.raises(ToolError, match="max_messages_per_save"):
        await tools.save_messages("t1", history)
    assert json.loads(await tools.save_messages("t1", history[:1]))["messages"] == 1
