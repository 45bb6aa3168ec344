"""Incoming chat messages, checked and turned into what the log stores: a JSON mapping with a
non-blank string `role`, a `content` and any other keys; `load` returns exactly what was saved.
Token counts for budgets: tiktoken's `cl100k_base` when it loads (looked up on first use), else
an estimate that errs high (a token per 4 ASCII characters plus one per other character), plus
`MESSAGE_OVERHEAD` a message."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, partial

from mnemo.config import Config
from mnemo.conversation.model import ITEM_KEY, MAX_ITEM_CHARS, NO_CONTENT
from mnemo.errors import (
    MAX_TEXT_CHARS_LIMIT,
    InvalidInputError,
    check_json,
    check_name,
    check_text,
    check_tree,
)
from mnemo.ports import JSONObject

MESSAGE_OVERHEAD = 4


@cache
def _encoder() -> Callable[[str], list[int]] | None:
    try:
        import tiktoken  # type: ignore[import-not-found, unused-ignore]

        encoding = tiktoken.get_encoding("cl100k_base")
    except Exception:
        # Not installed, or the encoding could not be loaded (offline with no cache): estimate.
        return None
    return partial(encoding.encode, disallowed_special=())


def count_tokens(text: str) -> int:
    """Tokens in `text`, counted or estimated as the module says (without `MESSAGE_OVERHEAD`)."""
    encode = _encoder()
    if encode is not None:
        return len(encode(text))
    ascii_chars = len(text.encode("ascii", "ignore"))
    return -(-ascii_chars // 4) + (len(text) - ascii_chars)


@dataclass(frozen=True, slots=True)
class MessageDraft:
    """A checked message: its text content, the other keys, the text search indexes
    (content plus tool calls), its token cost and its key (`message_key`)."""

    role: str
    content: str
    data: JSONObject
    text: str
    tokens: int
    key: bytes
    # Who it belongs to (`mnemo.graph.scope`), set by the save that stores it.
    metadata: dict[str, str | int | float | bool] = field(default_factory=dict)


def check_history(messages: object) -> Sequence[Mapping[str, object]]:
    """The history as a sequence of mappings; raises InvalidInputError for anything else."""
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        raise InvalidInputError(
            f"messages must be a list of message dicts, got {type(messages).__name__}")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidInputError(
                f"messages[{index}] must be a dict, got {type(message).__name__}")
    return messages


def draft(message: Mapping[str, object], index: int, config: Config | None = None) -> MessageDraft:
    """Checks one message against `config`'s bounds (the defaults when None) and prepares its row.

    Raises InvalidInputError naming the message and the offending key."""
    config = config or Config()
    limit = config.max_text_chars
    where = f"messages[{index}]"
    # Its text (content and tool calls) is bounded by `limit`, as JSON with other parts (an
    # image) by `MAX_ITEM_CHARS`; an item kept whole (an Agents SDK item) by `MAX_ITEM_CHARS`
    # too, its text held once more as the content (and its other keys). Checked before it is
    # walked or serialised.
    kept = ITEM_KEY in message
    bound = "MAX_ITEM_CHARS, more than any model's context window"
    if kept:
        check_tree(message[ITEM_KEY], f"{where}.{ITEM_KEY}", limit=MAX_ITEM_CHARS, setting=bound)
        check_tree({k: v for k, v in message.items() if k != ITEM_KEY}, where,
                   limit=MAX_ITEM_CHARS + 2 * limit, setting=bound)
    else:
        check_tree(message, where, limit=MAX_ITEM_CHARS, setting=bound)
    role = check_name(message.get("role"), f"{where}.role")
    raw_content = message.get("content")
    for key in ("name", "tool_call_id"):  # None: a pydantic item's `model_dump()`
        if message.get(key) is not None and not isinstance(message[key], str):
            raise InvalidInputError(
                f"{where}.{key} must be a string or None, got {message[key]!r}")
    calls = message.get("tool_calls")
    if calls is not None and not (
            isinstance(calls, list) and all(isinstance(c, Mapping) for c in calls)):
        raise InvalidInputError(f"{where}.tool_calls must be a list of dicts, got {calls!r}")
    if calls is not None and len(calls) > config.max_tool_calls_per_message:
        raise InvalidInputError(
            f"{where}.tool_calls holds {len(calls):,} calls, more than the "
            f"{config.max_tool_calls_per_message:,} a message may hold "
            "(Config.max_tool_calls_per_message)")
    if "content" not in message and not calls:
        raise InvalidInputError(
            f"{where} has no content (only a message with tool_calls may leave it out)")
    if isinstance(raw_content, str):
        content = raw_content
    elif raw_content is None or isinstance(raw_content, list):
        refusal = message.get("refusal")  # OpenAI's, the text of a message without content
        content = parts_text(raw_content) if isinstance(raw_content, list) else (
            refusal if isinstance(refusal, str) else "")
        if isinstance(raw_content, list) and not all(
                isinstance(p, str | Mapping) for p in raw_content):
            raise InvalidInputError(f"{where}.content parts must be strings or dicts")
    else:
        raise InvalidInputError(
            f"{where}.content must be a string, None or a list of parts, got "
            f"{type(raw_content).__name__}")
    data = {k: v for k, v in message.items() if k not in {"role", "content"}}
    if "content" not in message:
        data["content"] = NO_CONTENT
    elif not isinstance(raw_content, str):
        # Kept verbatim so that load gives back the None or the parts, not their text.
        data["content"] = raw_content
    try:
        # Round-tripped now so that what load returns is exactly what JSON keeps.
        data = json.loads(json.dumps(data, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{where} is not JSON-serialisable: {exc}") from exc
    # A kept item's search text is its first `limit` characters; it costs what all of it does.
    searched = search_text(content, calls or [])
    if len(searched) > limit and not kept:
        raise InvalidInputError(
            f"{where} holds {len(searched):,} characters of text (content and tool calls), "
            f"more than the {limit:,} allowed (Config.max_text_chars, at most "
            f"{MAX_TEXT_CHARS_LIMIT:,}); nothing was stored. Cut it in the history you save")
    text = check_text(searched[:limit], f"{where}.content", limit=limit, blank_ok=True)
    check_json({k: v for k, v in data.items() if k not in ("content", ITEM_KEY)}, where,
               limit=limit)
    return MessageDraft(role, content, data, text, count_tokens(searched) + MESSAGE_OVERHEAD,
                        message_key(message, index))


# What `save` compares of a stored message and the message at its place in a history.
COMPARED = ("role", "content", "name", "tool_calls", "tool_call_id")


def message_key(message: Mapping[str, object], index: int) -> bytes:
    """The digest of what `save` compares of a message (`COMPARED`, a None value as no key:
    what `model_dump()` and `model_dump(exclude_none=True)` give are one message);
    InvalidInputError when they are not JSON-serialisable."""
    compared = {k: message[k] for k in COMPARED if message.get(k) is not None}
    role, content = compared.get("role"), compared.get("content")
    if isinstance(role, str) and isinstance(content, str) and len(compared) == 2:
        # Most messages: a third of the time JSON takes (no "[" starts this form).
        text = f"{len(role)}:{role}{content}"
    else:
        try:
            text = json.dumps(compared, sort_keys=True)
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidInputError(f"messages[{index}] is not JSON-serialisable: {exc}") from exc
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def history_hash(keys: Iterable[bytes], start: str = "") -> str:
    """The hash of a history: each message's key chained onto the hash before it, from
    `start` (the hash of the history before them; "" is the empty history's)."""
    digest = bytes.fromhex(start)
    for key in keys:
        digest = hashlib.sha256(digest + key).digest()
    return digest.hex()


def parts_text(parts: list[object]) -> str:
    """The text of a list of content parts: text parts, refusals, tool results' text, tool
    uses."""
    out: list[str] = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, Mapping):
            if isinstance(part.get("text"), str):
                out.append(part["text"])
            elif isinstance(part.get("refusal"), str):
                out.append(part["refusal"])
            elif part.get("type") == "tool_result":
                inner = part.get("content")
                if isinstance(inner, str):
                    out.append(inner)
                elif isinstance(inner, list):
                    out.append(parts_text(inner))
            elif part.get("type") == "tool_use":
                out.append(_call_text(part.get("name"), part.get("input")))
    return "\n".join(piece for piece in out if piece)


def search_text(content: str, calls: object) -> str:
    """What search and the embedder read: the content, then each call `name(arguments)`."""
    lines = [content] if content else []
    for call in calls if isinstance(calls, list) else []:
        if not isinstance(call, Mapping):
            continue
        function = call.get("function")
        if isinstance(function, Mapping):
            lines.append(_call_text(function.get("name"), function.get("arguments")))
        else:
            lines.append(_call_text(call.get("name"), call.get("arguments", call.get("input"))))
    return "\n".join(lines)


def _call_text(name: object, arguments: object) -> str:
    if not isinstance(arguments, str):
        arguments = "" if arguments is None else json.dumps(arguments, sort_keys=True)
    return f"{name if isinstance(name, str) else 'tool'}({arguments})"
