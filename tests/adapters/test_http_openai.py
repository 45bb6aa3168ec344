"""`OpenAICompatible` over a real socket: wire format, structured output and its fallbacks,
a task's reply read with one re-ask (`calls.tasks.ask`), tool calls, usage and cost, and keys."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from types import MappingProxyType
from typing import Any

import httpx
import pytest

from mnemo.adapters._model import DEFAULT_PRICES, price_of
from mnemo.adapters.anthropic import Anthropic
from mnemo.adapters.embeddings import OpenAIEmbedder
from mnemo.adapters.openai import OpenAICompatible
from mnemo.calls.retry import Backoff
from mnemo.calls.tasks import Cut, ask, decode_json
from mnemo.errors import InvalidInputError, LLMContextError, LLMError, LLMReplyError
from mnemo.extraction.prompts import parse_facts, semantic_request
from mnemo.ports import LLMRequest, ToolCall, Usage
from tests.adapters.provider_server import (
    REJECT_RESPONSE_FORMAT,
    REJECT_TOOLS,
    Answer,
    Fail,
    ProviderServer,
    VirtualClock,
    rate_limited,
)
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
async def llm(server: ProviderServer) -> AsyncIterator[OpenAICompatible]:
    async with OpenAICompatible(
        "m", base_url=server.openai_url, api_key="sk-test", clock=VirtualClock()
    ) as adapter:
        yield adapter


async def test_structured_request_wire_format(
    server: ProviderServer, llm: OpenAICompatible
) -> None:
    """A schema request POSTs system + messages with a json_schema response_format."""
    response = await llm.generate(semantic())
    [sent] = server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.headers["content-type"] == "application/json"
    body = sent.body
    assert body["model"] == "m"
    assert body["temperature"] == 0.2  # a server on this machine
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][0]["content"] == semantic().system
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "semantic", "schema": semantic().schema, "strict": False},
    }
    assert "tools" not in body
    assert js(response.data)["facts"][0]["proposition"].startswith("The agent observed")


async def test_usage_and_cost(server: ProviderServer) -> None:
    """Usage comes from prompt/completion tokens; cost from the price table; totals add up."""
    async with OpenAICompatible(
        "m", base_url=server.openai_url, prices={"m": (1.0, 2.0)}
    ) as priced:
        server.script(Answer(usage=(1000, 500)), Answer(usage=(10, 5)))
        first = await priced.generate(semantic())
        await priced.generate(semantic())
    assert first.usage is not None
    assert (first.usage.input_tokens, first.usage.output_tokens) == (1000, 500)
    assert first.usage.cost == pytest.approx((1000 * 1.0 + 500 * 2.0) / 1e6)
    assert priced.total_usage.input_tokens == 1010
    assert priced.total_usage.output_tokens == 505


async def test_unpriced_model_has_no_cost(server: ProviderServer, llm: OpenAICompatible) -> None:
    """A model with no price entry reports tokens and cost None."""
    response = await llm.generate(semantic())
    assert response.usage == Usage(10, 5, None)


def test_default_prices_match_dated_models() -> None:
    """A dated model name is priced as its family; the longest family wins."""
    assert price_of("gpt-4o-mini-2024-07-18", DEFAULT_PRICES) == DEFAULT_PRICES["gpt-4o-mini"]
    assert price_of("gpt-4o-2024-08-06", DEFAULT_PRICES) == DEFAULT_PRICES["gpt-4o"]
    assert price_of("llama3.1:8b", DEFAULT_PRICES) is None


def test_decode_json_tolerates_fences_and_prose() -> None:
    """Fenced JSON and an object inside prose are read; no JSON is a ValueError."""
    assert decode_json('```json\n{"a": 1}\n```') == {"a": 1}
    assert decode_json('Sure! Here it is: {"a": [1, 2]} Hope that helps.') == {"a": [1, 2]}
    with pytest.raises(ValueError, match="not valid JSON"):
        decode_json("no json here")
    with pytest.raises(ValueError, match="empty"):
        decode_json("  ")


def test_decode_json_reads_the_last_object_past_braces_in_prose() -> None:
    """Prose with braces of its own before the object (a reasoning model's draft, a lead-in
    naming the keys) is read past; an object's own nested objects are not taken for it."""
    answer = {"reasoning": "new task", "subgoal": "fix nginx", "seen": [{"a": 1}]}
    text = json.dumps(answer)
    assert decode_json(f'<think>Answer like {{"subgoal": "..."}}.</think>\n{text}') == answer
    assert decode_json(f"The keys {{reasoning, subgoal}}: {text}") == answer
    with pytest.raises(ValueError, match="not valid JSON"):  # past the braces it reads
        decode_json("{ " * 100 + text)
    with pytest.raises(ValueError, match="not valid JSON"):  # a cut reply: not its first fact
        decode_json('{"facts": [{"p": 1}, {"p": ')


