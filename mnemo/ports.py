"""The two ports mnemo talks through: an `LLM` and an `Embedder`, and their values.

Every task mnemo asks of an LLM is one `LLMRequest`: a system prompt saying what to do, and one
user message holding the instructions followed by the task's inputs as a JSON document after
the line `INPUT:`. Real models read that JSON like any prompt; the offline LLM parses it back
with `task_inputs`, so the two never drift apart.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar, runtime_checkable

import anyio
import numpy as np
import numpy.typing as npt

from mnemo import deadline
from mnemo.errors import InvalidInputError, LLMContextError, LLMError, LLMReplyError
from mnemo.retry import RetryPolicy, policy_of, task_budget

log = logging.getLogger("mnemo")

INPUT_MARKER = "\nINPUT:\n"

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens spent by one call (or summed over many), and its cost when priced.

    `calls` counts the model calls made, of which `retries` were transport retries and
    `re_asks` were asked again after an unusable reply (`mnemo.retry` says what a task may
    spend). `saved_calls`, `saved_input_tokens` and `saved_output_tokens` are what a retried
    extraction did not spend again because a task's earlier result was kept
    (`mnemo.extraction.memo`). Equality compares what was spent (tokens and cost), not how many
    calls it took nor what was saved.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None
    calls: int = field(default=0, compare=False)
    retries: int = field(default=0, compare=False)
    re_asks: int = field(default=0, compare=False)
    saved_calls: int = field(default=0, compare=False)
    saved_input_tokens: int = field(default=0, compare=False)
    saved_output_tokens: int = field(default=0, compare=False)

    def __add__(self, other: Usage) -> Usage:
        cost = None if self.cost is None and other.cost is None else (self.cost or 0.0) + (
            other.cost or 0.0
        )
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            cost,
            calls=self.calls + other.calls,
            retries=self.retries + other.retries,
            re_asks=self.re_asks + other.re_asks,
            saved_calls=self.saved_calls + other.saved_calls,
            saved_input_tokens=self.saved_input_tokens + other.saved_input_tokens,
            saved_output_tokens=self.saved_output_tokens + other.saved_output_tokens,
        )


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call in an LLM reply."""

    name: str
    arguments: dict[str, object]
    id: str | None = None


# `LLMRequest.tool_choice` asking for a call of any of the request's tools.
REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class LLMRequest:
    """One task for the LLM. When `schema` is set, the reply's `data` must match it.

    `tool_choice` says which of `tools` the reply must call: None leaves it to the model,
    `REQUIRED` ("required") asks for a call of any of them, and a tool's name for a call of
    that one. Each adapter sends it in its provider's form; a server that ignores it may
    still answer in prose.
    """

    task: str
    system: str
    messages: Sequence[Mapping[str, object]]
    schema: dict[str, object] | None = None
    tools: Sequence[Mapping[str, object]] | None = None
    max_tokens: int | None = None
    tool_choice: str | None = None


@dataclass(frozen=True, slots=True)
class LLMResponse:
    """An LLM reply: free `text`, schema-shaped `data`, and tool calls."""

    text: str = ""
    data: object = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage | None = None


@runtime_checkable
class LLM(Protocol):
    async def generate(self, request: LLMRequest) -> LLMResponse: ...


# What an embedder returns: one vector per text, as nested sequences or a 2-D numpy array.
Vectors = Sequence[Sequence[float]] | npt.NDArray[np.floating[Any]]


@runtime_checkable
class Embedder(Protocol):
    dim: int

    async def embed(self, texts: Sequence[str]) -> Vectors: ...


def check_models(llm: object, embedder: object) -> None:
    """Refuses, before anything is stored, an `llm` or `embedder` that is neither None nor an
    object of the port (a model's name given as a string, say: it failed at the first append,
    or with a raw AttributeError at `open_repo`). The embedder's `dim` is not read: an
    `OpenAIEmbedder` learns it from its first reply.

    Raises:
        InvalidInputError: what was given instead, and what to give.
    """
    if llm is not None and not callable(getattr(llm, "generate", None)):
        raise InvalidInputError(
            f"llm must be an object with an async generate(request) (mnemo.LLM), got "
            f"{llm!r}; a model's URI goes through mnemo.llm_from_uri"
        )
    if embedder is not None and not callable(getattr(embedder, "embed", None)):
        raise InvalidInputError(
            f"embedder must be an object with dim and an async embed(texts) (mnemo.Embedder), "
            f"got {embedder!r}; a model's URI goes through mnemo.embedder_from_uri"
        )


