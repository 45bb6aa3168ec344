"""`OpenAICompatible`: an `LLM` over the chat-completions protocol (OpenAI, Ollama, vLLM,
llama.cpp server, and the hosted services that speak it).

Structured output is "json_schema", "tool" or "json"; "auto" moves from one to the next for
good when the server refuses a mode (`structured_mode`). A reply cut at its max_tokens is asked
again with twice the room, up to the adapter's `max_tokens`, then raises `Cut`."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import partial
from typing import Annotated, Literal, Unpack, cast, get_args

import anyio
import httpx
import msgspec

from mnemo.access import is_loopback
from mnemo.adapters._http import Counts, HTTPFailure, HTTPOptions, Tokens, logger
from mnemo.adapters._model import (
    DEFAULT_MAX_TOKENS,
    OPENAI_BASE_URL,
    TOOL_DESCRIPTION,
    HTTPModel,
    adapt,
    answer,
    example_of,
    more_room,
    re_ask,
    reply_cap,
    tool_call,
    tool_spec,
    warn_cut,
)
from mnemo.adapters.limit import ServerProfile
from mnemo.calls.retry import Budget, task_budget, waiting
from mnemo.calls.tasks import Cut, decode_json
from mnemo.errors import InvalidInputError, LLMContextError, LLMError, LLMTimeout, check_count
from mnemo.ports import REQUIRED, JSONObject, LLMRequest, LLMResponse, ToolCall, Usage, add_usage

Structured = Literal["auto", "json_schema", "tool", "json"]
Mode = Literal["json_schema", "tool", "json"]

# The default temperature of a server on this machine (small local models loop at 0).
LOCAL_TEMPERATURE = 0.2
# The mode to try when a server refuses one, and the words that say its error is about the mode.
_NEXT_MODE: dict[Mode, Mode] = {"json_schema": "tool", "tool": "json"}
_COMPLAINT_WORDS: dict[Mode, tuple[str, ...]] = {
    "json_schema": ("response_format", "response format", "json_schema", "schema"),
    "tool": ("tool", "function"),
}


class OpenAICompatible(HTTPModel):
    """An `LLM` speaking OpenAI's `POST {base_url}/chat/completions`. `api_key` defaults to
    `OPENAI_API_KEY`; `temperature` "default" is `LOCAL_TEMPERATURE` for a loopback server, else
    0; the other keywords are `HTTPOptions`. Raises InvalidInputError for an unknown `structured`
    mode, a bad limit or `max_tokens`, or no key for OpenAI's own API."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str = OPENAI_BASE_URL,
        api_key: str | None = None,
        structured: Structured = "auto",
        prices: Mapping[str, tuple[float, float]] | None = None,
        temperature: float | Literal["default"] | None = "default",
        max_tokens: int = DEFAULT_MAX_TOKENS,
        **options: Unpack[HTTPOptions],
    ) -> None:
        if structured not in get_args(Structured):
            raise InvalidInputError(
                f"structured must be one of {get_args(Structured)}, got {structured!r}"
            )
        self.max_tokens = check_count("max_tokens", max_tokens, minimum=1)
        super().__init__(model, base_url, api_key, prices, options, provider="openai",
                         scheme="openai-compatible", error=LLMError, timeout_error=LLMTimeout)
        self._auto = structured == "auto"
        self.structured_mode: Mode = "json_schema" if structured == "auto" else structured
        # Until a structured reply came in the mode "auto" chose, one request at a time tries it.
        self._confirmed = not self._auto
        self._probing = anyio.Lock()
        self._temperature = (
            (LOCAL_TEMPERATURE if is_loopback(httpx.URL(self.base_url).host) else 0.0)
            if temperature == "default" else temperature
        )
        self._tokens_field = "max_tokens"

    def server_profile(self) -> ServerProfile:
        return ServerProfile(self._http.limit.state(), structured=(
            self.structured_mode if self._auto and self._confirmed else None))

    def adopt_server_profile(self, stored: ServerProfile) -> None:
        """Starts from an earlier adapter's `server_profile`; a mode given explicitly stays."""
        if self._auto and not self._confirmed and stored.structured in get_args(Mode):
            self.structured_mode, self._confirmed = cast(Mode, stored.structured), True
        super().adopt_server_profile(stored)

    async def generate(self, request: LLMRequest) -> LLMResponse:
        """The reply to `request` (with a schema, `data` is the JSON value it holds); raises
        LLMTimeout, LLMContextError, Cut, or LLMError naming the HTTP status."""
        with task_budget(self.retry_policy) as budget:
            if request.schema is not None:
                return await self._structured(request, request.schema, budget)
            # A server's refusal of tools is final: the caller may ask again without them.
            refusal = (partial(HTTPFailure.names_any, words=_COMPLAINT_WORDS["tool"])
                       if request.tools else None)
            cap = reply_cap(request.max_tokens, self.max_tokens)
            usage: Usage | None = None
            while True:
                reply = await self._complete(self._payload(request, None, None, cap), budget,
                                             refusal, kind=request.task)
                usage = add_usage(usage, self._usage(*reply.tokens()))
                choice = reply.choices[0]
                at_cap = _was_cut(reply, choice.finish_reason, cap)
                if not (at_cap and choice.message.tool_calls
                        and choice.finish_reason in ("length", None)):
                    break
                # A tool call cut midway holds no whole arguments: asked again with more room.
                cap = more_room(self._http.name, request.task, cap, self.max_tokens, budget,
                                text=choice.message.content or "", usage=usage)
        if at_cap or choice.finish_reason == "length":
            warn_cut(self._http.name, request.task, cap if at_cap else None)
        return LLMResponse(text=choice.message.content or "",
                           tool_calls=self._tool_calls(choice.message), usage=usage)

    async def _structured(
        self, request: LLMRequest, schema: JSONObject, budget: Budget
    ) -> LLMResponse:
        cap = reply_cap(request.max_tokens, self.max_tokens)
        usage: Usage | None = None
        asked = request
        while True:
            reply, mode = await self._send_structured(asked, schema, budget, cap)
            usage = add_usage(usage, self._usage(*reply.tokens()))
            choice = reply.choices[0]
            if choice.message.refusal:  # a decision, not a malformed reply: not asked again
                raise LLMError(f"{self._http.name}: the model refused task {request.task!r}: "
                               f"{choice.message.refusal}")
            raw = _structured_text(choice.message, mode, request.task)
            data, problem = answer(schema, raw, None, budget)
            if problem is None:
                return LLMResponse(text=raw, data=data, usage=usage)
            at_cap = _was_cut(reply, choice.finish_reason, cap)
            # No JSON, stopped unfinished with room left: the context filled.
            cut = at_cap or (choice.finish_reason in ("length", "tool_calls") and _is_cut(raw))
            if data is not None or not cut:
                if budget.task_reads == "any":
                    return LLMResponse(text=raw, data=data, usage=usage)
                asked = re_ask(self._http.name, request, asked, LLMResponse(text=raw, data=data),
                               problem, budget)
                continue
            if not at_cap:
                raise Cut(f"{self._http.name}: the reply to task {request.task!r} was cut short "
                          f"with room left under max_tokens={cap}: the prompt filled the model's "
                          f"context ({problem})", text=raw, at_cap=False)
            cap = more_room(self._http.name, request.task, cap, self.max_tokens, budget, text=raw,
                            usage=usage, problem=problem)

    async def _send_structured(
        self,
        request: LLMRequest,
        schema: JSONObject,
        budget: Budget,
        cap: int,
    ) -> tuple[Completion, Mode]:
        """One completion in the current mode, moving to the next when the server refuses it."""
        while True:
            probing = not self._confirmed
            if probing:
                with waiting():
                    await self._probing.acquire()
            mode = self.structured_mode
            words = _COMPLAINT_WORDS.get(mode) if self._auto else None
            refusal = None if words is None else partial(HTTPFailure.names_any, words=words)
            try:
                reply = await self._complete(
                    self._payload(request, mode, schema, cap), budget, refusal,
                    kind=request.task)
            except LLMError as exc:
                adapt(exc, budget, refusal, partial(self._next_mode, mode))
                continue
            finally:
                if probing:
                    self._probing.release()
            if self.structured_mode == mode:
                self._confirmed = True
            return reply, mode

    def _next_mode(self, mode: Mode, failure: HTTPFailure) -> None:
        # Concurrent calls may see the same refusal: only the first one moves on.
        if self.structured_mode == mode:
            self.structured_mode = _NEXT_MODE[mode]
            logger.warning("%s refused structured output %r (%s); using %r from now on",
                           self._http.name, mode, failure, self.structured_mode)

    async def _complete(
        self,
        payload: dict[str, object],
        budget: Budget,
        refusal: Callable[[HTTPFailure], bool] | None = None,
        *,
        kind: str,
    ) -> Completion:
        """POSTs a chat completion; from the first refusal of `max_tokens` on, the cap goes as
        `max_completion_tokens`, and from the first refusal of its temperature, none is sent
        (OpenAI's reasoning models)."""
        while True:
            if self._tokens_field != "max_tokens" and "max_tokens" in payload:
                payload[self._tokens_field] = payload.pop("max_tokens")
            if self._temperature is None:
                payload.pop("temperature", None)
            try:
                return await self._post("/chat/completions", payload, Completion,
                                        budget=budget, refusal=refusal, kind=kind)
            except LLMError as exc:
                fixable = not isinstance(exc, LLMContextError)
                adapt(exc, budget, partial(_refused, payload) if fixable else None,
                      self._comply)

    def _comply(self, failure: HTTPFailure) -> None:
        """Adopts what a refusal (`_refused`) asks for, for every later request."""
        if "max_completion_tokens" in failure.message:
            self._tokens_field = "max_completion_tokens"
        else:
            self._temperature = None

    def _tool_calls(self, message: _Message) -> list[ToolCall]:
        calls: list[ToolCall] = []
        for call in message.tool_calls or ():
            name, arguments = call.function.name, call.function.arguments
            if name is None:
                raise LLMError(f"{self._http.name}: a tool call has no function name: {call!r}")
            if isinstance(arguments, str) and not arguments.strip():
                arguments = None  # no arguments, as some compatible servers send a call of none
            try:
                parsed = decode_json(arguments) if isinstance(arguments, str) else arguments
            except ValueError as exc:
                raise LLMError(
                    f"{self._http.name}: the arguments of tool call {name!r} are not JSON: {exc}"
                ) from exc
            calls.append(tool_call(self._http.name, name, parsed, call.id))
        return calls

    def _payload(
        self,
        request: LLMRequest,
        mode: Mode | None,
        schema: JSONObject | None,
        cap: int,
    ) -> dict[str, object]:
        system = request.system
        payload: dict[str, object] = {"model": self.model}
        if self._temperature is not None:
            payload["temperature"] = self._temperature
        payload["max_tokens"] = cap
        tools, force = (request.tools, request.tool_choice) if schema is None else ((), None)
        if schema is not None and mode == "json_schema":
            payload["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": request.task, "schema": schema, "strict": False},
            }
        elif schema is not None and mode == "tool":
            tools = [{"name": request.task, "parameters": schema, "description": TOOL_DESCRIPTION}]
            force = request.task
        elif schema is not None:
            payload["response_format"] = {"type": "json_object"}
            system = f"{system}\n\n{json_instructions(request.task, schema)}".strip()
        if tools:
            payload["tools"] = [{"type": "function", "function": tool_spec(tool, "parameters")}
                                for tool in tools]
            if force is not None:
                payload["tool_choice"] = REQUIRED if force == REQUIRED else {
                    "type": "function", "function": {"name": force}}
        head = [{"role": "system", "content": system}] if system else []
        payload["messages"] = [*head, *map(dict, request.messages)]
        return payload