async def test_fenced_json_is_accepted(server: ProviderServer, llm: OpenAICompatible) -> None:
    """A reply wrapped in a ```json fence is parsed without a re-ask."""
    server.script(Answer(data={"facts": [FACT]}, fenced=True))
    response = await llm.generate(semantic())
    assert response.data == {"facts": [FACT]}
    assert len(server.requests) == 1


async def test_a_json_mode_reply_after_a_reasoning_draft_is_read_in_one_call(
    server: ProviderServer, llm: OpenAICompatible
) -> None:
    """A reply whose object follows a `<think>` block holding a draft object of its own is the
    answer, without a re-ask."""
    draft = '<think>Something like {"facts": []} will do.</think>\n'
    server.script(Answer(text=draft + json.dumps({"facts": [FACT]})))
    assert [f.proposition for f in await ask(llm, semantic(), parse_facts)] == [
        FACT["proposition"]]
    assert len(server.requests) == 1


async def test_the_adapter_checks_only_the_top_level_keys(
    server: ProviderServer, llm: OpenAICompatible
) -> None:
    """A reply the schema would refuse below its top level (a key it does not list, one a nested
    object requires left out) is the adapter's `data` as it came, in one call: the task reads it."""
    loose = {"facts": [{"proposition": "Nginx is up."}], "extra": True}
    server.script(Answer(data=loose))
    response = await llm.generate(semantic())
    assert response.data == loose
    assert len(server.requests) == 1


# ---- a task's reply read, and the one re-ask -----------------------------------------------


async def test_an_unusable_reply_is_reasked_once(
    server: ProviderServer, llm: OpenAICompatible
) -> None:
    """A reply the task cannot read is sent back with its problem; the usable second reply is
    the answer."""
    bad = {"facts": [{"proposition": 3, "concepts": [], "confidence": 0.5}]}
    server.script(Answer(data=bad), Answer(data={"facts": [FACT]}))
    facts = await ask(llm, semantic(), parse_facts)
    assert [f.proposition for f in facts] == [FACT["proposition"]]
    assert llm.total_usage == Usage(20, 10, None)
    first, second = server.requests
    tail = second.messages[-2:]
    assert tail[0]["role"] == "assistant"
    assert decode_json(tail[0]["content"]) == bad
    assert tail[1] == {
        "role": "user",
        "content": "Your reply could not be used: facts[0].proposition must be a string, got 3. "
        "Reply again with JSON only.",
    }
    assert second.messages[:-2] == first.messages


async def test_malformed_json_is_reasked(server: ProviderServer, llm: OpenAICompatible) -> None:
    """A reply that is not JSON gets the re-ask too."""
    server.script(Answer(text='{"facts": [{"proposition": '), Answer(data={"facts": []}))
    assert await ask(llm, semantic(), parse_facts) == []
    assert "not valid JSON" in server.requests[1].messages[-1]["content"]


async def test_second_bad_reply_raises_saying_what_was_wrong(
    server: ProviderServer, llm: OpenAICompatible
) -> None:
    """An unusable reply is re-asked once (the API contract); an unusable second one raises
    `LLMReplyError` naming the task and the second reply's problem, from that problem."""
    server.script(
        Answer(data={"facts": "none"}), *[Answer(data={"facts": [{"concepts": []}]})] * 3
    )
    with pytest.raises(
        LLMReplyError,
        match=r"task 'semantic' was unusable after 2 of 3 calls.*: "
        r"facts\[0\]\.proposition must be a string, got nothing",
    ) as caught:
        await ask(llm, semantic(), parse_facts)
    assert len(server.requests) == 2
    assert isinstance(caught.value.__cause__, ValueError)
    assert "facts[0].proposition" in str(caught.value.__cause__)