async def detect_dim(embedder: Embedder) -> int:
    """The embedder's dimension, letting one that learns it from its first reply (an
    `OpenAIEmbedder` without `dim`) ask first: every path that needs the dimension awaits
    this rather than reading `dim`, which raises while it is unknown.

    Raises:
        EmbeddingError: the embedder's request failed.
    """
    detect = getattr(embedder, "detect_dim", None)
    if detect is not None:
        await detect()
    return embedder.dim


def model_name(model: object) -> str:
    """What identifies a model (an LLM or an embedder): its `name` when it has one (the URI it
    is built from, e.g. "openai:gpt-4o-mini"), else its class's qualified name. A repo records
    its models under it, and work is resumed only by a Memory whose model has the same."""
    name = getattr(model, "name", None)
    if isinstance(name, str) and name:
        return name
    kind = type(model)
    return f"{kind.__module__}.{kind.__qualname__}"


class LimitedLLM:
    """An LLM whose calls each wait for a slot of its provider's limiter
    (`Config.llm_concurrency`), and whose replies' usage goes to `meter`, with the calls
    (retries and re-asks among them) each `generate` charged to its task's budget."""

    def __init__(
        self,
        llm: LLM,
        slots: anyio.CapacityLimiter,
        meter: Callable[[Usage], None] | None = None,
    ) -> None:
        self._llm, self._slots, self._meter = llm, slots, meter

    @property
    def retry_policy(self) -> RetryPolicy:
        """The wrapped LLM's policy (`mnemo.retry.policy_of`)."""
        return policy_of(self._llm)

    async def generate(self, request: LLMRequest) -> LLMResponse:
        with task_budget(self.retry_policy) as budget:
            before = budget.counts()
            try:
                async with slot(self._slots):
                    response = await self._llm.generate(request)
            finally:
                # Booked even when the call failed: a 429 storm's calls were spent all the same.
                budget.charge_bare(before)
                if self._meter is not None:
                    calls, retries, re_asks = budget.counts()
                    self._meter(Usage(calls=calls - before[0], retries=retries - before[1],
                                      re_asks=re_asks - before[2]))
        if self._meter is not None and response.usage is not None:
            self._meter(response.usage)
        return response


def book(llm: LLM, usage: Usage) -> None:
    """Books `usage` that no reply carried (what a retry saved) on `llm`'s meter, when `llm` is
    a metered `LimitedLLM`; otherwise there is nowhere to book it."""
    if isinstance(llm, LimitedLLM) and llm._meter is not None:
        llm._meter(usage)


@asynccontextmanager
async def slot(limiter: anyio.CapacityLimiter) -> AsyncIterator[None]:
    """Holds one token of `limiter`, taking a free one without a trip through the event loop
    (anyio's `acquire` always yields once, about 10 µs, which the append path pays per call).
    Waiting for one counts against no deadline (`mnemo.deadline.waiting`)."""
    try:
        limiter.acquire_nowait()
    except anyio.WouldBlock:
        with deadline.waiting():
            await limiter.acquire()
    try:
        yield
    finally:
        limiter.release()


def task_request(
    task: str,
    *,
    system: str,
    instructions: str,
    inputs: Mapping[str, object],
    schema: dict[str, object] | None = None,
    max_tokens: int | None = None,
) -> LLMRequest:
    """Builds the request for one task: instructions, then the inputs as JSON."""
    # Compact JSON: `indent` would switch json.dumps to its slow pure-Python encoder, on the
    # append path (BENCHMARKS.md).
    content = instructions.strip() + INPUT_MARKER + json.dumps(inputs, ensure_ascii=False)
    return LLMRequest(
        task=task,
        system=system,
        messages=[{"role": "user", "content": content}],
        schema=schema,
        max_tokens=max_tokens,
    )


def task_inputs(request: LLMRequest) -> dict[str, object]:
    """The inputs `task_request` put into the request's last user message ({} when absent)."""
    for message in reversed(request.messages):
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str) and INPUT_MARKER in content:
            try:
                value = json.loads(content.rsplit(INPUT_MARKER, 1)[1])
            except json.JSONDecodeError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def reply_data(response: LLMResponse) -> object:
    """A task reply's `data`, or its `text` parsed as JSON when an adapter left `data` unset
    (None when neither holds JSON). Every task parser reads its reply through this."""
    if response.data is not None or not isinstance(response.text, str) or not response.text.strip():
        return response.data
    try:
        return json.loads(response.text)
    except ValueError:
        return None


def preview(value: object) -> str:
    """`repr(value)` cut to 120 characters, for a parser's error message."""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


