"""Agent tools over a `Memory`: JSON-schema specs for OpenAI and Anthropic, and one executor.

Memory tools an agent calls itself:

- `search_messages(query, thread_id?, limit?)`: keyword search over every thread's messages;
- `view_messages(message_id, radius?)`: the messages around a search hit, and snapshots;
- `recall(query, k?)`: the knowledge graph of a repo.

Eviction tools, for a model that manages a context window (what `Memory.evict` gives its
LLM): `save_snapshot(text)`, `attach_messages_to_goals(message_ids, goal_ids)`,
`everything_ok()`.

```python
tools = mnemo.tools.openai_tools()            # or anthropic_tools(); pass to the provider
text = await mnemo.tools.execute_tool(mem, call, thread_id="t1", repo="my-repo")
```

`execute_tool` always answers with a string for the model: a bad argument, an unknown id or
tool comes back as "error: ..." text (so the model can correct itself), never as an
exception.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mnemo.conversation.eviction import EvictionTools
from mnemo.conversation.prompts import EVICTION_TOOLS
from mnemo.conversation.search import render_hits
from mnemo.errors import InvalidInputError, NotFoundError
from mnemo.ports import ToolCall

if TYPE_CHECKING:
    from mnemo.memory import Memory


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool: its name, what it does, and its JSON-schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        """The tool in OpenAI's chat-completions format."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def anthropic(self) -> dict[str, Any]:
        """The tool in Anthropic's messages format."""
        return {"name": self.name, "description": self.description, "input_schema": self.parameters}


SEARCH_MESSAGES = ToolSpec(
    "search_messages",
    "Search earlier conversation messages (this thread and others) by keywords. Each word is "
    "matched with stemming and any word may match (AND, OR and NOT are plain words). "
    "Returns snippets with message ids for view_messages.",
    {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "Keywords to look for."},
            "thread_id": {
                "type": "string",
                "description": "Only this thread (omit to search every thread).",
            },
            "limit": {"type": "integer", "minimum": 1, "maximum": 20, "default": 5},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
)
VIEW_MESSAGES = ToolSpec(
    "view_messages",
    "Show a message found by search_messages with the messages around it (tool outputs "
    "reduced to ok/error) and the summaries written just before and after it.",
    {
        "type": "object",
        "properties": {
            "message_id": {"type": "string", "description": "An id from search_messages."},
            "radius": {"type": "integer", "minimum": 0, "maximum": 30, "default": 10},
        },
        "required": ["message_id"],
        "additionalProperties": False,
    },
)
RECALL = ToolSpec(
    "recall",
    "Recall long-term knowledge (facts and procedures learned in earlier work) relevant to a "
    "query.",
    {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to recall."},
            "k": {"type": "integer", "minimum": 1, "maximum": 30, "default": 10},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
)

TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in [
        SEARCH_MESSAGES,
        VIEW_MESSAGES,
        RECALL,
        *(ToolSpec(t["name"], t["description"], t["parameters"]) for t in EVICTION_TOOLS),
    ]
}
MEMORY_TOOLS = ("search_messages", "view_messages", "recall")
EVICTION_TOOL_NAMES = ("save_snapshot", "attach_messages_to_goals", "everything_ok")


def _specs(names: Iterable[str]) -> list[ToolSpec]:
    wanted = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in wanted if n not in TOOLS]
    if unknown:
        raise InvalidInputError(f"unknown tools {unknown}; known: {sorted(TOOLS)}")
    return [TOOLS[n] for n in wanted]


def openai_tools(names: Iterable[str] = MEMORY_TOOLS) -> list[dict[str, Any]]:
    """The named tools (default: the memory tools) in OpenAI's format.

    Raises:
        InvalidInputError: an unknown tool name.
    """
    return [spec.openai() for spec in _specs(names)]


def anthropic_tools(names: Iterable[str] = MEMORY_TOOLS) -> list[dict[str, Any]]:
    """The named tools (default: the memory tools) in Anthropic's format.

    Raises:
        InvalidInputError: an unknown tool name.
    """
    return [spec.anthropic() for spec in _specs(names)]


async def execute_tool(mem: Memory, call: ToolCall, **context: Any) -> str:
    """Runs one tool call against `mem`; returns the text to give back to the model.

    Context (keyword arguments, each optional):
    - `thread_id`: the calling agent's thread; `search_messages` then leaves out what its
      viewport already shows.
    - `repo`: the repo `recall` searches (without it, recall answers with an error text).
    - `eviction`: the `EvictionTools` of an eviction in progress, which the eviction tools
      act on (without it, they answer with an error text).

    Errors the model can fix (bad arguments, unknown ids, an unknown tool) come back as text
    starting with "error:"; nothing is raised for them.
    """
    args = _arguments(call.arguments)
    if args is None:
        return "error: the arguments must be a JSON object"
    try:
        if call.name == "search_messages":
            hits = await mem.search_messages(
                _text(args, "query"),
                thread_id=_optional_text(args, "thread_id"),
                limit=_integer(args, "limit", 5),
                exclude_viewport_of=context.get("thread_id"),
            )
            return render_hits(hits)
        if call.name == "view_messages":
            found = await mem.view_messages(
                _text(args, "message_id"), radius=_integer(args, "radius", 10)
            )
            return found.render()
        if call.name == "recall":
            repo = context.get("repo")
            if not isinstance(repo, str):
                return "error: recall is not available here (no repo)"
            result = await mem.recall(repo, _text(args, "query"), k=_integer(args, "k", 10))
            if not result.memories:
                return "Nothing recalled."
            return "\n".join(
                f"{i}. [{m.node.type.value}] {m.node.text}"
                for i, m in enumerate(result.memories, 1)
            )
        if call.name in EVICTION_TOOL_NAMES:
            eviction = context.get("eviction")
            if not isinstance(eviction, EvictionTools):
                return f"error: {call.name} only runs during an eviction"
            return eviction.call(ToolCall(call.name, args, call.id))
    except (InvalidInputError, NotFoundError) as exc:
        return f"error: {exc}"
    return f"error: unknown tool {call.name!r}; known: {', '.join(sorted(TOOLS))}"


def _arguments(raw: object) -> dict[str, Any] | None:
    # Some providers hand tool arguments over as a JSON string.
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return None
    return raw if isinstance(raw, dict) else None


def _text(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{key} must be a non-empty string")
    return value


def _optional_text(args: dict[str, Any], key: str) -> str | None:
    value = args.get(key)
    return None if value is None else _text(args, key)


def _integer(args: dict[str, Any], key: str, default: int) -> int:
    value = args.get(key, default)
    # Models often send numbers as strings ("5") or floats (5.0).
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{key} must be an integer, got {value!r}")
    return value
