"""Eviction against real HTTP servers that differ in which `tool_choice` they obey: the
snapshot comes through the tools whatever the server, and the rounds share one deadline."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace

import anyio
import pytest

import mnemo
from mnemo.adapters.anthropic import Anthropic
from mnemo.adapters.openai import OpenAICompatible
from tests.adapters.provider_server import Answer, Fail, ProviderServer
from tests.conversation._support import user
from tests.fakes import FakeEmbedder

HISTORY = [user(f"step {i}: deploy the billing service to the staging cluster") for i in range(12)]
NAMED = frozenset({"named"})  # llama-cpp-python's server
REQUIRED = frozenset({"required"})  # llama.cpp's own server


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ProviderServer]:
    obeys, latency = getattr(request, "param", (frozenset({"named", "required"}), 0.0))
    with ProviderServer(obeys=obeys, latency=latency) as s:
        yield s


def _openai(server: ProviderServer) -> OpenAICompatible:
    return OpenAICompatible("m", base_url=server.openai_url, api_key="k", max_retries=0)


async def _evict(
    store: str, llm: OpenAICompatible | Anthropic, seconds: float = 30.0
) -> mnemo.EvictionResult:
    config = mnemo.Config(extraction_timeout=seconds)
    async with llm, mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), config=config) as mem:
        await mem.conversation().save("t", HISTORY)
        with anyio.fail_after(30):
            return await mem.evict("t", token_budget=4000, eviction_fraction=0.5)


async def _evict_with_a_goal(store: str, server: ProviderServer) -> mnemo.EvictionResult:
    llm = _openai(server)
    config = mnemo.Config(extraction_timeout=30)
    async with llm, mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), config=config) as mem:
        await mem.conversation().save("t", HISTORY)
        await mem.add_goal("t", "ship the billing service")
        with anyio.fail_after(30):
            return await mem.evict("t", token_budget=4000, eviction_fraction=0.5)


@pytest.mark.parametrize("server", [(NAMED, 0.0)], indirect=True)
async def test_a_server_obeying_only_a_named_tool_saves_the_snapshot_at_once(
    store: str, server: ProviderServer
) -> None:
    """A server that answers tools in prose unless one is forced by name (llama-cpp-python's)
    gets `save_snapshot` forced, and its one reply is the snapshot."""
    result = await _evict(store, _openai(server))
    assert result.error is None
    assert result.snapshot is not None
    assert result.snapshot.text.startswith("Messages 0-")
    assert len(server.requests) == 1
    assert server.requests[0].body["tool_choice"] == {
        "type": "function", "function": {"name": "save_snapshot"}
    }


@pytest.mark.parametrize("server", [(REQUIRED, 0.0)], indirect=True)
async def test_a_server_obeying_only_required_gets_asked_in_that_form(
    store: str, server: ProviderServer
) -> None:
    """A server that ignores a named tool but obeys "required" (llama.cpp's own) answers the
    first round in prose; the second round asks with "required" and saves the snapshot."""
    result = await _evict(store, _openai(server))
    assert result.error is None
    assert result.snapshot is not None
    assert result.snapshot.text.startswith("Messages 0-")
    assert [r.body.get("tool_choice") for r in server.requests][1] == "required"
    assert len(server.requests) == 2


@pytest.mark.parametrize("server", [(frozenset(), 0.0)], indirect=True)
async def test_a_server_ignoring_tools_in_every_form_is_asked_for_data(
    store: str, server: ProviderServer
) -> None:
    """A server that answers tools in prose however they are forced (llama.cpp's own with a
    model whose chat template has no tools) is asked the third time for save_snapshot's
    arguments as structured output, and that is the snapshot."""
    result = await _evict(store, _openai(server))
    assert result.error is None
    assert result.snapshot is not None
    assert result.snapshot.text.startswith("Messages 0-")
    assert len(server.requests) == 3
    third = server.requests[2].body
    assert "tools" not in third
    assert third["response_format"]["json_schema"]["name"] == "eviction"


@pytest.mark.parametrize("status", [400, 500])
async def test_a_server_refusing_tools_is_asked_for_data_at_once(store: str, status: int) -> None:
    """A server that refuses tools and json_schema, with a 400 or a 500 (llama.cpp's server of
    2024), has its refusal of the first round taken at once, not retried; the next round asks
    for save_snapshot's arguments as data, which JSON mode answers: that is the snapshot."""
    with ProviderServer(json_schema=False, tools=False, refusal_status=status) as server:
        llm = OpenAICompatible("m", base_url=server.openai_url, api_key="k")
        result = await _evict(store, llm)
        modes = [r.mode for r in server.requests]
    assert result.error is None
    assert result.snapshot is not None
    assert result.snapshot.text.startswith("Messages 0-")
    assert modes == ["tools", "json_schema", "tool", "json"]


async def test_anthropic_forces_the_snapshot_tool(store: str, server: ProviderServer) -> None:
    """The Anthropic adapter sends the forced tool in its API's form and gets the snapshot."""
    llm = Anthropic("claude", base_url=server.url, api_key="k", max_retries=0)
    result = await _evict(store, llm)
    assert result.error is None
    assert result.snapshot is not None
    assert result.snapshot.text.startswith("Messages 0-")
    assert server.requests[0].body["tool_choice"] == {"type": "tool", "name": "save_snapshot"}


async def test_with_open_goals_the_second_round_requires_a_tool(
    store: str, server: ProviderServer
) -> None:
    """With a goal open, the round after the snapshot asks for any tool ("required") and the
    eviction ends at `everything_ok`."""
    result = await _evict_with_a_goal(store, server)
    assert result.error is None
    assert [c.name for c in result.tool_calls] == ["save_snapshot", "everything_ok"]
    assert [r.body.get("tool_choice") for r in server.requests][1] == "required"


@pytest.mark.parametrize("server", [(frozenset(), 0.2)], indirect=True)
async def test_the_rounds_share_one_deadline(store: str, server: ProviderServer) -> None:
    """Against a server that answers every round in prose, the rounds together stop at the
    model timeout (three rounds of 0.2 s pass 0.5 s): the zone gets the note snapshot and the
    error says the model timed out. The adapter's fixed `timeout=` learns no speed that would
    lengthen the eviction's time."""
    llm = OpenAICompatible("m", base_url=server.openai_url, api_key="k", max_retries=0,
                           timeout=5.0)
    result = await _evict(store, llm, seconds=0.5)
    assert "timed out after 0.5 s" in (result.error or "")
    assert result.snapshot is not None
    assert "search_messages" in result.snapshot.text
    assert result.boundary_after > result.boundary_before


SNAPSHOT = "The billing service went to staging."


@pytest.mark.parametrize(
    ("obeys", "replies", "error", "pinned"),
    [
        # JSON mode: ids as strings ("message N" too), a key no schema asked for.
        (frozenset({"named", "required"}),
         [Answer(tool_calls=(("attach_messages_to_goals",
                              {"goal_ids": ["GOAL"], "message_ids": ["1", "message 2"],
                               "why": "kept"}),
                             ("save_snapshot", {"text": SNAPSHOT}), ("everything_ok", {})))],
         None, 2),
        # A reply asked as data, fenced, with a key beside the summary.
        (frozenset(), [Answer(text="Sure."), Answer(text="Sure."),
                       Answer(data={"text": SNAPSHOT, "words": 6}, fenced=True)], None, 0),
        # Arguments of the wrong type are answered with the field at fault.
        (frozenset({"named", "required"}),
         [Answer(tool_calls=(("save_snapshot", {"text": 7}),))] * 3,
         "save_snapshot: error: text must be a string, got 7", 0),
        # A reply cut at max_tokens mid-summary.
        (frozenset(), [Answer(text="Sure."), Answer(text="Sure."),
                       Answer(text='{"text": "The billing serv', finish="length")],
         "the eviction model failed", 0),
    ],
    ids=["json-mode-tools", "json-mode-data", "wrong-type", "cut"],
)
async def test_eviction_replies_are_read_in_the_shapes_providers_send(
    store: str, obeys: frozenset[str], replies: list[Answer], error: str | None, pinned: int
) -> None:
    """Each tool call's arguments and a reply asked as data are read into the eviction's
    structs: JSON mode's loose shapes are taken, a field of the wrong type is told to the model
    and reported, and a cut reply leaves the note snapshot."""
    with ProviderServer(obeys=obeys) as server:
        llm = _openai(server)
        config = mnemo.Config(extraction_timeout=30)
        async with llm, mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(),
                                     config=config) as mem:
            await mem.conversation().save("t", HISTORY)
            goal = await mem.add_goal("t", "ship the billing service")
            server.script(*[replace(r, tool_calls=tuple(
                (name, {k: [goal] if v == ["GOAL"] else v for k, v in args.items()})
                for name, args in r.tool_calls)) for r in replies])
            with anyio.fail_after(30):
                result = await mem.evict("t", token_budget=4000, eviction_fraction=0.5)
    assert result.snapshot is not None
    if error is None:
        assert result.error is None
        assert result.snapshot.text == SNAPSHOT
    else:
        assert error in (result.error or "")
        assert "search_messages" in result.snapshot.text
    assert len(result.pinned) == pinned


@asynccontextmanager
async def _measured_slow(store: str) -> AsyncIterator[tuple[ProviderServer, mnemo.Memory]]:
    """A Memory (`extraction_timeout` 0.2 s) whose model's server, 50 tokens a second, was
    measured on a first, short reply: its speed is what the deadlines follow."""
    with ProviderServer(tokens_per_second=50.0) as server:
        llm = _openai(server)
        config = mnemo.Config(extraction_timeout=0.2)
        async with llm, mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(),
                                     config=config) as mem:
            await llm.generate(mnemo.LLMRequest("warm", "Say hi.", [user("hi")], max_tokens=8))
            yield server, mem


