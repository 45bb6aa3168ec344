"""What the HTTP adapters share (`HTTPModel`, prices, usage) and what the chat adapters share
(max_tokens, tools, an example answer drawn from a schema)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import httpx

from mnemo.adapters._http import Closing, HTTPFailure, HTTPOptions, R, Transport, logger
from mnemo.adapters.limit import Limit, ServerProfile
from mnemo.adapters.uri import KEY_VARIABLES
from mnemo.calls.retry import Budget
from mnemo.calls.tasks import Cut, decode_json, preview, re_asked
from mnemo.errors import AdapterError, InvalidInputError, LLMContextError, LLMError, LLMReplyError
from mnemo.ports import JSONObject, LLMRequest, LLMResponse, ToolCall, Usage

# US dollars per million tokens (input, output), as published in 2025; a model matches its name
# or its longest "-" prefix (`price_of`). `prices=` corrects or extends them.
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "text-embedding-3-small": (0.02, 0.0),
    "text-embedding-3-large": (0.13, 0.0),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-3-5-sonnet": (3.00, 15.00),
    "claude-3-7-sonnet": (3.00, 15.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-opus-4": (15.00, 75.00),
}

OPENAI_BASE_URL = "https://api.openai.com/v1"
ANTHROPIC_BASE_URL = "https://api.anthropic.com"
# A provider's name in messages and its own API's URL, by its URI scheme.
_PROVIDERS = {"openai": ("OpenAI", OPENAI_BASE_URL), "anthropic": ("Anthropic", ANTHROPIC_BASE_URL)}

# The adapters' default `max_tokens`: the most any reply may use.
DEFAULT_MAX_TOKENS = 4096
# The forced tool's description, for structured output through a tool call.
TOOL_DESCRIPTION = "Record your answer. Call this with your complete reply."


def reply_cap(requested: int | None, ceiling: int) -> int:
    """The `max_tokens` to send: the request's own, at most the adapter's `ceiling`."""
    return ceiling if requested is None else max(1, min(requested, ceiling))


def more_room(name: str, task: str, cap: int, ceiling: int, budget: Budget, *, text: str,
              usage: Usage | None, data: object = None, problem: str = "") -> int:
    """Twice `cap` (at most `ceiling`), to ask a reply cut at `cap` again with (a retry); `Cut`
    (naming the `problem` it caused, holding `text`, `data` and the `usage` spent) when the
    adapter or the budget allows no more."""
    if cap >= ceiling or not budget.can_call():
        note = f"the reply was cut short at max_tokens={cap}, so it is incomplete"
        raise Cut(f"{name}: the reply to task {task!r} was cut short "
                  f"({f'{problem} ({note})' if problem else note})", text=text, data=data,
                  at_cap=True, usage=usage)
    more = min(ceiling, cap * 2)
    logger.warning("%s: the reply to task %r was cut short at max_tokens=%d; asking again with "
                   "%d", name, task, cap, more)
    budget.next_call("retry")
    return more


def answer(schema: Mapping[str, object], text: str, data: object, budget: Budget
           ) -> tuple[object, str | None]:
    """A structured reply's value (`data`, else the JSON `text` holds) and why it is no answer to
    an object `schema` (None when it is one, or `schema` is of another type): no JSON, not an
    object, or without a key the top-level `required` lists, unless the task reads the keys itself
    (`Budget.task_reads`). A task that reads any reply is the caller's to pass up."""
    try:
        data = decode_json(text) if data is None else data
    except ValueError as exc:
        return None, str(exc)
    if schema.get("type") != "object":
        return data, None
    if not isinstance(data, dict):
        return data, f"the reply must be a JSON object, got {preview(data)}"
    if budget.task_reads == "keys":
        return data, None
    required = schema.get("required")
    missing = [key for key in required if key not in data] if isinstance(required, list) else ()
    if not missing:
        return data, None
    return data, f"the reply lacks {', '.join(map(repr, missing))}, which the schema requires"


def re_ask(name: str, request: LLMRequest, asked: LLMRequest, reply: LLMResponse, problem: str,
           budget: Budget) -> LLMRequest:
    """`request` again, showing `reply` and its `problem` (`re_asked`), charged to `budget` as its
    re-ask; LLMReplyError naming `problem` when `asked` is the re-ask or `budget` allows none."""
    again = asked is not request
    if again or not budget.can_re_ask():
        raise LLMReplyError(f"{name}: the reply to task {request.task!r} is not valid JSON for its "
                            f"schema{' after a re-ask' if again else ''}: {problem}")
    budget.next_call("re_ask")
    return re_asked(request, reply, problem)


def adapt(exc: AdapterError, budget: Budget, refuses: Callable[[HTTPFailure], bool] | None,
          switch: Callable[[HTTPFailure], None]) -> None:
    """When `refuses` recognises the refusal behind `exc`, `switch` adapts the adapter and a retry
    is charged to `budget`; otherwise (and for a prompt past the model's context, whatever else
    its message names) `exc` is raised again."""
    failure = exc.__cause__
    if (refuses is None or not isinstance(failure, HTTPFailure) or failure.context_overflow
            or not refuses(failure)):
        raise exc
    switch(failure)
    if not budget.can_call():
        raise exc
    budget.next_call("retry")


def warn_cut(name: str, task: str, cap: int | None) -> None:
    """Logs that a free-text reply stopped at `cap`, or (None) when the model's context filled."""
    logger.warning("%s: the reply to task %r was cut short %s, so it is incomplete", name, task,
                   "the model's context filled" if cap is None else f"at max_tokens={cap}")


