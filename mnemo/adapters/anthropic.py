"""`Anthropic`: an `LLM` over Anthropic's Messages API.

Structured output is a forced tool call whose input schema is the request's schema. A reply
stopped at its max_tokens is asked again with twice the room, up to the adapter's `max_tokens`,
then raises `Cut`. OpenAI-shaped messages are translated to Anthropic's."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Unpack

import msgspec

from mnemo.adapters._http import Counts, HTTPOptions, Tokens
from mnemo.adapters._model import (
    ANTHROPIC_BASE_URL,
    DEFAULT_MAX_TOKENS,
    TOOL_DESCRIPTION,
    HTTPModel,
    answer,
    more_room,
    re_ask,
    reply_cap,
    tool_call,
    tool_spec,
    warn_cut,
)
from mnemo.calls.retry import Budget, task_budget
from mnemo.errors import LLMError, LLMTimeout, check_count
from mnemo.ports import REQUIRED, JSONObject, LLMRequest, LLMResponse, Usage, add_usage


class Anthropic(HTTPModel):
    """An `LLM` speaking Anthropic's `POST {base_url}/v1/messages`; `api_key` defaults to
    `ANTHROPIC_API_KEY`, the other keywords are as for `OpenAICompatible`. Raises
    InvalidInputError for a bad limit or `max_tokens`, or no key for Anthropic's own API."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str = ANTHROPIC_BASE_URL,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        prices: Mapping[str, tuple[float, float]] | None = None,
        temperature: float | None = 0.0,
        **options: Unpack[HTTPOptions],
    ) -> None:
        self.max_tokens = check_count("max_tokens", max_tokens, minimum=1)
        super().__init__(model, base_url, api_key, prices, options, provider="anthropic",
                         error=LLMError, timeout_error=LLMTimeout)
        self._temperature = temperature

    def _headers(self, key: str | None) -> dict[str, str]:
        return {"anthropic-version": "2023-06-01", **({"x-api-key": key} if key else {})}

    async def generate(self, request: LLMRequest) -> LLMResponse:
        """The reply to `request` (with a schema, `data` is the forced tool's input, or the JSON its
        text holds); raises LLMTimeout, LLMContextError, Cut, or LLMError naming the status."""
        with task_budget(self.retry_policy) as budget:
            if request.schema is not None:
                return await self._structured(request, request.schema, budget)
            cap = reply_cap(request.max_tokens, self.max_tokens)
            usage: Usage | None = None
            while True:
                reply = await self._send(request, budget, tools=request.tools, cap=cap,
                                         force=request.tool_choice if request.tools else None)
                usage = add_usage(usage, self._usage(*reply.tokens()))
                cut = reply.stop_reason == "max_tokens"
                if not (cut and any(b.type == "tool_use" for b in reply.content)):
                    break
                # A tool call cut midway holds no whole input: asked again with more room.
                cap = more_room(self._http.name, request.task, cap, self.max_tokens, budget,
                                text=_text(reply.content), usage=usage)
        if cut:
            warn_cut(self._http.name, request.task, cap)
        calls = [tool_call(self._http.name, b.name, b.input, b.id)
                 for b in reply.content if b.type == "tool_use" and b.name is not None]
        return LLMResponse(text=_text(reply.content), tool_calls=calls, usage=usage)

    async def _structured(
        self, request: LLMRequest, schema: JSONObject, budget: Budget
    ) -> LLMResponse:
        tool: JSONObject = {
            "name": request.task, "description": TOOL_DESCRIPTION, "input_schema": schema,
        }
        cap = reply_cap(request.max_tokens, self.max_tokens)
        usage: Usage | None = None
        asked = request
        while True:
            reply = await self._send(asked, budget, tools=[tool], force=request.task, cap=cap)
            usage = add_usage(usage, self._usage(*reply.tokens()))
            text = _text(reply.content)
            data = next((block.input for block in reply.content
                         if block.type == "tool_use" and block.name == request.task), None)
            if reply.stop_reason == "max_tokens":
                cap = more_room(self._http.name, request.task, cap, self.max_tokens, budget,
                                text=text, data=data, usage=usage)
                continue
            said = text if data is None else ""  # what a re-ask shows: the tool's input first
            data, problem = answer(schema, text, data, budget)
            if problem is None or budget.task_reads == "any":
                return LLMResponse(text=text, data=data, usage=usage)
            asked = re_ask(self._http.name, request, asked, LLMResponse(text=said, data=data),
                           problem, budget)

    async def _send(
        self,
        request: LLMRequest,
        budget: Budget,
        *,
        tools: Sequence[Mapping[str, object]] | None,
        force: str | None = None,
        cap: int,
    ) -> Message:
        system, messages = _translate(request.system, request.messages)
        payload: dict[str, object] = {
            "model": self.model,
            "max_tokens": cap,
            "messages": messages,
        }
        if system:
            payload["system"] = system
        if self._temperature is not None:
            payload["temperature"] = self._temperature
        if tools:
            payload["tools"] = [tool_spec(tool, "input_schema") for tool in tools]
        if force == REQUIRED:
            payload["tool_choice"] = {"type": "any"}
        elif force is not None:
            payload["tool_choice"] = {"type": "tool", "name": force}
        return await self._post("/v1/messages", payload, Message, budget=budget,
                                kind=request.task)


class _Block(msgspec.Struct):
    type: str = ""
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: object = None


class Message(msgspec.Struct):
    """A Messages API reply: its content blocks (none: garbage, retried) and why it stopped."""

    content: list[_Block]
    stop_reason: str | None = None
    usage: Counts | None = None

    def tokens(self) -> Tokens:
        counts = self.usage or Counts()
        return counts.input_tokens, counts.output_tokens


def _translate(
    system: str, messages: Sequence[Mapping[str, object]]
) -> tuple[str, list[dict[str, object]]]:
    """mnemo's OpenAI-shaped messages as (system, Messages API messages)."""
    systems = [system] if system else []
    out: list[dict[str, object]] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if role == "system":
            if isinstance(content, str) and content:
                systems.append(content)
        elif role == "tool":
            result = content if isinstance(content, str | list) else json.dumps(content)
            out.append({
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": message.get("tool_call_id"),
                             "content": result}],
            })
        elif role == "assistant" and message.get("tool_calls"):
            blocks: list[dict[str, object]] = []
            if isinstance(content, str) and content:
                blocks.append({"type": "text", "text": content})
            calls = message["tool_calls"]
            blocks += [_tool_use(call) for call in (calls if isinstance(calls, list) else [])]
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": role, "content": content if content is not None else ""})
    return "\n\n".join(systems), out


def _tool_use(call: Mapping[str, object]) -> dict[str, object]:
    """An OpenAI-shaped or a ToolCall-like tool call as a `tool_use` block."""
    function = call.get("function")
    source = function if isinstance(function, Mapping) else call
    arguments = source.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            arguments = {"arguments": arguments}
    return {"type": "tool_use", "id": call.get("id"), "name": source.get("name"),
            "input": arguments}


def _text(blocks: list[_Block]) -> str:
    return "".join(block.text for block in blocks if block.type == "text" and block.text)