async def test_a_slow_server_is_given_the_time_its_speed_says_an_eviction_needs(
    store: str,
) -> None:
    """`extraction_timeout` is the eviction's first guess, as it is an extraction's: a server
    measured slow (50 tokens a second) gets the time its replies need, and its snapshot is
    saved, not cut off at 0.2 s."""
    async with _measured_slow(store) as (server, mem):
        server.script(Answer(tool_calls=(("save_snapshot", {"text": SNAPSHOT * 3}),)))
        await mem.conversation().save("t", HISTORY)
        with anyio.fail_after(30):
            result = await mem.evict("t", token_budget=4000, eviction_fraction=0.5)
    assert result.error is None
    assert result.snapshot is not None
    assert result.snapshot.text == SNAPSHOT * 3


async def test_a_slow_server_is_given_the_time_its_speed_says_a_summary_needs(
    store: str,
) -> None:
    """An automatic summary's time follows the server's speed as an eviction's does: measured
    slow (50 tokens a second), its summary is saved, not cut off at 0.2 s."""
    async with _measured_slow(store) as (server, mem):
        server.script(Answer(data={"summary": SNAPSHOT * 3}))
        conv = mem.conversation(compression=mnemo.Summary(max_tokens=60, keep=1))
        with anyio.fail_after(30):
            await conv.save("t", HISTORY)
        records = await conv.compactions("t")
    assert [c.summary_text for c in records] == [SNAPSHOT * 3]