async def test_cut_short_reply_says_so(server: ProviderServer) -> None:
    """A reply truncated at max_tokens (and no more room to ask for) is a `Cut` saying so,
    holding what came."""
    cap = semantic().max_tokens
    assert cap is not None
    server.script(*[Answer(text='{"facts": [', finish="length", usage=(10, cap))] * 4)
    async with OpenAICompatible("m", base_url=server.openai_url, max_tokens=cap) as capped:
        with pytest.raises(Cut, match="cut short at max_tokens") as cut:
            await capped.generate(semantic())
    assert cut.value.at_cap
    assert cut.value.text == '{"facts": ['
    server.script(*[Answer(text='{"facts": [', finish="length", usage=(10, cap))] * 4)
    async with OpenAICompatible("m", base_url=server.openai_url, max_tokens=cap) as capped:
        with pytest.raises(LLMReplyError, match="unusable after") as spent:
            await ask(capped, semantic(), parse_facts)
    assert isinstance(spent.value.__cause__, Cut)


# ---- structured-output modes and the auto fallback -------------------------------------------


async def test_auto_falls_back_to_tool_and_remembers(
    server: ProviderServer, llm: OpenAICompatible
) -> None:
    """A 400 about response_format switches to a forced tool, for this and later requests."""
    server.script(REJECT_RESPONSE_FORMAT)
    response = await llm.generate(semantic())
    assert js(response.data)["facts"]
    assert llm.structured_mode == "tool"
    assert [r.mode for r in server.requests] == ["json_schema", "tool"]
    tool_call = server.requests[1].body
    assert tool_call["tools"] == [{
        "type": "function",
        "function": {"name": "semantic", "parameters": semantic().schema,
                     "description": "Record your answer. Call this with your complete reply."},
    }]
    assert tool_call["tool_choice"] == {"type": "function", "function": {"name": "semantic"}}
    assert "response_format" not in tool_call
    await llm.generate(semantic())
    assert [r.mode for r in server.requests] == ["json_schema", "tool", "tool"]


async def test_auto_falls_back_to_json_mode(server: ProviderServer, llm: OpenAICompatible) -> None:
    """A server refusing json_schema and tools gets json_object with the schema in the prompt."""
    server.script(REJECT_RESPONSE_FORMAT, REJECT_TOOLS)
    response = await llm.generate(semantic())
    assert js(response.data)["facts"]
    assert llm.structured_mode == "json"
    body = server.requests[-1].body
    assert body["response_format"] == {"type": "json_object"}
    system = body["messages"][0]["content"]
    assert system.startswith(semantic().system)
    assert '"proposition"' in system
    assert "JSON" in system


async def test_tool_mode_reask_shows_the_arguments(
    server: ProviderServer, llm: OpenAICompatible
) -> None:
    """In tool mode an unusable tool call is re-asked with its arguments shown."""
    server.script(REJECT_RESPONSE_FORMAT, Answer(data={"facts": [{"concepts": []}]}))
    assert await ask(llm, semantic(), parse_facts)
    reask = server.requests[2].messages
    assert decode_json(reask[-2]["content"]) == {"facts": [{"concepts": []}]}
    assert reask[-1]["content"].startswith("Your reply could not be used: facts[0].proposition")


async def test_unrelated_400_does_not_fall_back(
    server: ProviderServer, llm: OpenAICompatible
) -> None:
    """A 400 about something else is an LLMError naming it; the mode stays."""
    server.script(Fail(400, "context_length_exceeded: too many tokens"))
    with pytest.raises(LLMError, match="HTTP 400 Bad Request: context_length_exceeded"):
        await llm.generate(semantic())
    assert llm.structured_mode == "json_schema"


