"""`mnemo.tools`: tool specs in both formats and the executor."""

from __future__ import annotations

import json

import pytest

import mnemo
from mnemo import tools
from mnemo.conversation.eviction import EvictionTools
from tests.conftest import REPO
from tests.conversation._support import user
from tests.fakes import js


def test_specs_in_both_formats() -> None:
    """Each tool has an OpenAI function spec and an Anthropic spec with the same schema."""
    everything = [*tools.MEMORY_TOOLS, *tools.EVICTION_TOOL_NAMES]
    openai = js(tools.openai_tools(everything))
    anthropic = js(tools.anthropic_tools(everything))
    assert [t["function"]["name"] for t in openai] == everything
    assert [t["name"] for t in anthropic] == everything
    for o, a in zip(openai, anthropic, strict=True):
        assert o["type"] == "function"
        assert o["function"]["parameters"] == a["input_schema"]
        assert a["input_schema"]["type"] == "object"
        json.dumps(o), json.dumps(a)
    assert [t["name"] for t in tools.anthropic_tools()] == list(tools.MEMORY_TOOLS)
    with pytest.raises(mnemo.InvalidInputError):
        tools.openai_tools(["nope"])


async def test_execute_search_and_view(mem: mnemo.Memory) -> None:
    """search_messages and view_messages answer with text naming message ids."""
    conv = mem.conversation()
    stored = await conv.save("t", [user("the backup job runs at 02:00"), user("noted")])
    found = await tools.execute_tool(
        mem, mnemo.ToolCall("search_messages", {"query": "backup job"})
    )
    assert stored[0].id in found
    assert "02:00" in found
    shown = await tools.execute_tool(
        mem, mnemo.ToolCall("view_messages", {"message_id": stored[0].id, "radius": "1"})
    )
    assert f"> message 0 [{stored[0].id}]" in shown
    assert "noted" in shown
    own = await tools.execute_tool(
        mem, mnemo.ToolCall("search_messages", {"query": "backup"}), thread_id="t"
    )
    assert own == "No messages found.", "the caller's viewport is left out"
    everywhere = await tools.execute_tool(
        mem, mnemo.ToolCall("search_messages", {"query": "backup job", "thread_id": None}))
    assert stored[0].id in everywhere, "a null thread_id is left out, as the schema allows"


def test_optional_arguments_are_stated_as_their_plain_type() -> None:
    """An optional argument's schema is its type, with no `anyOf` or null (providers that
    check tool schemas refuse them)."""
    for spec in js(tools.openai_tools([*tools.MEMORY_TOOLS, *tools.EVICTION_TOOL_NAMES])):
        for prop in spec["function"]["parameters"]["properties"].values():
            assert "anyOf" not in prop
            assert prop.get("type") != "null"
    thread = js(tools.TOOLS["search_messages"]["parameters"])["properties"]["thread_id"]
    assert thread["type"] == "string"
    assert "Only this thread" in thread["description"]


async def test_execute_recall(mem: mnemo.Memory) -> None:
    """recall needs a repo in the context and answers from the graph."""
    call = mnemo.ToolCall("recall", {"query": "anything", "k": 3})
    assert (await tools.execute_tool(mem, call)).startswith("error:")
    assert await tools.execute_tool(mem, call, repo=REPO) == "Nothing recalled."
    assert (await tools.execute_tool(mem, call, repo="unknown")).startswith("error:")


@pytest.mark.parametrize(
    "call",
    [
        mnemo.ToolCall("search_messages", {}),
        mnemo.ToolCall("search_messages", {"query": "x", "limit": "many"}),
        mnemo.ToolCall("search_messages", {"query": "x", "limit": 21}),  # past its schema's 20
        mnemo.ToolCall("view_messages", {"message_id": "msg_missing"}),
        mnemo.ToolCall("teleport", {}),
        mnemo.ToolCall("save_snapshot", {"text": "no eviction running"}),
        mnemo.ToolCall("search_messages", "{not json"),  # type: ignore[arg-type]
    ],
)
async def test_execute_errors_are_text(mem: mnemo.Memory, call: mnemo.ToolCall) -> None:
    """Mistakes the model can fix come back as "error: ..." text, never as exceptions."""
    assert (await tools.execute_tool(mem, call)).startswith("error:")


async def test_execute_eviction_tools(mem: mnemo.Memory) -> None:
    """The eviction tools act on the EvictionTools given as context."""
    stored = await mem.conversation().save("t", [user("always use tabs"), user("fine")])
    goal = await mem.add_goal("t", "format the code")
    eviction = EvictionTools(zone=stored[:1], goal_ids={goal}, max_words=50)
    say = await tools.execute_tool(
        mem, mnemo.ToolCall("save_snapshot", {"text": "The user wants tabs."}), eviction=eviction
    )
    assert say.startswith("ok")
    pin = await tools.execute_tool(
        mem,
        mnemo.ToolCall("attach_messages_to_goals",
                       json.dumps({"message_ids": [0, 7], "goal_ids": [goal, "goal_x"]})),  # type: ignore[arg-type]
        eviction=eviction,
    )
    assert pin.startswith("ok: pinned 1 message(s) to 1 goal(s)")
    assert "ignored" in pin
    done = await tools.execute_tool(mem, mnemo.ToolCall("everything_ok", {}), eviction=eviction)
    assert done.startswith("ok")
    assert eviction.finished
    assert eviction.snapshot_parts == ["The user wants tabs."]
    assert eviction.pins == [(stored[0].id, goal)]


def test_get_node_states_the_page_it_reads() -> None:
    """get_node's description names the page size `tools.page` cuts at."""
    assert f"a page of {tools.PAGE_CHARS:,} characters" in tools.TOOLS["get_node"]["description"]