LONG_SNAPSHOT = " ".join(f"The billing service step {i} went to staging." for i in range(60))


async def test_a_snapshot_call_cut_at_max_tokens_is_asked_again_with_more_room(
    store: str,
) -> None:
    """A server that stops a reply at the request's max_tokens cuts save_snapshot's arguments
    midway: the call is asked again with twice the room until it comes whole, and the snapshot
    is the model's text (clipped at twice its words), not a fragment."""
    with ProviderServer(context=1_000_000) as server:
        server.script(*[Answer(tool_calls=(("save_snapshot", {"text": LONG_SNAPSHOT}),))] * 4)
        llm = OpenAICompatible("m", base_url=server.openai_url, api_key="k", max_retries=2)
        result = await _evict(store, llm)
    caps = [r.body["max_tokens"] for r in server.requests]
    assert caps == [caps[0] * 2**i for i in range(len(caps))]
    assert len(caps) > 1
    assert result.error is None
    assert result.snapshot is not None
    assert result.snapshot.text.startswith("The billing service step 0 went to staging.")
    assert result.snapshot.text.endswith((".", "..."))


async def test_anthropic_asks_a_snapshot_call_cut_at_max_tokens_again_with_more_room(
    store: str, server: ProviderServer
) -> None:
    """Anthropic's tool_use stopped at max_tokens is asked again with twice the room."""
    server.script(Answer(tool_calls=(("save_snapshot", {"text": "The billing"}),),
                         finish="max_tokens"),
                  Answer(tool_calls=(("save_snapshot", {"text": SNAPSHOT}),)))
    llm = Anthropic("claude", base_url=server.url, api_key="k", max_retries=2)
    result = await _evict(store, llm)
    first, second = (r.body["max_tokens"] for r in server.requests)
    assert second == first * 2
    assert result.error is None
    assert result.snapshot is not None
    assert result.snapshot.text == SNAPSHOT