async def test_a_context_overflow_naming_functions_is_no_refusal_of_tools(
    server: ProviderServer, llm: OpenAICompatible
) -> None:
    """OpenAI's context-length 400 in tool mode names "functions": it is LLMContextError, and
    the mode stays tool (a prompt too long, not a server refusing the mode)."""
    overflow = ("This model's maximum context length is 8192 tokens. However, your messages "
                "resulted in 8300 tokens (8000 in the messages, 300 in the functions). Please "
                "reduce the length of the messages or functions.")
    server.script(REJECT_RESPONSE_FORMAT, Fail(400, overflow))
    with pytest.raises(LLMContextError, match="maximum context length"):
        await llm.generate(semantic())
    assert llm.structured_mode == "tool"
    assert [r.mode for r in server.requests] == ["json_schema", "tool"]


async def test_explicit_mode_never_falls_back(server: ProviderServer) -> None:
    """structured="json_schema" raises on a refusal instead of switching."""
    async with OpenAICompatible(
        "m", base_url=server.openai_url, structured="json_schema"
    ) as strict:
        server.script(REJECT_RESPONSE_FORMAT)
        with pytest.raises(LLMError, match="response_format"):
            await strict.generate(semantic())
        assert strict.structured_mode == "json_schema"


@pytest.mark.parametrize("mode", ["tool", "json"])
async def test_explicit_modes(server: ProviderServer, mode: Any) -> None:
    """structured="tool" and "json" are used from the first request."""
    async with OpenAICompatible("m", base_url=server.openai_url, structured=mode) as adapter:
        response = await adapter.generate(semantic())
    assert js(response.data)["facts"]
    assert server.requests[0].mode == mode


def test_unknown_mode_is_refused() -> None:
    """An unknown structured mode is an InvalidInputError."""
    with pytest.raises(InvalidInputError, match="structured"):
        OpenAICompatible("m", base_url="http://localhost:1/v1", structured="xml")  # type: ignore[arg-type]


# ---- free text and tools --------------------------------------------------------------------


async def test_text_reply(server: ProviderServer, llm: OpenAICompatible) -> None:
    """Without a schema the reply is text; max_tokens is passed on."""
    server.script(Answer(text="The door is open."))
    request = LLMRequest("state", "You summarise.", [{"role": "user", "content": "hi"}],
                         max_tokens=50)
    response = await llm.generate(request)
    assert response.text == "The door is open."
    assert response.data is None
    body = server.requests[0].body
    assert body["max_tokens"] == 50
    assert "response_format" not in body
    assert "tools" not in body


async def test_tools_pass_through_and_calls_come_back(
    server: ProviderServer, llm: OpenAICompatible
) -> None:
    """request.tools are sent as OpenAI functions; the reply's calls become ToolCalls."""
    tool: dict[str, object] = {"name": "save_snapshot", "description": "Save it.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}
    server.script(Answer(tool_calls=(("save_snapshot", {"text": "hello"}),)))
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "evict"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_9", "type": "function",
             "function": {"name": "everything_ok", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "ok"},
    ]
    response = await llm.generate(LLMRequest("evict", "Evict.", history, tools=[tool]))
    assert response.tool_calls == [ToolCall("save_snapshot", {"text": "hello"}, "call_0")]
    body = server.requests[0].body
    assert body["tools"] == [{"type": "function", "function": tool}]
    assert body["messages"][1:] == history


async def test_bad_tool_arguments_raise(server: ProviderServer, llm: OpenAICompatible) -> None:
    """Tool-call arguments that are not a JSON object are an LLMError, never dropped."""
    server.script(Answer(tool_calls=(("save_snapshot", [1, 2]),)))  # type: ignore[arg-type]
    with pytest.raises(LLMError, match="not a JSON object"):
        await llm.generate(LLMRequest("evict", "Evict.", [{"role": "user", "content": "x"}],
                                      tools=[{"name": "save_snapshot", "parameters": {}}]))


# ---- retries through the adapter, keys --------------------------------------------------------


