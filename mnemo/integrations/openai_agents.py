"""`MnemoSession`: the OpenAI Agents SDK's `Session` protocol over a mnemo thread.

```python
session = MnemoSession(mem, "user-42")
result = await Runner.run(agent, "Hello", session=session)
```

Each item is one message (an item without a `role`, or with a text past
`Config.max_text_chars`, stored whole under `openai_item`, up to `MAX_ITEM_CHARS`), and
`get_items` gives back exactly the items added."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from mnemo.calls.retry import clean
from mnemo.conversation.drafts import parts_text
from mnemo.conversation.manager import ConversationManager
from mnemo.conversation.model import ITEM_KEY, Message, kept_item
from mnemo.errors import check_budget, check_count, check_name, storable_text
from mnemo.graph.scope import check_metadata

try:
    from agents.memory.session_settings import SessionSettings, resolve_session_limit
except ImportError as exc:
    raise ImportError(
        'mnemo.integrations.openai_agents needs the OpenAI Agents SDK: pip install '
        '"pymnemo[openai-agents]"') from exc

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

    from mnemo.memory import Memory

__all__ = ["ITEM_KEY", "MnemoSession"]


class MnemoSession:
    """The OpenAI Agents SDK's `Session` over the mnemo thread `session_id` of `mem`. With
    `token_budget`, each add evicts to it (unless `conversation` evicts to a budget of its own)
    and `get_items()` without a limit gives mnemo's viewport of that budget. Every
    item added carries `metadata` (a scope such as `{"user_id": "bob"}`): `search_messages(...,
    where=)` finds it, and the viewport's passive recall stays inside it.

    Raises:
        InvalidInputError: a `session_id` that is no thread name, a `token_budget` below 1, or
            a `metadata` that is not a bounded flat dict of scalars."""

    session_settings: SessionSettings | None

    def __init__(self, mem: Memory, session_id: str, *,
                 conversation: ConversationManager | None = None, token_budget: int | None = None,
                 session_settings: SessionSettings | None = None,
                 metadata: Mapping[str, object] | None = None) -> None:
        self.session_id = check_name(session_id, "thread_id")
        if token_budget is not None:
            check_budget("token_budget", token_budget)
        self.session_settings = session_settings
        self._metadata = check_metadata(metadata)
        self._mem = mem
        self._token_budget = token_budget
        if conversation is None:
            conversation = mem.conversation(auto_evict_budget=token_budget)
        elif conversation.auto_evict_budget is None and token_budget is not None:
            conversation = replace(conversation, auto_evict_budget=token_budget)
        self._conversation = conversation

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items, oldest first; with `limit` (or `session_settings.limit`), the newest
        `limit` (a negative one: all, as the SDK's `SQLiteSession`), else the viewport when the
        session has a `token_budget`."""
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is None and self._token_budget is not None:
            view = await self._mem.viewport(self.session_id, token_budget=self._token_budget)
            shown = view.to_messages()
            memory = cast("list[TResponseInputItem]", shown[: len(shown) - len(view.messages)])
            return memory + [_item(m) for m in view.messages]
        if limit is not None and not 0 <= check_count("limit", limit, minimum=-(2**63)) < 2**63:
            limit = None  # a negative one, or one past any log: all
        messages = await self._conversation.raw(self.session_id, limit=limit, newest=True)
        return [_item(m) for m in messages]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Appends `items` after the session's items in one write; an item that is not a JSON dict
        or past the bounds raises InvalidInputError, storing nothing."""
        limit = self._conversation.max_text_chars
        await self._conversation.append(
            self.session_id, [_message(item, limit) for item in items], self._metadata)

    async def pop_item(self) -> TResponseInputItem | None:
        """Removes the newest item and returns it (None for an empty session): its message is
        erased, so no search or recall finds it after (`ConversationManager.pop`)."""
        message = await self._conversation.pop(self.session_id)
        return None if message is None else _item(message)

    async def clear_session(self) -> None:
        """Erases the thread without a trace (`ConversationManager.purge`)."""
        await self._conversation.purge(self.session_id)


def _message(item: Mapping[str, object], limit: int) -> Mapping[str, object]:
    """The message that stores `item` (anything but a dict is left for `append` to refuse): a
    message item of at most `limit` characters of text as it is, another (or one holding
    `ITEM_KEY` itself) kept whole in its data, its text cut to `limit` for search."""
    if not isinstance(item, Mapping):
        return item
    text = _text(item)
    plain = _plain(item)
    if "role" in item and ITEM_KEY not in item and len(text) <= limit and plain:
        return item
    kind = item.get("type")
    role = "tool" if isinstance(kind, str) and kind.endswith("_output") else "assistant"
    kept: object = dict(item)
    if not plain:
        kept = kept_item(item)
        text = clean(text.replace("\x00", " "))
    return {"role": item.get("role", role), "content": text, ITEM_KEY: kept}


def _plain(value: object) -> bool:
    """Whether the strings of `value` (a JSON value) hold no NUL and no lone surrogate."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, Mapping):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(map(_plain, value))
    return True


def _text(item: Mapping[str, object]) -> str:
    """What search and eviction read of an item."""
    for key in ("output", "summary", "content"):
        value = item.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value:
            return parts_text(value)
    if isinstance(item.get("name"), str):
        return f"{item['name']}({item.get('arguments') or ''})"
    return str(item.get("type") or "")


def _item(message: Message) -> TResponseInputItem:
    item = message.item
    return cast("TResponseInputItem", message.to_dict() if item is None else item)
