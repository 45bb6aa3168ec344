"""`Anthropic` over a real socket: headers, the forced tool, a task's re-ask
(`calls.tasks.ask`), text and tool replies, message translation, usage, retries and keys."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from mnemo.adapters.anthropic import Anthropic, _translate
from mnemo.calls.tasks import Cut, ask, decode_json
from mnemo.errors import InvalidInputError, LLMError, LLMReplyError
from mnemo.extraction.prompts import parse_facts, semantic_request
from mnemo.ports import LLMRequest, ToolCall
from tests.adapters.provider_server import Answer, Fail, ProviderServer, VirtualClock
from tests.fakes import js

STEPS = [{"index": 0, "observation": "nginx listens on 8080", "action": "curl localhost:8080"}]
FACT = {"proposition": "Nginx listens on port 8080.", "concepts": ["nginx"], "confidence": 0.9}


def semantic() -> LLMRequest:
    return semantic_request(goal="serve the site", subgoal="configure nginx", steps=STEPS)


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as s:
        yield s


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
async def llm(server: ProviderServer, clock: VirtualClock) -> AsyncIterator[Anthropic]:
    async with Anthropic(
        "claude-3-5-haiku-20241022", api_key="sk-ant-test", base_url=server.url, clock=clock
    ) as adapter:
        yield adapter


async def test_structured_request_is_a_forced_tool(server: ProviderServer, llm: Anthropic) -> None:
    """The schema becomes a tool's input_schema, forced by tool_choice; its input is the data."""
    response = await llm.generate(semantic())
    [sent] = server.requests
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant-test"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    body = sent.body
    assert body["system"] == semantic().system
    assert body["max_tokens"] == semantic().max_tokens == 964
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert body["tools"] == [{
        "name": "semantic",
        "input_schema": semantic().schema,
        "description": "Record your answer. Call this with your complete reply.",
    }]
    assert body["tool_choice"] == {"type": "tool", "name": "semantic"}
    assert js(response.data)["facts"][0]["steps"] == [0]


async def test_usage_and_cost_from_the_price_table(llm: Anthropic, server: ProviderServer) -> None:
    """input/output tokens become Usage, priced by the built-in table for the model family."""
    server.script(Answer(usage=(2000, 100)))
    response = await llm.generate(semantic())
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (2000, 100)
    assert response.usage.cost == pytest.approx((2000 * 0.80 + 100 * 4.00) / 1e6)


async def test_an_unusable_tool_input_is_reasked_with_its_problem(
    server: ProviderServer, llm: Anthropic
) -> None:
    """A tool input the task cannot read is shown back to the model with its problem, once."""
    bad = {"facts": [{"proposition": "x", "concepts": "nginx", "confidence": 0.5}]}
    server.script(Answer(data=bad), Answer(data={"facts": [FACT]}))
    facts = await ask(llm, semantic(), parse_facts)
    assert [f.proposition for f in facts] == [FACT["proposition"]]
    messages = server.requests[1].messages
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert decode_json(messages[1]["content"]) == bad
    assert messages[2]["content"] == (
        "Your reply could not be used: facts[0].concepts must be a list or null, got 'nginx'. "
        "Reply again with JSON only.")


async def test_prose_instead_of_the_tool_is_reasked_as_text(
    server: ProviderServer, llm: Anthropic
) -> None:
    """A text reply with no tool call gets a plain-text re-ask."""
    server.script(Answer(text="I think the facts are..."), Answer(data={"facts": []}))
    assert await ask(llm, semantic(), parse_facts) == []
    last = server.requests[1].messages[-1]
    assert last["role"] == "user"
    assert last["content"].startswith("Your reply could not be used: the reply is not valid JSON")


async def test_json_in_the_text_is_the_data(server: ProviderServer, llm: Anthropic) -> None:
    """A model that writes the JSON as text instead of calling the tool is read all the same."""
    server.script(Answer(text='{"facts": []}'))
    response = await llm.generate(semantic())
    assert response.data == {"facts": []}


async def test_a_bad_reply_is_reasked_once(server: ProviderServer, llm: Anthropic) -> None:
    """A bad reply is re-asked once (the API contract), then LLMReplyError names the
    problem."""
    server.script(*[Answer(data={"facts": [{}]})] * 5)
    with pytest.raises(
        LLMReplyError, match=r"after 2 of 3 calls \(1 of 1 re-asks\).*: facts\[0\]\.propos"
    ):
        await ask(llm, semantic(), parse_facts)
    assert len(server.requests) == 2