async def test_rate_limited_call_is_retried(server: ProviderServer) -> None:
    """A 429 then success: the caller only sees the success."""
    clock = VirtualClock()
    async with OpenAICompatible("m", base_url=server.openai_url, clock=clock) as adapter:
        server.script(rate_limited("1"), Answer(data={"facts": [FACT]}))
        response = await adapter.generate(semantic())
    assert response.data == {"facts": [FACT]}
    assert clock.sleeps == [1.0]


async def test_gives_up_with_status(server: ProviderServer) -> None:
    """Persistent 500s end in an LLMError naming the status and the server's message."""
    async with OpenAICompatible(
        "m", base_url=server.openai_url, max_retries=1, backoff=Backoff(base=0.001)
    ) as adapter:
        server.script(Fail(500, "boom"), Fail(500, "boom"))
        with pytest.raises(LLMError, match="2 attempts: HTTP 500 Internal Server Error: boom"):
            await adapter.generate(semantic())


async def test_key_is_read_from_env_at_construction(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OPENAI_API_KEY is read when the adapter is made: set after import it counts, changed
    after construction it does not."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    async with OpenAICompatible("m", base_url=server.openai_url) as adapter:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-changed")
        await adapter.generate(semantic())
    assert server.requests[0].headers["authorization"] == "Bearer sk-from-env"