def example_of(schema: Mapping[str, object]) -> object:
    """A value shaped as `schema` says, to show a model what an answer looks like."""
    choices = schema.get("anyOf")
    if isinstance(choices, list):
        # The first alternative that is not null: a model shown null copies it.
        shown = [c for c in choices if isinstance(c, Mapping) and c.get("type") != "null"]
        return example_of(shown[0]) if shown else None
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = schema.get("required")
        wanted = required if isinstance(required, list) and required else list(properties)
        return {key: example_of(value if isinstance(value := properties.get(key), Mapping)
                                else {}) for key in wanted}
    if kind == "array":
        items = schema.get("items")
        return [example_of(items)] if isinstance(items, Mapping) else []
    if kind == "string":
        return "..."
    low, high = schema.get("minimum"), schema.get("maximum")
    low = low if isinstance(low, int | float) else None
    high = high if isinstance(high, int | float) else None
    if kind == "integer":
        return int(low or 0)
    if kind == "number":
        return (low + high) / 2 if low is not None and high is not None else low or 0.5
    if kind == "boolean":
        return False
    return None


def tool_spec(tool: Mapping[str, object], schema_key: str) -> JSONObject:
    """A tool in mnemo's, OpenAI's or Anthropic's shape as a provider's: its name, its parameters'
    schema under `schema_key`, and its description if it has one."""
    inner = tool.get("function") if tool.get("type") == "function" else tool
    if not isinstance(inner, Mapping) or not isinstance(inner.get("name"), str):
        raise ValueError(f"a tool needs a name, got {tool!r}")
    parameters = inner.get("parameters", inner.get("input_schema"))
    if not isinstance(parameters, dict):
        parameters = {"type": "object", "properties": {}}
    spec: JSONObject = {"name": inner["name"], schema_key: parameters}
    if isinstance(description := inner.get("description"), str) and description:
        spec["description"] = description
    return spec


def tool_call(adapter: str, name: str, arguments: object, call_id: str | None) -> ToolCall:
    """A reply's call of tool `name` (no arguments: {}); LLMError when they are no JSON object."""
    if not isinstance(arguments := {} if arguments is None else arguments, dict):
        raise LLMError(f"{adapter}: the arguments of tool call {name!r} are not a JSON object: "
                       f"{arguments!r}")
    return ToolCall(name, arguments, call_id)


def price_of(model: str, prices: Mapping[str, tuple[float, float]]) -> tuple[float, float] | None:
    """The (input, output) $/Mtok of `model`: its own entry or its longest "-" prefix."""
    if model in prices:
        return prices[model]
    matches = [name for name in prices if model.startswith(name + "-")]
    return prices[max(matches, key=len)] if matches else None


class HTTPModel(Closing):
    """What the HTTP adapters share: the key (`api_key`, else its variable's), one `Transport` to
    `base_url`, and `name`, the URI of `provider` (or, to another server, of `scheme`). Raises
    InvalidInputError for a bad limit, or no key for the provider's own API."""

    def __init__(
        self,
        model: str,
        base_url: str,
        api_key: str | None,
        prices: Mapping[str, tuple[float, float]] | None,
        options: HTTPOptions,
        *,
        provider: str,
        scheme: str | None = None,
        error: type[AdapterError],
        timeout_error: type[AdapterError] | None = None,
        kind: str = "model",
    ) -> None:
        self.model = model
        self.base_url = base_url = base_url.rstrip("/")
        (label, provider_url), key_variable = _PROVIDERS[provider], KEY_VARIABLES[provider]
        key = api_key if api_key is not None else os.environ.get(key_variable)
        network = options.get("transport")
        if not key and base_url == provider_url and (
                network is None or isinstance(network, httpx.AsyncHTTPTransport)):
            raise InvalidInputError(
                f"the {label} API needs a key: pass api_key= or set {key_variable}")
        self.name = (f"{provider}:{model}" if base_url == provider_url
                     else f"{scheme or provider}:{model}@{base_url}")
        self._price = price_of(model, {**DEFAULT_PRICES, **(prices or {})})
        self.total_usage = Usage()
        self.transport = self._http = Transport(
            base_url, name=f"{base_url} ({kind} {model})", error=error,
            timeout_error=timeout_error, headers=self._headers(key or None), **options)
        self.concurrency: Limit = self._http.limit
        self.retry_policy = self._http.retry_policy

    def _headers(self, key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if key else {}

    def server_profile(self) -> ServerProfile:
        """What this adapter learned of its server, for the next one (`adopt_server_profile`)."""
        return ServerProfile(self._http.limit.state())

    def adopt_server_profile(self, stored: ServerProfile) -> None:
        """Starts from an earlier adapter's `server_profile`; a pinned concurrency stays."""
        if stored.concurrency is not None:
            self._http.limit.restore(stored.concurrency)

    def _usage(self, input_tokens: int | None, output_tokens: int | None) -> Usage | None:
        """A reply's usage (one call), priced, added to `total_usage`; None when it reported
        none."""
        if input_tokens is None and output_tokens is None:
            return None
        inp, out, price = input_tokens or 0, output_tokens or 0, self._price
        usage = Usage(inp, out, None if price is None else (inp * price[0] + out * price[1]) / 1e6,
                      calls=1)
        self.total_usage += usage
        return usage

    async def _post(self, path: str, payload: Mapping[str, object], reply: type[R], *,
                    budget: Budget, refusal: Callable[[HTTPFailure], bool] | None = None,
                    kind: str) -> R:
        """`Transport.post_json`; LLMContextError for a prompt longer than the model's context."""
        try:
            return await self._http.post_json(path, payload, reply, budget=budget,
                                              refusal=refusal, kind=kind)
        except LLMError as exc:
            if isinstance(exc.__cause__, HTTPFailure) and exc.__cause__.context_overflow:
                raise LLMContextError(str(exc)) from exc.__cause__
            raise

    async def aclose(self) -> None:
        await self._http.aclose()
