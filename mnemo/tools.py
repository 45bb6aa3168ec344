"""Agent tools over a `Memory`: JSON-schema specs for OpenAI and Anthropic and one executor
(`execute_tool`). Every answer is a bounded string, errors as "error: ..." text."""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import TYPE_CHECKING, Annotated

import msgspec
from msgspec import Meta

from mnemo.conversation.eviction import EvictionTools
from mnemo.conversation.model import Message
from mnemo.conversation.prompts import EVICTION_ARGUMENTS, EVICTION_TOOL_SPECS, ToolDict
from mnemo.conversation.render import ZONE_MESSAGE_CHARS, lines_within
from mnemo.conversation.search import render_hits
from mnemo.errors import InvalidInputError, NotFoundError
from mnemo.ports import JSONObject, ToolCall

if TYPE_CHECKING:
    from mnemo.graph.model import Node
    from mnemo.memory import Memory
    from mnemo.recall.engine import Recalled


# A tool's answer goes straight into the agent's context, so each is bounded (as over MCP).
MAX_OUTPUT_CHARS = 20_000  # the most any one tool answer holds (about 5k tokens)
SNIPPET_CHARS = 300  # each memory's text in a recall answer; get_node has the rest
PAGE_CHARS = 8_000  # one page of get_node (or of a viewed message over MCP)
MESSAGE_CHARS = 1_000  # each message or snapshot shown around a viewed message (MCP)
ERROR_CHARS = 500  # an error message (they may quote the input)


def clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, the cut marked with an ellipsis."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "\u2026"


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a long text: `text` starts at `offset` of `total` characters; `next_offset`
    is the next page's (None on the last)."""

    text: str
    offset: int
    total: int
    next_offset: int | None


def page(text: str, offset: int, size: int = PAGE_CHARS) -> Page:
    """The page of `text` starting at `offset` (empty past the end), at most `size` long."""
    start = min(max(offset, 0), len(text))
    end = min(start + size, len(text))
    return Page(text[start:end], start, len(text), end if end < len(text) else None)


# Each tool's arguments, read leniently (`strict=False`: "5" and 5.0 are 5): a struct whose
# docstring describes the tool and whose JSON schema is the tool's parameters.
_NonBlank = Annotated[str, Meta(pattern=r"\S")]


class _Search(msgspec.Struct):
    """Search earlier conversation messages (this thread and others) by keywords. Each word is
    matched with stemming and any word may match (AND, OR and NOT are plain words). Returns
    snippets with message ids for view_messages."""

    query: Annotated[_NonBlank, Meta(description="Keywords to look for.")]
    thread_id: Annotated[
        _NonBlank, Meta(description="Only this thread (omit to search every thread).")
    ] | None = None
    limit: Annotated[int, Meta(ge=1, le=20)] = 5


class _View(msgspec.Struct):
    """Show a message found by search_messages with the messages around it (tool outputs
    reduced to ok/error) and the summaries written just before and after it."""

    message_id: Annotated[_NonBlank, Meta(description="An id from search_messages.")]
    radius: Annotated[int, Meta(ge=0, le=30)] = 10


class _Recall(msgspec.Struct):
    """Recall long-term knowledge (facts and procedures learned in earlier work) relevant to a
    query. Each memory is shown as a snippet with its id; get_node shows one whole."""

    query: Annotated[_NonBlank, Meta(description="What to recall.")]
    k: Annotated[int, Meta(ge=1, le=30)] = 10


class _Node(msgspec.Struct):
    """Show one memory (an id from recall) whole: its text a page of PAGE_CHARS characters at a time
    (pass the next_offset it gives to read on), and its data."""

    node_id: Annotated[_NonBlank, Meta(description="An id from recall.")]
    offset: Annotated[int, Meta(ge=0)] = 0


def described(doc: str) -> str:
    """A tool's docstring as its description: `PAGE_CHARS` written as the page size."""
    return doc.replace("PAGE_CHARS", f"{PAGE_CHARS:,}")


def _spec(name: str, kind: type[msgspec.Struct]) -> ToolDict:
    (_,), defs = msgspec.json.schema_components([kind])
    schema = {k: v for k, v in defs[kind.__name__].items() if k not in ("title", "description")}
    # An optional argument is stated as its plain type (some providers refuse `anyOf` with
    # null in a tool's parameters); a null sent for it is still read as left out.
    schema["properties"] = {
        key: next(o for o in prop["anyOf"] if o != {"type": "null"})
        if {"type": "null"} in prop.get("anyOf", ()) else prop
        for key, prop in schema["properties"].items()}
    return {"name": name, "description": described(" ".join((kind.__doc__ or "").split())),
            "parameters": {**schema, "additionalProperties": False}}


_ARGUMENTS: dict[str, type[msgspec.Struct]] = {
    "search_messages": _Search, "view_messages": _View, "recall": _Recall, "get_node": _Node}
TOOLS: dict[str, ToolDict] = {
    **{name: _spec(name, kind) for name, kind in _ARGUMENTS.items()},
    **{t["name"]: t for t in EVICTION_TOOL_SPECS}}
MEMORY_TOOLS = tuple(_ARGUMENTS)
EVICTION_TOOL_NAMES = tuple(EVICTION_ARGUMENTS)


def _specs(names: Iterable[str]) -> list[ToolDict]:
    wanted = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in wanted if n not in TOOLS]
    if unknown:
        raise InvalidInputError(f"unknown tools {unknown}; known: {sorted(TOOLS)}")
    return [TOOLS[n] for n in wanted]


