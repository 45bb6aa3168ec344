"""A task asked of an LLM: the request it is sent as, and `ask`, which reads its reply (through
the task's parser, on top of `mnemo.calls.reply`), asks again showing the model what was wrong
with an unusable one, keeps what a reply cut short holds whole, and shortens a prompt the
model's context refused.

Every task mnemo asks of an LLM is one `LLMRequest`: a system prompt saying what to do, and one
user message holding the instructions followed by the task's inputs as a JSON document after
the line `INPUT:`. Real models read that JSON like any prompt; the offline LLM parses it back
with `task_inputs`, so the two never drift apart.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from mnemo import cpu
from mnemo.calls.reply import Cut, salvage
from mnemo.calls.retry import RetryPolicy, policy_of, task_budget
from mnemo.errors import LLMContextError, LLMError, LLMReplyError
from mnemo.ports import LLM, JSONObject, LLMRequest, LLMResponse

log = logging.getLogger("mnemo")

INPUT_MARKER = "\nINPUT:\n"

T = TypeVar("T")


def task_request(
    task: str,
    *,
    system: str,
    instructions: str,
    inputs: Mapping[str, object],
    schema: JSONObject | None = None,
    max_tokens: int | None = None,
) -> LLMRequest:
    """Builds the request for one task: instructions, then the inputs as JSON."""
    # No `indent`: it would switch json.dumps to its slow pure-Python encoder, on the append
    # path (BENCHMARKS.md). `cpu.dumps` keeps each C call short for a long trajectory's steps.
    content = instructions.strip() + INPUT_MARKER + cpu.dumps(inputs)
    return LLMRequest(
        task=task,
        system=system,
        messages=[{"role": "user", "content": content}],
        schema=schema,
        max_tokens=max_tokens,
    )


def input_json(request: LLMRequest) -> str:
    """The JSON text of the inputs `task_request` put into the request's last user message
    ("{}" when absent)."""
    for message in reversed(request.messages):
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str) and INPUT_MARKER in content:
            return content.rsplit(INPUT_MARKER, 1)[1]
    return "{}"


def task_inputs(request: LLMRequest) -> JSONObject:
    """The inputs `task_request` put into the request's last user message ({} when absent)."""
    try:
        value = json.loads(input_json(request))
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


async def ask(
    llm: LLM,
    request: LLMRequest,
    parse: Callable[[LLMResponse], T],
    *,
    policy: RetryPolicy | None = None,
    unusable: T | None = None,
    shorten: Callable[[LLMRequest], LLMRequest | None] | None = None,
) -> T:
    """Sends `request` and parses the reply, asking again when the reply is unusable.

    `parse` reads the reply (`mnemo.calls.reply.read_reply` into the task's struct) and
    raises `ValueError` for one it cannot use: the model is then shown its reply and the
    problem, and asked again. The task has one budget (`policy`, else the LLM's
    `retry_policy`, else the default; see `mnemo.calls.retry`): the adapter's transport
    retries and the re-asks made here count against it. An exception from the LLM is not
    retried here: the adapter has already spent what it could.

    A reply cut short (`mnemo.calls.reply.Cut`) is read for what it holds whole
    (`salvage`); with nothing whole in it, a reply cut at its max_tokens is unusable like any
    other, and one cut with room left (the model's context filled) is sent again shortened,
    as a prompt the model's context refused (`LLMContextError`) is: by `shorten` (default
    `shorter`), at most `MAX_SHRINKS` times. A task that shortens its own inputs (it knows
    what may go) passes a `shorten` that returns None, and gets the error.

    `unusable`, when given, is what a reply still unusable once the re-asks are spent stands
    for (a reward's neutral 0.5, as the API contract says), returned with a warning instead of
    the error. A failure of the LLM itself (an HTTP error, a timeout) raises all the same.

    Raises:
        LLMError: the LLM raised (its exception is the `__cause__`), or the budget ran out on
            unusable replies (`LLMReplyError`; the message says what was wrong with the last
            one) and no `unusable` was given.
    """
    with task_budget(policy or policy_of(llm)) as budget:
        shrinks = 0
        asked = request
        while True:
            before = budget.counts()
            try:
                response = await llm.generate(asked)
            except Exception as exc:
                budget.charge_bare(before)
                if isinstance(exc, Cut):
                    kept = _kept(exc, parse)
                    if kept is not None:
                        log.warning("task %s: the reply was cut short; keeping the items it "
                                    "held whole", request.task)
                        return kept
                shrunk = ((shorten or shorter)(request)
                          if isinstance(exc, LLMContextError)
                          and not (isinstance(exc, Cut) and exc.at_cap) else None)
                if shrunk is not None and shrinks < MAX_SHRINKS and budget.can_call():
                    log.warning("task %s: the prompt was longer than the model's context; "
                                "asking again with shorter inputs", request.task)
                    request = asked = shrunk
                    shrinks += 1
                    budget.next_call("retry")
                    continue
                if not (isinstance(exc, Cut) and exc.at_cap):
                    if isinstance(exc, LLMReplyError) and unusable is not None:
                        return _stands_for(request, unusable, exc)
                    kind = (LLMContextError if isinstance(exc, LLMContextError) else
                            LLMReplyError if isinstance(exc, LLMReplyError) else LLMError)
                    raise kind(f"the LLM failed on task {request.task!r}: {exc!r}") from exc
                response, problem = LLMResponse(text=exc.text, data=exc.data), str(exc)
            else:
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
            asked = re_asked(request, response, problem)
            budget.next_call("re_ask")


def re_asked(request: LLMRequest, response: LLMResponse, problem: str) -> LLMRequest:
    """`request` again, followed by the model's unusable reply and what was wrong with it; as
    it was when the reply was empty (a provider refuses an empty turn)."""
    reply = response.text if response.text.strip() or response.data is None else json.dumps(
        response.data, ensure_ascii=False)
    if not reply.strip():
        return request
    return replace(request, messages=[
        *request.messages,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": f"Your reply could not be used: {problem}. Reply again"
         + (" with JSON only." if request.schema is not None else ".")},
    ])


def _kept(cut: Cut, parse: Callable[[LLMResponse], T]) -> T | None:
    """`parse` of what `cut` holds whole, or None when nothing whole is usable."""
    whole = salvage(cut)
    if whole is None:
        return None
    try:
        return parse(LLMResponse(data=whole))
    except ValueError:
        return None


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