class _Function(msgspec.Struct):
    name: str | None = None
    # A JSON text, as OpenAI sends it; an object from some servers.
    arguments: str | dict[str, object] | None = None


class _Call(msgspec.Struct):
    function: _Function = msgspec.field(default_factory=_Function)
    id: str | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_Call] | None = None
    refusal: str | None = None


class _Choice(msgspec.Struct):
    message: _Message
    finish_reason: str | None = None


class Completion(msgspec.Struct):
    """A chat completion: its choices (none: garbage, retried) and the tokens it used."""

    choices: Annotated[list[_Choice], msgspec.Meta(min_length=1)]
    usage: Counts | None = None

    def tokens(self) -> Tokens:
        counts = self.usage or Counts()
        return counts.prompt_tokens, counts.completion_tokens


def json_instructions(task: str, schema: Mapping[str, object]) -> str:
    """The system prompt's addition in "json" mode: an example answer, then the schema."""
    example = json.dumps(example_of(schema), ensure_ascii=False)
    return (
        f"Reply with one JSON object only, no other text, shaped like this example (with "
        f"your own values in place of the example's):\n{example}\n"
        f'It must match this JSON schema (named "{task}"):\n'
        f"{json.dumps(schema, ensure_ascii=False)}"
    )


def _structured_text(message: _Message, mode: Mode, task: str) -> str:
    """The text holding the reply's JSON: the tool call's arguments in "tool" mode, else content."""
    if mode == "tool":
        for call in message.tool_calls or ():
            if call.function.name in (task, None) and call.function.arguments is not None:
                arguments = call.function.arguments
                return arguments if isinstance(arguments, str) else json.dumps(arguments)
    return message.content or ""


def _refused(payload: Mapping[str, object], failure: HTTPFailure) -> bool:
    """Whether a 400 refuses the `max_tokens` or the temperature `payload` sends."""
    return failure.status == 400 and any(
        name in payload and words in failure.message
        for name, words in (("max_tokens", "max_completion_tokens"),
                            ("temperature", "temperature")))


def _was_cut(reply: Completion, finish: str | None, cap: int) -> bool:
    """Whether the reply used every token allowed (with no count: its finish reason is "length")."""
    completion = reply.tokens()[1]
    return finish == "length" if completion is None else completion >= cap


def _is_cut(text: str) -> bool:
    """Whether `text` holds a JSON object that stopped before its end, not one with a mistake."""
    stripped = text.strip()
    start = stripped.find("{")
    if start < 0:
        return False
    try:
        json.JSONDecoder(strict=False).raw_decode(stripped[start:])
    except json.JSONDecodeError as exc:
        # The decoder ran out of text: what came was well formed, only unfinished.
        return exc.pos >= len(stripped) - start - 1 or exc.msg.startswith("Unterminated")
    return False
