"""A task asked of an LLM: its request (a system prompt and one user message whose inputs follow
`INPUT:` as JSON), and the typed value `read_reply` reads from its reply, re-asked by `ask`."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress
from dataclasses import replace
from typing import Any, TypeVar

import msgspec
from msgspec import inspect as mi
from partial_json_parser import Allow, fix_fast

from mnemo import cpu
from mnemo.calls.retry import RetryPolicy, policy_of, storable, task_budget
from mnemo.calls.schema import Reply
from mnemo.errors import LLMContextError, LLMError, LLMReplyError, LLMTimeout
from mnemo.ports import LLM, JSONObject, LLMRequest, LLMResponse, Usage

log = logging.getLogger("mnemo")
T = TypeVar("T")
R = TypeVar("R", bound=Reply)

# A type in words, by its name in msgspec's messages or its `msgspec.inspect` class.
_NAMES: dict[object, str] = {
    "array": "a list", "object": "an object", "str": "a string", "int": "an integer",
    "float": "a number", "null": "null", "bool": "a boolean", mi.ListType: "a list",
    mi.StructType: "an object", mi.StrType: "a string", mi.IntType: "an integer",
    mi.FloatType: "a number", mi.BoolType: "a boolean", mi.NoneType: "null"}
_EXPECTED = re.compile(r"^Expected `([^`]+)`(?:, got `([^`]+)`)?(?: - at `([^`]+)`)?$")
_MISSING = re.compile(r"^Object missing required field `([^`]+)`(?: - at `([^`]+)`)?$")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def read_reply(response: LLMResponse, kind: type[R], task: str) -> R:
    """`response` (its `reply_data`) as a `kind`; ValueError names the field that does not match."""
    data = reply_data(response, strict=True)
    if not isinstance(data, dict):
        raise ValueError(f"{task} reply must be a JSON object, got {preview(data)}")
    try:
        return msgspec.convert(data, kind, strict=False)
    except msgspec.ValidationError as exc:
        raise ValueError(_problem(str(exc), data, kind, task)) from None


def reply_data(response: LLMResponse, *, strict: bool = False) -> object:
    """A reply's `data`, else its `text`'s JSON; None (ValueError when `strict`) without one."""
    if response.data is not None or not response.text.strip():
        return response.data
    try:
        return storable(decode_json(response.text))  # as `LimitedLLM` leaves `data`
    except ValueError:
        if strict:
            raise
        return None


def unit_score(value: object) -> float | None:
    """A JSON number (or numeric string) clamped into [0, 1]; None for anything else or NaN."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return float(min(1.0, max(0.0, value)))


def preview(value: object) -> str:
    """`repr(value)` cut to 120 characters."""
    shown = repr(value)
    return shown if len(shown) <= 120 else shown[:117] + "..."


_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?```\s*$", re.DOTALL)
_LENIENT = json.JSONDecoder(strict=False)
_DECODER = msgspec.json.Decoder()
# The most braces a reply amid prose is read from.
_STARTS = 64


def decode_json(text: str) -> object:
    """The JSON value in a reply's text: bare, in a Markdown fence, or one object amid prose."""
    fenced = _FENCE.match(text.strip())
    stripped = fenced.group(1).strip() if fenced else text.strip()
    if not stripped:
        raise ValueError("the reply is empty, expected a JSON object")
    with suppress(msgspec.DecodeError):
        return _DECODER.decode(stripped)
    try:
        return json.loads(stripped, strict=False)
    except json.JSONDecodeError as exc:
        found = _last_object(stripped)
        if found is not None:
            return found
        raise ValueError(f"the reply is not valid JSON ({exc.msg} at char {exc.pos})") from exc


def _last_object(text: str) -> object | None:
    """The last whole JSON object in prose that may hold braces of its own (a reasoning
    model's draft, "the keys {a, b}"), read from at most `_STARTS` braces; None past an
    object cut short (the objects inside it are not the reply)."""
    found, start = None, text.find("{")
    for _ in range(_STARTS):
        if start < 0:
            break
        try:
            found, end = _LENIENT.raw_decode(text, start)
        except json.JSONDecodeError as exc:
            # Only an error at the end (a partial `false` at most) or in a string left open
            # can be a cut object's, asked of the partial parser; prose fails before.
            if exc.pos >= len(text) - len("false") or exc.msg.startswith("Unterminated"):
                with suppress(Exception):  # the parser's own errors: not a cut object
                    json.loads("".join(fix_fast(text[start:], Allow.ALL)), strict=False)
                    return None
            end = start + 1
        start = text.find("{", end)
    return found


class Cut(LLMReplyError, LLMContextError):
    """A structured reply that stopped before its end: at its max_tokens (`at_cap`), or when the
    model's context filled. `text` is what came, `data` what the provider read of it, `usage`
    what the replies given up on spent."""

    def __init__(self, message: str, *, text: str, data: object = None, at_cap: bool,
                 usage: Usage | None = None) -> None:
        super().__init__(message)
        self.text, self.data, self.at_cap, self.usage = text, data, at_cap, usage


def salvage(cut: Cut) -> JSONObject | None:
    """A cut reply's JSON object without the value cut midway (nor the last item of its last list
    when the cut fell inside it); None when no item is left."""
    stripped = cut.text.strip().removesuffix("```")
    start = stripped.find("{")
    value: object = cut.data
    inside_item = True
    if start >= 0:
        try:
            head, tail = fix_fast(stripped[start:], Allow.OBJ | Allow.ARR)
            value = json.loads(head + tail)
        except Exception:  # the parser's own errors: nothing whole in it
            return None
        # The containers left open: the root, a list of it, and an item of that list.
        inside_item = len(tail) > 2
    if not isinstance(value, dict) or not value:
        return None
    last = next(reversed(value))
    if inside_item and isinstance(value[last], list):
        value[last] = value[last][:-1]
    return value if any(isinstance(v, list) and v for v in value.values()) else None


