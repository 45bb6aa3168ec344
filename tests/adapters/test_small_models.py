"""What small and slow models do to a request, over HTTP to the local fake server: replies cut
at max_tokens, prompts longer than the model's context, replies cut because the context
filled; and `calls.tasks.shorter`, which shortens a prompt."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import anyio
import pytest

import mnemo
from mnemo.adapters.openai import OpenAICompatible
from mnemo.calls.retry import LimitedLLM
from mnemo.calls.tasks import ask, shorter, task_inputs, task_request
from mnemo.extraction.prompts import parse_facts, semantic_request
from tests.adapters.provider_server import Answer, ProviderServer
from tests.fakes import js

FACT = {"proposition": "Dana lives in Porto.", "concepts": ["dana"], "confidence": 0.9}
STEPS = [{"index": i, "observation": f"step {i}: " + "the build failed again " * 40,
          "action": "retry it"} for i in range(3)]


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as s:
        yield s


def task_inputs_of(body: dict[str, object]) -> dict[str, Any]:
    """The task inputs of a chat request's body."""
    messages = body["messages"]
    assert isinstance(messages, list)
    return task_inputs(mnemo.LLMRequest("t", "", messages))


def _cut(data: Mapping[str, object], keep: int) -> str:
    """`data` as JSON, cut after `keep` characters."""
    return json.dumps(data)[:keep]


async def test_a_reply_cut_at_max_tokens_is_asked_again_with_more_room(
    server: ProviderServer,
) -> None:
    """A reply stopped at its max_tokens is sent again as it was (no re-ask holding the cut
    reply) with twice the room, and the whole second reply is the answer."""
    whole = {"facts": [FACT, FACT]}
    request = semantic_request(goal="g", subgoal="s", steps=STEPS)
    assert request.max_tokens is not None
    server.script(Answer(text=_cut(whole, 90), finish="length",
                         usage=(10, request.max_tokens)))
    async with OpenAICompatible("m", base_url=server.openai_url) as llm:
        facts = await ask(llm, request, parse_facts)
    first, second = (r.body for r in server.requests)
    assert second["max_tokens"] == 2 * first["max_tokens"]
    assert second["messages"] == first["messages"]
    assert len(facts) == len(STEPS)  # the fake's default answer: one fact a step


async def test_a_reply_cut_with_no_more_room_keeps_its_whole_items(
    server: ProviderServer,
) -> None:
    """Cut at the adapter's own max_tokens (no more room to ask for), the reply's complete
    facts are kept and the one cut midway is dropped."""
    text = _cut({"facts": [FACT, {**FACT, "proposition": "The port is 8000."}]}, 130)
    server.script(Answer(text=text, finish="length", usage=(10, 64)))
    request = semantic_request(goal="g", subgoal="s", steps=STEPS)
    async with OpenAICompatible("m", base_url=server.openai_url, max_tokens=64) as llm:
        facts = await ask(llm, request, parse_facts)
    assert [f.proposition for f in facts] == ["Dana lives in Porto."]
    assert len(server.requests) == 1


async def test_a_metered_cut_reply_books_its_call_once(server: ProviderServer) -> None:
    """A reply given up on as cut (its whole items kept) books its tokens and its one call on
    the Memory's meter, the call counted once."""
    text = _cut({"facts": [FACT, {**FACT, "proposition": "The port is 8000."}]}, 130)
    server.script(Answer(text=text, finish="length", usage=(10, 64)))
    booked: list[mnemo.Usage] = []
    request = semantic_request(goal="g", subgoal="s", steps=STEPS)
    async with OpenAICompatible("m", base_url=server.openai_url, max_tokens=64) as llm:
        metered = LimitedLLM(llm, anyio.CapacityLimiter(1), booked.append)
        await ask(metered, request, parse_facts)
    total = sum(booked, mnemo.Usage())
    assert (total.input_tokens, total.output_tokens, total.calls) == (10, 64, 1)