async def ask(
    llm: LLM,
    request: LLMRequest,
    parse: Callable[[LLMResponse], T],
    *,
    policy: RetryPolicy | None = None,
    unusable: T | None = None,
) -> T:
    """Sends `request` and parses the reply, asking again when the reply is unusable.

    The task has one budget (`policy`, else the LLM's `retry_policy`, else the default; see
    `mnemo.retry`): the adapter's transport retries and schema re-asks, and the re-asks made
    here for a reply `parse` rejects with `ValueError`, all count against it. An exception
    from the LLM is not retried here: the adapter has already spent what it could.

    `unusable`, when given, is what a reply still unusable once the re-asks are spent stands
    for (a reward's neutral 0.5, API.md), returned with a warning instead of the error: the
    adapter's schema check (`LLMReplyError`) and `parse` alike. A failure of the LLM itself
    (an HTTP error, a timeout) raises all the same.

    Raises:
        LLMError: the LLM raised (its exception is the `__cause__`), or the budget ran out on
            unusable replies (`LLMReplyError`; the message says what was wrong with the last
            one) and no `unusable` was given.
    """
    with task_budget(policy or policy_of(llm)) as budget:
        shrinks = 0
        while True:
            before = budget.counts()
            try:
                response = await llm.generate(request)
            except Exception as exc:
                budget.charge_bare(before)
                shrunk = shorter(request) if isinstance(exc, LLMContextError) else None
                if shrunk is not None and shrinks < MAX_SHRINKS and budget.can_call():
                    log.warning("task %s: the prompt was longer than the model's context; "
                                "asking again with shorter inputs", request.task)
                    request, shrinks = shrunk, shrinks + 1
                    budget.next_call("retry")
                    continue
                not_usable = isinstance(exc, LLMReplyError)  # it answered, not usably
                if not_usable and unusable is not None:
                    return _stands_for(request, unusable, exc)
                kind = (LLMReplyError if not_usable else
                        LLMContextError if isinstance(exc, LLMContextError) else LLMError)
                raise kind(f"the LLM failed on task {request.task!r}: {exc!r}") from exc
            budget.charge_bare(before)
            try:
                return parse(response)
            except ValueError as exc:
                problem = str(exc)
            if not budget.can_re_ask():
                error = LLMReplyError(
                    f"the LLM's reply to task {request.task!r} was unusable after "
                    f"{budget.describe()}: {problem}"
                )
                if unusable is not None:
                    return _stands_for(request, unusable, error)
                raise error
            budget.next_call("re_ask")


# How many times `ask` shortens a prompt the model's context refused, and how much of the
# inputs' text each time keeps.
MAX_SHRINKS = 2
SHRINK_TO = 0.5
# Texts shorter than this are never cut; a cut text keeps its start and its end.
SHORT_TEXT = 160


def shorter(request: LLMRequest) -> LLMRequest | None:
    """`request` with its inputs' text about halved, for a model whose context it did not
    fit: the oldest half of "recent" context dropped, then the longest texts cut in the
    middle ("start … end") until half of the text is left; None when nothing can be cut.
    The instructions and the task's own fields stay."""
    inputs = task_inputs(request)
    if not inputs:
        return None
    recent = inputs.get("recent")
    if isinstance(recent, list) and len(recent) > 1:
        inputs["recent"] = recent[len(recent) // 2:]
    texts = list(_texts(inputs))
    total = sum(len(text) for _, _, text in texts)
    budget = int(total * SHRINK_TO)
    for holder, key, text in sorted(texts, key=lambda t: -len(t[2])):
        if total <= budget or len(text) <= SHORT_TEXT:
            break
        keep = max(SHORT_TEXT, len(text) - (total - budget))
        holder[key] = f"{text[: keep // 2]} … {text[len(text) - keep // 2:]}"
        total -= len(text) - len(holder[key])
    content = request.messages[-1].get("content") if request.messages else None
    if not isinstance(content, str) or INPUT_MARKER not in content:
        return None
    head = content.rsplit(INPUT_MARKER, 1)[0]
    body = json.dumps(inputs, ensure_ascii=False)
    if len(body) >= len(content.rsplit(INPUT_MARKER, 1)[1]):
        return None
    messages = [*request.messages[:-1], {**request.messages[-1],
                                         "content": head + INPUT_MARKER + body}]
    return replace(request, messages=messages)


def _texts(value: Any) -> Iterator[tuple[Any, Any, str]]:
    """Every string inside `value` (a JSON value), with its container and key or index."""
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(item, str):
            yield value, key, item
        else:
            yield from _texts(item)


def _stands_for(request: LLMRequest, unusable: T, error: Exception) -> T:
    log.warning("task %s: the reply stayed unusable, taken as %r: %s", request.task, unusable,
                error)
    return unusable