def openai_tools(names: Iterable[str] = MEMORY_TOOLS) -> list[JSONObject]:
    """The named tools (default: the memory tools) in OpenAI's format (InvalidInputError for an
    unknown name)."""
    return [{"type": "function", "function": {
        "name": spec["name"], "description": spec["description"], "parameters": spec["parameters"]}}
        for spec in _specs(names)]


def anthropic_tools(names: Iterable[str] = MEMORY_TOOLS) -> list[JSONObject]:
    """The named tools (default: the memory tools) in Anthropic's format (InvalidInputError for an
    unknown name)."""
    return [{"name": spec["name"], "description": spec["description"],
             "input_schema": spec["parameters"]} for spec in _specs(names)]


async def execute_tool(mem: Memory, call: ToolCall, **context: object) -> str:
    """Runs one tool call against `mem` and returns the text for the model (bounded, errors as
    "error: ..."); `thread_id`, `repo` and `eviction` give the tools their context."""
    return clip(await _execute(mem, call, context), MAX_OUTPUT_CHARS)


async def _execute(mem: Memory, call: ToolCall, context: dict[str, object]) -> str:
    args = _arguments(call.arguments)
    if args is None:
        return "error: the arguments must be a JSON object"
    repo = context.get("repo")
    try:
        if call.name in EVICTION_TOOL_NAMES:
            eviction = context.get("eviction")
            if not isinstance(eviction, EvictionTools):
                return f"error: {call.name} only runs during an eviction"
            return eviction.call(ToolCall(call.name, args, call.id))
        if call.name in ("recall", "get_node") and not isinstance(repo, str):
            return f"error: {call.name} is not available here (no repo)"
        kind = _ARGUMENTS.get(call.name)
        try:
            wanted = None if kind is None else msgspec.convert(args, kind, strict=False)
        except msgspec.ValidationError as exc:
            raise InvalidInputError(f"bad arguments: {exc}") from None
        if isinstance(wanted, _Search):
            thread = context.get("thread_id")
            return render_hits(await mem.search_messages(
                wanted.query, thread_id=wanted.thread_id, limit=wanted.limit,
                exclude_viewport_of=thread if isinstance(thread, str) else None))
        if isinstance(wanted, _View):
            found = await mem.view_messages(wanted.message_id, radius=wanted.radius)
            # Each message renders at most ZONE_MESSAGE_CHARS; the nearest fill the answer.
            kept = nearest(
                found.messages,
                found.target.seq,
                MAX_OUTPUT_CHARS - 4_000,  # room for the six snapshot lines
                lambda m: min(len(m.content), ZONE_MESSAGE_CHARS) + 60)
            return replace(found, messages=kept).render()
        if isinstance(wanted, _Recall) and isinstance(repo, str):
            return _render_recall((await mem.recall(repo, wanted.query, k=wanted.k)).memories)
        if isinstance(wanted, _Node) and isinstance(repo, str):
            node = await mem.get_node(repo, wanted.node_id)
            if node is None:
                return f"error: no memory {clip(wanted.node_id, 100)!r} in this repo"
            return _render_node(node, wanted.offset)
    except (InvalidInputError, NotFoundError) as exc:
        return f"error: {clip(str(exc), ERROR_CHARS)}"
    return f"error: unknown tool {call.name!r}; known: {', '.join(sorted(TOOLS))}"


def nearest(messages: Sequence[Message], seq: int, budget: int,
            size: Callable[[Message], int]) -> list[Message]:
    """The messages nearest to `seq` (the target first) that fit in `budget`, in order."""
    order = sorted(range(len(messages)), key=lambda i: abs(messages[i].seq - seq))
    fit = bisect_right(list(accumulate(size(messages[i]) for i in order)), budget)
    kept = set(order[:max(1, fit)])
    return [m for i, m in enumerate(messages) if i in kept]


def _render_recall(memories: Sequence[Recalled]) -> str:
    if not memories:
        return "Nothing recalled."
    lines = []
    for i, m in enumerate(memories, 1):
        text = " ".join(m.node.text.split())
        more = f" [{len(text)} chars; get_node for all]" if len(text) > SNIPPET_CHARS else ""
        lines.append(f"{i}. [{m.node.type.value}] {m.node.id}: {clip(text, SNIPPET_CHARS)}{more}")
    # 99 characters of room for the note that lines were left out (the first line shown anyway).
    shown = lines_within(lines, MAX_OUTPUT_CHARS - 99) or lines[:1]
    left_out = f"\n({len(lines) - len(shown)} more left out: ask for a smaller k)"
    return "\n".join(shown) + (left_out if len(shown) < len(lines) else "")


def _render_node(node: Node, offset: int) -> str:
    part = page(node.text, offset)
    head = f"[{node.type.value}] {node.id}, created {node.created_at.isoformat()}"
    where = f"characters {part.offset}-{part.offset + len(part.text)} of {part.total}"
    if part.next_offset is not None:
        where += f"; more with offset={part.next_offset}"
    lines = [head, f"text ({where}):", part.text]
    if part.offset == 0 and node.data:
        lines.append("data: " + clip(json.dumps(node.data, default=str), MESSAGE_CHARS))
    return "\n".join(lines)


def _arguments(raw: object) -> JSONObject | None:
    # Some providers hand tool arguments over as a JSON string.
    if isinstance(raw, str):
        try:
            raw = msgspec.json.decode(raw) if raw.strip() else {}
        except msgspec.DecodeError:
            return None
    return raw if isinstance(raw, dict) else None