async def test_a_reply_cut_because_the_context_filled_shortens_the_prompt(
    server: ProviderServer,
) -> None:
    """A reply cut far below its max_tokens (llama-cpp-python said "tool_calls" after 9
    tokens: the context was full) is not re-asked with the cut reply added (that overflowed
    again): the prompt is sent again shorter."""
    server.script(Answer(text='{"facts": [{"propos', finish="tool_calls", usage=(4000, 9)))
    request = semantic_request(goal="g", subgoal="s", steps=STEPS)
    async with OpenAICompatible("m", base_url=server.openai_url) as llm:
        facts = await ask(llm, request, parse_facts)
    first, second = (r.body for r in server.requests)
    assert len(second["messages"]) == len(first["messages"])
    assert len(json.dumps(second["messages"])) < len(json.dumps(first["messages"]))
    assert len(facts) == len(STEPS)


async def test_a_prompt_longer_than_the_context_is_shortened_not_failed() -> None:
    """A server refusing the prompt as longer than its context (llama.cpp's HTTP 400): the
    same task is asked again with shorter step texts, which fit, and every step stays."""
    request = semantic_request(goal="g", subgoal="s", steps=STEPS)
    size = len(json.dumps(request.messages)) // 4
    with ProviderServer(context=size * 3 // 4) as server:
        server.answer_task("semantic", Answer(data={"facts": [FACT]}))
        async with OpenAICompatible("m", base_url=server.openai_url) as llm:
            facts = await ask(llm, request, parse_facts)
        statuses = server.statuses
        asked = task_inputs_of(server.requests[-1].body)
    assert statuses == [400, 200]
    assert [f.proposition for f in facts] == ["Dana lives in Porto."]
    assert [s["index"] for s in asked["steps"]] == [0, 1, 2]


async def test_a_context_refusal_with_nothing_left_to_cut_is_an_llm_context_error() -> None:
    """A prompt whose inputs are already short cannot be shortened: the refusal comes back as
    `mnemo.LLMContextError`, naming the server's words."""
    request = task_request("subgoal", system="s", instructions="x", inputs={"a": "b"},
                           schema={"type": "object"})
    with ProviderServer(context=1) as server:
        async with OpenAICompatible("m", base_url=server.openai_url) as llm:
            with pytest.raises(mnemo.LLMContextError, match="context size"):
                await ask(llm, request, lambda reply: reply.data)


def test_shorter_halves_the_inputs_text_and_the_recent_context() -> None:
    """`shorter` keeps the instructions and every field, cuts the longest texts in the middle
    to about half the inputs' text, and drops the older half of "recent"; an input with
    nothing long to cut gives None."""
    long = "a" * 2000 + "MIDDLE" + "z" * 2000
    request = task_request("state", system="s", instructions="Say it.",
                           inputs={"observation": long, "action": "go",
                                   "recent": ["one", "two", "three", "four"]})
    cut = shorter(request)
    assert cut is not None
    inputs = js(task_inputs(cut))
    assert inputs["action"] == "go"
    assert inputs["recent"] == ["three", "four"]
    assert inputs["observation"].startswith("aaa")
    assert inputs["observation"].endswith("zzz")
    assert "MIDDLE" not in inputs["observation"]
    assert len(inputs["observation"]) < 0.6 * len(long)
    assert js(cut.messages[0])["content"].startswith("Say it.")
    assert shorter(task_request("state", system="s", instructions="x",
                                inputs={"observation": "short"})) is None


async def test_json_mode_shows_the_model_an_example_answer() -> None:
    """In "json" mode (a server with neither json_schema nor tools) the system prompt shows an
    answer shaped as the schema wants, before the schema (a small model shown only the schema
    answered with the schema itself)."""
    request = semantic_request(goal="g", subgoal="s", steps=STEPS)
    with ProviderServer() as server:
        async with OpenAICompatible("m", base_url=server.openai_url, structured="json") as llm:
            await ask(llm, request, parse_facts)
        system = server.requests[0].body["messages"][0]["content"]
    example = '{"facts": [{"proposition": "...", "concepts": ["..."], "confidence": 0.5}]}'
    assert example in system
    assert system.index(example) < system.index('"type": "object"')