def _problem(message: str, data: JSONObject, kind: type[Reply], task: str) -> str:
    missing = _MISSING.match(message)
    if missing:
        name, at = missing.group(1), _where(missing.group(2) or "$")
        wanted = _field_type(kind, (missing.group(2) or "$") + f".{name}")
        if not at:
            return f"{task} reply has no {name!r} field ({name} must be {wanted}): {preview(data)}"
        return f"{at}.{name} must be {wanted}, got nothing"
    expected = _EXPECTED.match(message)
    if expected and expected.group(3):
        path = expected.group(3)
        return (f"{_where(path)} must be {_phrase(expected.group(1))}, got "
                f"{preview(_value_at(data, path))}")
    located = re.search(r" - at `([^`]+)`$", message)
    where = _where(located.group(1)) if located else f"{task} reply"
    return f"{where}: {message.split(' - at ')[0]}"


def _phrase(expected: str) -> str:
    words = [_NAMES.get(part.strip().split(" ")[0], part.strip()) for part in expected.split("|")]
    return " or ".join(words)


def _where(path: str) -> str:
    return path.removeprefix("$").removeprefix(".")


def _value_at(data: object, path: str) -> object:
    for key, index in _STEP.findall(path):
        if key and isinstance(data, dict):
            data = data.get(key)
        elif index and isinstance(data, list) and int(index) < len(data):
            data = data[int(index)]
        else:
            return None
    return data


def _field_type(kind: type[Reply], path: str) -> str:
    info = mi.type_info(kind)
    for key, _ in _STEP.findall(path):
        info = _bare(info)
        if isinstance(info, mi.ListType) and not key:
            info = info.item_type
        elif isinstance(info, mi.StructType):
            info = next((f.type for f in info.fields if f.name == key), info)
    return _describe(_bare(info))


def _bare(info: mi.Type) -> mi.Type:
    return info.type if isinstance(info, mi.Metadata) else info


def _describe(info: mi.Type) -> str:
    if isinstance(info, mi.UnionType):
        return " or ".join(_describe(_bare(t)) for t in info.types)
    return _NAMES.get(type(info), "a value")


INPUT_MARKER = "\nINPUT:\n"


def task_request(
    task: str,
    *,
    system: str,
    instructions: str,
    inputs: Mapping[str, object],
    schema: JSONObject | None = None,
    max_tokens: int | None = None,
) -> LLMRequest:
    """One task's request: instructions, then the inputs as compact JSON (`cpu.dumps`)."""
    content = instructions.strip() + INPUT_MARKER + cpu.dumps(inputs)
    return LLMRequest(
        task=task,
        system=system,
        messages=[{"role": "user", "content": content}],
        schema=schema,
        max_tokens=max_tokens,
    )


def input_json(request: LLMRequest) -> str:
    """The JSON text of the inputs `task_request` put in the request ("{}" when absent)."""
    for message in reversed(request.messages):
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str) and INPUT_MARKER in content:
            return content.rsplit(INPUT_MARKER, 1)[1]
    return "{}"