@pytest.mark.parametrize("retries", [0, 2])
async def test_the_tokens_of_cut_calls_given_up_on_are_in_usage(
    store: str, server: ProviderServer, retries: int
) -> None:
    """A snapshot call cut at max_tokens every time it is asked, until no more room may be
    asked for: the tokens of those replies count in the eviction's usage and `usage()`."""
    server.script(*[Answer(tool_calls=(("save_snapshot", {"text": "The billing"}),),
                           finish="max_tokens", usage=(1000, 500))] * (retries + 1))
    llm = Anthropic("claude", base_url=server.url, api_key="k", max_retries=retries)
    config = mnemo.Config(extraction_timeout=30)
    async with llm, mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), config=config) as mem:
        await mem.conversation().save("t", HISTORY)
        await mem.evict("t", token_budget=4000, eviction_fraction=0.5)
        spent = mem.usage()
    assert spent.input_tokens >= 1000 * (retries + 1)
    assert spent.output_tokens >= 500 * (retries + 1)


async def test_a_whole_tool_call_that_used_every_token_is_taken(server: ProviderServer) -> None:
    """A complete call (finish reason "tool_calls") whose reply used exactly its max_tokens is
    not taken for cut: it is the answer, asked once."""
    server.script(Answer(tool_calls=(("save_snapshot", {"text": "whole"}),), usage=(10, 64)))
    tools = [{"name": "save_snapshot", "description": "d",
              "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}]
    async with _openai(server) as llm:
        reply = await llm.generate(mnemo.LLMRequest(
            "eviction", "s", [user("hi")], tools=tools, tool_choice="required", max_tokens=64))
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("save_snapshot",
                                                                  {"text": "whole"})]
    assert len(server.requests) == 1


async def test_a_round_failing_after_the_snapshot_keeps_it_without_an_error(
    store: str, server: ProviderServer
) -> None:
    """With a goal open, the round after the snapshot fails (a server error, no retries left):
    the snapshot saved stands and the eviction reports no error (pins are optional)."""
    server.script(Answer(tool_calls=(("save_snapshot", {"text": SNAPSHOT}),)), Fail(500))
    result = await _evict_with_a_goal(store, server)
    assert len(server.requests) == 2
    assert result.error is None
    assert result.snapshot is not None
    assert result.snapshot.text == SNAPSHOT


async def test_an_evictions_usage_counts_its_calls_everywhere_once(
    store: str, server: ProviderServer
) -> None:
    """The calls an eviction made over HTTP are in its `EvictionResult.usage`, the adapter's
    `total_usage` and `mem.usage()`, each once."""
    llm = _openai(server)
    async with llm, mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.conversation().save("t", HISTORY)
        result = await mem.evict("t", token_budget=4000, eviction_fraction=0.5)
        calls = len(server.requests)
        assert calls >= 1
        assert result.usage is not None
        assert (result.usage.calls, llm.total_usage.calls, mem.usage().calls) == (calls,) * 3
        assert mem.usage() == result.usage  # the tokens and cost, booked once