async def test_no_key_sends_no_authorization(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local server with no key gets no Authorization header."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    async with OpenAICompatible("m", base_url=server.openai_url) as adapter:
        await adapter.generate(semantic())
    assert "authorization" not in server.requests[0].headers


def test_openai_itself_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The OpenAI API with no key at all is refused at construction."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(InvalidInputError, match="OPENAI_API_KEY"):
        OpenAICompatible("gpt-4o-mini")


async def test_a_replacement_transport_needs_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `httpx.MockTransport` in place of the network, the providers' own URLs need no
    key (each adapter refused to be built without one), and no auth header is sent."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    seen: list[httpx.Request] = []

    def reply(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/embeddings"):
            return httpx.Response(200, json={"data": [{"index": 0, "embedding": [1.0, 0.0]}],
                                             "usage": {"prompt_tokens": 1, "total_tokens": 1}})
        if request.url.path.endswith("/messages"):
            return httpx.Response(200, json={
                "content": [{"type": "tool_use", "id": "t", "name": "semantic",
                             "input": {"facts": []}}],
                "stop_reason": "tool_use", "usage": {"input_tokens": 1, "output_tokens": 1}})
        return httpx.Response(200, json={
            "choices": [{"message": {"role": "assistant", "content": '{"facts": []}'},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    transport = httpx.MockTransport(reply)
    async with OpenAICompatible("gpt-4o-mini", transport=transport) as llm:
        assert (await llm.generate(semantic())).data == {"facts": []}
    async with Anthropic("claude-3-5-haiku-latest", transport=transport) as claude:
        assert (await claude.generate(semantic())).data == {"facts": []}
    async with OpenAIEmbedder("text-embedding-3-small", transport=transport) as embedder:
        assert [list(v) for v in await embedder.embed(["hello"])] == [[1.0, 0.0]]
    assert [r.url.host for r in seen] == ["api.openai.com", "api.anthropic.com",
                                          "api.openai.com"]
    assert not any("authorization" in r.headers or "x-api-key" in r.headers for r in seen)


async def test_messages_given_as_read_only_mappings_are_sent() -> None:
    """A request's messages may be any mappings (the port's type): each is sent as an object."""
    sent: list[Any] = []

    def reply(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content)["messages"])
        return httpx.Response(200, json={"choices": [{"message": {"content": "hi"}}]})

    message = MappingProxyType({"role": "user", "content": "hello"})
    async with OpenAICompatible("m", base_url="http://x/v1",
                                transport=httpx.MockTransport(reply)) as llm:
        answer = await llm.generate(LLMRequest(task="t", system="", messages=[message]))
    assert (answer.text, sent) == ("hi", [[{"role": "user", "content": "hello"}]])


async def test_a_refusal_is_an_error_that_quotes_it_without_a_re_ask() -> None:
    """A structured output the model refuses (`message.refusal`, content null, as OpenAI
    documents) is an LLMError quoting the refusal, asked once."""
    sent: list[httpx.Request] = []

    def reply(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        message = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
        return httpx.Response(200, json={"choices": [{"message": message,
                                                      "finish_reason": "stop"}]})

    async with OpenAICompatible("m", base_url="http://x/v1",
                                transport=httpx.MockTransport(reply)) as llm:
        with pytest.raises(LLMError, match="refused task 'semantic': I can't help with that"):
            await llm.generate(semantic())
    assert len(sent) == 1


async def test_a_tool_call_with_empty_arguments_is_a_call_of_none() -> None:
    """A call whose `arguments` is "" (some OpenAI-compatible servers send it for a tool of no
    parameters, where OpenAI sends "{}") is a ToolCall with {} arguments, not an LLMError."""

    def reply(request: httpx.Request) -> httpx.Response:
        call = {"id": "c1", "type": "function",
                "function": {"name": "everything_ok", "arguments": ""}}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return httpx.Response(200, json={"choices": [{"message": message,
                                                      "finish_reason": "tool_calls"}]})

    async with OpenAICompatible("m", base_url="http://x/v1",
                                transport=httpx.MockTransport(reply)) as llm:
        answer = await llm.generate(LLMRequest(
            "evict", "Evict.", [{"role": "user", "content": "x"}],
            tools=[{"name": "everything_ok", "parameters": {}}]))
    assert answer.tool_calls == [ToolCall("everything_ok", {}, "c1")]


# ---- local servers -------------------------------------------------------------------------------

LLAMA_CPP_PYTHON_500 = Fail(
    500,
    "[{'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
    "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema'}]",
)


async def test_refusal_with_500_falls_back_without_retrying(
    server: ProviderServer, llm: OpenAICompatible, caplog: pytest.LogCaptureFixture
) -> None:
    """A 500 refusing json_schema is not retried: one request, then the tool mode, logged."""
    server.script(LLAMA_CPP_PYTHON_500)
    with caplog.at_level("WARNING", logger="mnemo.adapters"):
        response = await llm.generate(semantic())
    assert js(response.data)["facts"]
    assert [r.mode for r in server.requests] == ["json_schema", "tool"]
    assert llm.structured_mode == "tool"
    [line] = [r.getMessage() for r in caplog.records if "refused structured output" in r.message]
    assert "'json_schema'" in line
    assert "HTTP 500" in line
    assert "using 'tool' from now on" in line


async def test_plain_500_is_still_retried(server: ProviderServer, llm: OpenAICompatible) -> None:
    """A 500 that says nothing about the mode is a server failure: retried, mode kept."""
    server.script(Fail(500, "CUDA error: out of memory"))
    response = await llm.generate(semantic())
    assert js(response.data)["facts"]
    assert [r.mode for r in server.requests] == ["json_schema", "json_schema"]
    assert llm.structured_mode == "json_schema"


async def test_rate_limit_mentioning_schema_is_not_a_refusal(
    server: ProviderServer, llm: OpenAICompatible
) -> None:
    """A 429 is never taken for a refusal of the mode, whatever its message."""
    server.script(Fail(429, "too many json_schema requests", {"Retry-After": "0"}))
    await llm.generate(semantic())
    assert llm.structured_mode == "json_schema"


async def test_every_request_carries_max_tokens(
    server: ProviderServer, llm: OpenAICompatible
) -> None:
    """The task's max_tokens is sent; a request without one gets the adapter's default."""
    await llm.generate(semantic())
    await llm.generate(LLMRequest("chat", "", [{"role": "user", "content": "hi"}]))
    assert [r.body["max_tokens"] for r in server.requests] == [semantic().max_tokens, 4096]


async def test_adapter_max_tokens_caps_the_task(server: ProviderServer) -> None:
    """max_tokens= on the adapter caps every request; temperature= is sent as given."""
    async with OpenAICompatible(
        "m", base_url=server.openai_url, max_tokens=100, temperature=0.7
    ) as capped:
        await capped.generate(semantic())
        assert capped.max_tokens == 100
    body = server.requests[0].body
    assert (body["max_tokens"], body["temperature"]) == (100, 0.7)
    with pytest.raises(InvalidInputError, match="max_tokens"):
        OpenAICompatible("m", base_url=server.openai_url, max_tokens=0)


async def test_reply_using_every_token_is_reported_cut(
    server: ProviderServer, llm: OpenAICompatible
) -> None:
    """completion_tokens reaching the cap marks a reply cut even when finish_reason is "stop"."""
    cap = semantic().max_tokens
    assert cap is not None
    server.script(*[Answer(text='{"facts": [{"proposition": "Nginx', usage=(10, cap))] * 3)
    # The adapter allows no more room than the request's: the cut reply is re-asked.
    async with OpenAICompatible("m", base_url=server.openai_url, max_tokens=cap) as capped:
        with pytest.raises(LLMError,
                           match=rf"cut short at max_tokens={cap}, so it is incomplete"):
            await ask(capped, semantic(), parse_facts)
    reask = server.requests[1].messages[-1]["content"]
    assert f"cut short at max_tokens={cap}" in reask


async def test_cut_free_text_is_logged(
    server: ProviderServer, llm: OpenAICompatible, caplog: pytest.LogCaptureFixture
) -> None:
    """A free-text reply stopped at the cap is returned and a warning says it was cut."""
    server.script(Answer(text="The agent is at the door and the door is", finish="length",
                         usage=(10, 12)))
    request = LLMRequest("state", "", [{"role": "user", "content": "hi"}], max_tokens=12)
    with caplog.at_level("WARNING", logger="mnemo.adapters"):
        response = await llm.generate(request)
    assert response.text.startswith("The agent")
    assert any("'state' was cut short at max_tokens=12" in r.getMessage() for r in caplog.records)


async def test_control_characters_in_json_strings_are_tolerated(
    server: ProviderServer, llm: OpenAICompatible
) -> None:
    """A raw newline or tab inside a JSON string is read, not re-asked."""
    raw = '{"facts": [{"proposition": "Nginx listens\non port\t8080.", "concepts": ["nginx"], ' \
        '"confidence": 0.9}]}'
    server.script(Answer(text=raw))
    response = await llm.generate(semantic())
    assert js(response.data)["facts"][0]["proposition"] == "Nginx listens\non port\t8080."
    assert len(server.requests) == 1


async def test_reasoning_model_gets_max_completion_tokens(
    server: ProviderServer, llm: OpenAICompatible
) -> None:
    """A 400 asking for max_completion_tokens resends the cap under that name, from then on."""
    server.script(Fail(400, "Unsupported parameter: 'max_tokens' is not supported with this "
                            "model. Use 'max_completion_tokens' instead."))
    response = await llm.generate(semantic())
    await llm.generate(semantic())
    assert js(response.data)["facts"]
    fields = [
        (r.body.get("max_tokens"), r.body.get("max_completion_tokens")) for r in server.requests
    ]
    cap = semantic().max_tokens
    assert fields == [(cap, None), (None, cap), (None, cap)]
    assert llm.structured_mode == "json_schema"


async def test_reasoning_model_gets_no_temperature_once_it_refuses_one(
    server: ProviderServer,
) -> None:
    """OpenAI's refusal of a temperature its reasoning models do not support resends the
    request without one, and later requests go without it too."""
    server.script(Fail(400, "Unsupported value: 'temperature' does not support 0.2 with this "
                            "model. Only the default (1) value is supported."))
    async with OpenAICompatible("o3-mini", base_url=server.openai_url, temperature=0.2) as llm:
        response = await llm.generate(semantic())
        await llm.generate(semantic())
    assert js(response.data)["facts"]
    assert [r.body.get("temperature") for r in server.requests] == [0.2, None, None]


def test_httpxs_own_network_transport_still_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A transport that is httpx's own network one (retries, a proxy) goes to OpenAI over
    the network: refused without a key, as with none given."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(InvalidInputError, match="OPENAI_API_KEY"):
        OpenAICompatible("gpt-4o-mini", transport=httpx.AsyncHTTPTransport(retries=1))