def task_inputs(request: LLMRequest) -> JSONObject:
    """The inputs `task_request` put in the request ({} when absent)."""
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
    any_reply: bool = False,
) -> T:
    """`parse` of the reply to `request`, asking again (showing the problem) while it raises
    ValueError, within the task's budget. A `Cut` reply is `salvage`d; a prompt the context refused
    is `shorten`ed, at most `MAX_SHRINKS` times. A reply still unusable when the re-asks are spent
    gives `unusable`, else LLMReplyError (from the last cut or parse error); an LLM's error is
    raised as an LLMError. `any_reply`: `parse` reads a reply that is no JSON for the schema
    (prose, a bare value), which an adapter then passes up rather than re-asking."""
    with task_budget(policy or policy_of(llm)) as budget:
        budget.task_reads = "any" if any_reply else "keys"
        shrinks = 0
        asked = request
        while True:
            before = budget.mark()
            try:
                response = await llm.generate(asked)
            except Exception as exc:
                budget.charge_bare(before)
                capped = exc if isinstance(exc, Cut) and exc.at_cap else None
                whole = salvage(exc) if isinstance(exc, Cut) else None
                with suppress(ValueError):
                    if whole is not None and (kept := parse(LLMResponse(data=whole))) is not None:
                        log.warning("task %s: the reply was cut short; keeping the items it "
                                    "held whole", request.task)
                        return kept
                shrunk = ((shorten or shorter)(request)
                          if isinstance(exc, LLMContextError) and capped is None else None)
                if shrunk is not None and shrinks < MAX_SHRINKS and budget.can_call():
                    log.warning("task %s: the prompt was longer than the model's context; "
                                "asking again with shorter inputs", request.task)
                    request = asked = shrunk
                    shrinks += 1
                    budget.next_call("retry")
                    continue
                if capped is None:
                    if isinstance(exc, LLMReplyError) and unusable is not None:
                        return _stands_for(request, unusable, exc)
                    kind = next((k for k in (LLMContextError, LLMReplyError, LLMTimeout)
                                 if isinstance(exc, k)), LLMError)
                    raise kind(f"the LLM failed on task {request.task!r}: {exc!r}") from exc
                response, problem = LLMResponse(text=capped.text, data=capped.data), str(exc)
                cause: Exception = capped
            else:
                budget.charge_bare(before)
                try:
                    return parse(response)
                except ValueError as exc:
                    problem, cause = str(exc), exc
            if not budget.can_re_ask():
                error = LLMReplyError(
                    f"the LLM's reply to task {request.task!r} was unusable after "
                    f"{budget.describe()}: {problem}"
                )
                if unusable is not None:
                    return _stands_for(request, unusable, error)
                raise error from cause
            asked = re_asked(request, response, problem)
            budget.next_call("re_ask")


def re_asked(request: LLMRequest, response: LLMResponse, problem: str) -> LLMRequest:
    """`request`, then the unusable reply (if not empty) and what was wrong with it."""
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


# How many times `ask` shortens a prompt the model's context refused (to about half its
# inputs' text each time).
MAX_SHRINKS = 2
# Texts shorter than this are never cut; a cut text keeps its start and its end.
SHORT_TEXT = 160


def shorter(request: LLMRequest) -> LLMRequest | None:
    """`request` with its inputs' text about halved (the older half of "recent" dropped, then the
    longest texts cut in the middle); None when nothing can be cut."""
    inputs = task_inputs(request)
    if not inputs:
        return None
    recent = inputs.get("recent")
    if isinstance(recent, list) and len(recent) > 1:
        inputs["recent"] = recent[len(recent) // 2:]
    texts = list(_texts(inputs))
    total = sum(len(text) for _, _, text in texts)
    budget = total // 2
    for holder, key, text in sorted(texts, key=lambda t: -len(t[2])):
        if total <= budget or len(text) <= SHORT_TEXT:
            break
        keep = max(SHORT_TEXT, len(text) - (total - budget))
        holder[key] = f"{text[: keep // 2]} … {text[len(text) - keep // 2:]}"
        total -= len(text) - len(holder[key])
    content = request.messages[-1].get("content") if request.messages else None
    head, marker, before = (content if isinstance(content, str) else "").rpartition(INPUT_MARKER)
    body = json.dumps(inputs, ensure_ascii=False)
    if not marker or len(body) >= len(before):
        return None
    return replace(request, messages=[*request.messages[:-1], {
        **request.messages[-1], "content": head + marker + body}])


def _texts(value: Any) -> Iterator[tuple[Any, Any, str]]:
    """Every string inside a JSON value, with its container and key or index."""
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