async def test_text_and_tool_calls(server: ProviderServer, llm: Anthropic) -> None:
    """Without a schema: text blocks are the text, tool_use blocks the ToolCalls."""
    server.script(Answer(text="Saving.", tool_calls=(("save_snapshot", {"text": "hi"}),)))
    tool: dict[str, object] = {"name": "save_snapshot", "description": "Save.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}
    response = await llm.generate(
        LLMRequest("evict", "Evict.", [{"role": "user", "content": "go"}], tools=[tool])
    )
    assert response.text == "Saving."
    assert response.tool_calls == [ToolCall("save_snapshot", {"text": "hi"}, "toolu_0")]
    body = server.requests[0].body
    assert body["tools"] == [
        {"name": "save_snapshot", "description": "Save.", "input_schema": tool["parameters"]}
    ]
    assert "tool_choice" not in body


def test_openai_shaped_messages_are_translated() -> None:
    """System messages join `system`; tool calls become tool_use; tool replies tool_result."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "evict"},
        {"role": "assistant", "content": "ok", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "everything_ok", "arguments": '{"why": "fine"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    system, out = _translate("You evict.", messages)
    assert system == "You evict.\n\nBe brief."
    assert out == [
        {"role": "user", "content": "evict"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "ok"},
            {"type": "tool_use", "id": "c1", "name": "everything_ok", "input": {"why": "fine"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "done"}]},
    ]


async def test_overloaded_529_is_retried(
    server: ProviderServer, llm: Anthropic, clock: VirtualClock
) -> None:
    """Anthropic's 529 overloaded_error is retried like a 5xx."""
    server.script(Fail(529, "Overloaded"), Answer(data={"facts": [FACT]}))
    response = await llm.generate(semantic())
    assert response.data == {"facts": [FACT]}
    assert server.statuses == [529, 200]
    assert len(clock.sleeps) == 1


async def test_refusal_names_status_and_message(server: ProviderServer, llm: Anthropic) -> None:
    """A 401 is final, and the error carries Anthropic's message."""
    server.script(Fail(401, "invalid x-api-key"))
    with pytest.raises(LLMError, match="HTTP 401 Unauthorized: invalid x-api-key"):
        await llm.generate(semantic())


async def test_key_from_env_at_construction(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ANTHROPIC_API_KEY is read when the adapter is made."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    async with Anthropic("claude-x", base_url=server.url) as adapter:
        monkeypatch.delenv("ANTHROPIC_API_KEY")
        await adapter.generate(semantic())
    assert server.requests[0].headers["x-api-key"] == "sk-ant-env"


def test_anthropic_itself_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anthropic's API with no key is refused at construction."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(InvalidInputError, match="ANTHROPIC_API_KEY"):
        Anthropic("claude-3-5-haiku-latest")


async def test_max_tokens_is_the_cap_and_the_default(server: ProviderServer) -> None:
    """The adapter's max_tokens caps a request's own and stands in for a missing one."""
    async with Anthropic(
        "claude-x", api_key="k", base_url=server.url, max_tokens=300, clock=VirtualClock()
    ) as capped:
        await capped.generate(semantic())
        await capped.generate(LLMRequest("chat", "", [{"role": "user", "content": "hi"}]))
    assert [r.body["max_tokens"] for r in server.requests] == [300, 300]
    with pytest.raises(InvalidInputError, match="max_tokens"):
        Anthropic("claude-x", api_key="k", base_url=server.url, max_tokens=0)


async def test_cut_reply_names_the_cap(server: ProviderServer, llm: Anthropic) -> None:
    """A structured reply stopped at max_tokens is asked again with twice the room, as it
    was; stopped there too, with no more room to ask for, the error says so, with the cap."""
    server.script(*[Answer(text='{"facts": [', data=None, finish="max_tokens")] * 4)
    async with Anthropic("claude-3-5-haiku-latest", base_url=server.url, max_tokens=1024,
                         api_key="k") as capped:
        with pytest.raises(Cut, match=r"cut short at max_tokens=1024, so it is incomplete"):
            await capped.generate(semantic())
    caps = [r.body["max_tokens"] for r in server.requests]
    assert caps[:2] == [964, 1024]
    assert server.requests[1].body["messages"] == server.requests[0].body["messages"]


async def test_a_cut_tool_input_keeps_the_items_before_the_last(server: ProviderServer) -> None:
    """A forced tool's input stopped at max_tokens with no more room: the items before its
    list's last (the one it was cut in) are kept, without asking again."""
    second = {**FACT, "proposition": "The port is 80"}
    server.script(Answer(data={"facts": [FACT, second]}, finish="max_tokens"))
    async with Anthropic("claude-x", base_url=server.url, max_tokens=64, api_key="k") as capped:
        facts = await ask(capped, semantic(), parse_facts)
    assert [f.proposition for f in facts] == [FACT["proposition"]]
    assert len(server.requests) == 1
