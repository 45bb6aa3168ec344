"""Every exception mnemo raises on purpose.

```
MnemoError
├── InvalidInputError (ValueError)     bad arguments, raised before anything is stored
├── NotFoundError (LookupError)        unknown session or repo: .resource, .id
├── ConflictError                      same id, different payload
├── SessionError                       a call the session's state refuses: .reason, .state
├── PipelineError                      close_and_commit / ingest gave up: .reason
├── StorageError                       the store failed or stayed locked: .reason
└── AdapterError                       a model or embedding provider failed
    ├── LLMError
    │   ├── LLMReplyError                an answer that stayed unusable
    │   ├── LLMContextError              a prompt longer than the model's context
    │   └── LLMTimeout (TimeoutError)
    └── EmbeddingError
        └── EmbeddingTimeout (TimeoutError)
```

Foreign errors become the `__cause__` of an `LLMError`, `EmbeddingError` or `StorageError`.
What callers hand mnemo (texts, identifiers, JSON and counts) is checked here, before anything
is stored: every `check_*` raises `InvalidInputError` naming the argument.
"""

from __future__ import annotations

import functools
import json
import math
import os
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from enum import StrEnum
from typing import Any


class MnemoError(Exception):
    """Root of every error mnemo raises on purpose."""


class InvalidInputError(MnemoError, ValueError):
    """An argument is malformed; nothing was stored."""


class NotFoundError(MnemoError, LookupError):
    """An unknown session or repo."""

    def __init__(self, resource: str, id: str) -> None:
        super().__init__(f"unknown {resource}: {id!r}")
        self.resource = resource
        self.id = id


class ConflictError(MnemoError):
    """An id is already taken by a different payload."""


class SessionError(MnemoError):
    """A session call that its state refuses, or an async operation that did not run; `state` is
    the session's `mnemo.State`."""

    def __init__(self, reason: str, *, state: StrEnum | None,
                 session_id: str | None = None) -> None:
        where = f"{session_id}: " if session_id else ""
        super().__init__(f"{where}{reason} (state {state})")
        self.reason = reason
        self.state = state
        self.session_id = session_id


class PipelineError(MnemoError):
    """A pipeline gave up: `reason` is "extraction_failed" or "extraction_timeout"."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class StorageError(MnemoError):
    """The store failed: `reason` is "busy", "unavailable", "corrupt", "extension_missing",
    "closed" or "read_only"; nothing of the failed write was stored."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class AdapterError(MnemoError):
    """A model or embedding provider failed."""


class LLMError(AdapterError):
    """The LLM failed, timed out, or kept answering something unusable."""


class LLMReplyError(LLMError):
    """The LLM answered, but after the task's re-asks its reply still could not be read."""


class LLMContextError(LLMError):
    """The request is longer than the model's context (refused, or cut short with room left
    under its max_tokens); a shorter prompt may go through."""


class LLMTimeout(LLMError, TimeoutError):
    """The LLM did not answer in time."""


class EmbeddingError(AdapterError):
    """The embedder failed or produced vectors of the wrong shape."""


class EmbeddingTimeout(EmbeddingError, TimeoutError):
    """The embedder did not answer in time."""


@contextmanager
def first_error() -> Iterator[None]:
    """Re-raises the first error of a task group's `ExceptionGroup` as itself."""
    try:
        yield
    except BaseExceptionGroup as group:
        # The group's errors, nested as they were (None: none), down to the first.
        first: BaseException | None = group.split(Exception)[0]
        if first is None:
            raise
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from first.__cause__


# About 8,000 tokens.
DEFAULT_MAX_TEXT_CHARS = 32_000
# The highest `Config.max_text_chars` (about 30,000 tokens): two texts of it, at 4 bytes a
# character, stay under the 1 MB PostgreSQL's full-text search takes.
MAX_TEXT_CHARS_LIMIT = 120_000
# The longest identifier, in UTF-8 bytes (PostgreSQL's btree entries hold 2,704 bytes).
MAX_ID_BYTES = 1_000
# The largest token budget (a viewport's, an eviction's, a summary's): ten times the longest
# context window a model has.
MAX_TOKEN_BUDGET = 10_000_000
# The largest count of messages, files or results a policy or call takes.
MAX_COUNT = 10_000
# The deepest JSON value accepted, in containers (a dict in a dict counts 2); recursive readers
# stop near 1,000.
MAX_JSON_DEPTH = 64


def check_text(value: object, what: str, *, limit: int, blank_ok: bool = False,
               stored: bool = True, setting: str | None = "Config.max_text_chars") -> str:
    """`value`, checked to be a string of at most `limit` characters (the bound `setting`
    names, None: a fixed one), not blank unless `blank_ok`, and without NUL when `stored`
    (PostgreSQL's text cannot hold it); else InvalidInputError. A query (not `stored`) of
    nothing but whitespace, control and format characters is blank too: it finds nothing."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, got {type(value).__name__}")
    if len(value) > limit:  # first: what follows reads every character
        raise InvalidInputError(
            f"{what} is {len(value):,} characters long, more than the {limit:,} allowed"
            + ("" if setting is None else f" ({setting})"))
    if stored and "\x00" in value:
        raise InvalidInputError(f"{what} must not contain a NUL character (U+0000)")
    if not _encodable(value):
        raise InvalidInputError(f"{what} is not valid Unicode (a lone surrogate)")
    if not blank_ok and not (value.strip() if stored else has_words(value)):
        raise InvalidInputError(f"{what} must not be blank")
    return value


def has_words(text: str) -> bool:
    """Whether `text` holds a character besides whitespace, controls (Cc) and formats (Cf)."""
    return any(not c.isspace() and unicodedata.category(c) not in ("Cc", "Cf") for c in text)


def check_step(observation: object, action: object, metadata: object, *, limit: int,
               where: str = "") -> None:
    """Raises InvalidInputError for a blank observation, a metadata that is not a dict or None,
    or a step past `limit` characters or `MAX_JSON_DEPTH` (each named after `where`)."""
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidInputError(
            f"{where}metadata must be a dict or None, got {type(metadata).__name__}")
    check_text(observation, f"{where}observation", limit=limit)
    check_text(action, f"{where}action", limit=limit, blank_ok=True)
    if metadata is not None:
        check_json(metadata, f"{where}metadata", limit=limit)


def check_id(value: object, what: str) -> str:
    """`value`, checked to be an identifier every backend can store and look up: a non-blank
    string of at most `MAX_ID_BYTES` of UTF-8, without NUL or lone surrogate; else
    InvalidInputError."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(f"{what} must not be blank, got {value!r}")
    # A character is 1 to 4 bytes of UTF-8: the length alone refuses a long key unencoded.
    if len(value) > MAX_ID_BYTES or len(value.encode("utf-8", "replace")) > MAX_ID_BYTES:
        raise InvalidInputError(
            f"{what} is longer than the {MAX_ID_BYTES:,} bytes of UTF-8 allowed")
    if not storable_text(value):
        raise InvalidInputError(
            f"{what} must not contain a NUL character (U+0000) or a lone surrogate")
    return value


def split_id(ident: str) -> tuple[str, str, str]:
    """An id's kind (through its last `_`), its digits, and a step's `:index` (a step node is
    `episodic_episode_<digits>:<index>`): `("semantic_", "5d3a...", "")`."""
    kind, sep, rest = ident.rpartition("_")
    digits, colon, index = rest.partition(":")
    return kind + sep, digits, colon + index


def names_id(given: str, ident: str) -> bool:
    """Whether `given` names `ident` as a tool's short id does: a prefix of the id or of its
    digits, with the same step index (`085d80d9:3`)."""
    kind, digits, index = split_id(ident)
    head, colon, number = given.partition(":")
    return colon + number == index and ((kind + digits).startswith(head) or digits.startswith(head))


def check_name(value: object, what: str) -> str:
    """`value`, checked to be a name a caller may create (a repo, a thread, a source, a role):
    already in the canonical form of RFC 8266's nickname profile (case preserved), so two
    names that print alike are one; InvalidInputError names the first offending character.
    Lookups (`check_id`) stay lenient."""
    name = check_id(value, what)
    if name.isascii():
        if name.isprintable() and name == name.strip(" ") and "  " not in name:
            return name  # the common case: what the profile gives back unchanged
    try:
        canonical = _nickname().enforce(name)
    except UnicodeEncodeError as exc:
        bad = name[exc.start]
        raise InvalidInputError(
            f"{what} must not contain U+{ord(bad):04X} ({unicodedata.name(bad, 'unnamed')}, "
            f"{exc.reason}): names hold no control, format, invisible or unassigned character"
        ) from exc
    if canonical != name:
        raise InvalidInputError(
            f"{what} is not in canonical form (no leading, trailing, doubled or non-ASCII "
            f"spaces, composed characters, no compatibility forms): write it as {canonical!r}")
    return name


@functools.cache
def _nickname() -> Any:
    """RFC 8266's nickname profile (case preserved), imported when a name first needs it."""
    from precis_i18n import get_profile

    return get_profile("NicknameCasePreserved")


# The URLs that name a store: a PostgreSQL database (libpq's schemes).
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def check_store(path: object) -> str:
    """`Memory`'s `path` as a string, checked to name a store: `":memory:"`, a SQLite file's
    path (`str` or `os.PathLike`) or a PostgreSQL URL; else InvalidInputError."""
    name = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(name, str):
        raise InvalidInputError(
            f"path must be a str or os.PathLike naming a SQLite file, \":memory:\" or a "
            f"postgresql:// URL, got {type(path).__name__}")
    if not name.strip():
        raise InvalidInputError(f"path must not be blank, got {name!r}")
    if "\x00" in name:
        raise InvalidInputError("path must not contain a NUL character (U+0000)")
    if "://" in name and not name.startswith(POSTGRES_SCHEMES):
        raise InvalidInputError(
            f"path {name!r} is a URL of a store mnemo does not know: a PostgreSQL URL "
            "starts with postgresql:// or postgres://")
    return name


def check_models(llm: object, embedder: object, reranker: object = None) -> None:
    """Refuses (InvalidInputError) an `llm`, `embedder` or `reranker` that is neither None nor
    an object of its port (`dim` is not read: an `OpenAIEmbedder` learns it)."""
    for what, value, method, port, hint in (
        ("llm", llm, "generate", "an async generate(request) (mnemo.LLM)", "llm_from_uri"),
        ("embedder", embedder, "embed", "dim and an async embed(texts) (mnemo.Embedder)",
         "embedder_from_uri"),
        ("reranker", reranker, "rerank", "an async rerank(query, texts) (mnemo.Reranker)", ""),
    ):
        if value is not None and not callable(getattr(value, method, None)):
            uri = f"; a model's URI goes through mnemo.{hint}" if hint else ""
            raise InvalidInputError(f"{what} must be an object with {port}, got {value!r}{uri}")


def check_count(name: str, value: object, *, minimum: int = 0, maximum: float = math.inf,
                setting: str = "") -> int:
    """An integer argument (bools refused) within [minimum, maximum], else InvalidInputError;
    `setting` names the maximum's source for the message."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        bound = (f"between {minimum:,} and {int(maximum):,}" if math.isfinite(maximum)
                 else f">= {minimum:,}")
        where = f" ({setting})" if setting else ""
        raise InvalidInputError(f"{name} must be an integer {bound}{where}, got {value!r}")
    return value


def check_budget(name: str, value: object) -> int:
    """A token budget: an integer from 1 to `MAX_TOKEN_BUDGET`, else InvalidInputError."""
    return check_count(name, value, minimum=1, maximum=MAX_TOKEN_BUDGET)


def check_seconds(name: str, value: object, most: float) -> float:
    """A positive number of seconds (bools refused), at most `most`; else InvalidInputError."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= most:
        raise InvalidInputError(
            f"{name} must be a positive number of seconds, at most {most:,.0f}, got {value!r}")
    return float(value)


def check_json(value: object, what: str, *, limit: int) -> str:
    """The JSON text of `value` (keys sorted), checked by `check_tree` before encoding;
    InvalidInputError for what it refuses and for what is not JSON (NaN, infinities)."""
    check_tree(value, what, limit=limit)
    try:
        # NaN and Infinity are not JSON: PostgreSQL's jsonb refuses them, SQLite kept them.
        text = json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what} is not JSON-serialisable: {exc}") from exc
    if len(text) > limit:
        raise InvalidInputError(
            f"{what} is {len(text):,} characters long as JSON, more than the {limit:,} "
            "allowed (Config.max_text_chars)")
    return text


def check_tree(value: object, what: str, *, limit: int,
               setting: str = "Config.max_text_chars") -> None:
    """Checks a JSON-like value without recursion: at most `MAX_JSON_DEPTH` deep, `limit`
    characters as JSON (counted as walked, so the cost is bounded by `limit`; the bound
    `setting` names), only string keys, and no string with a NUL or a lone surrogate; else
    InvalidInputError."""
    stack: list[tuple[object, int]] = [(value, 0)]
    size = 0
    while stack:
        item, depth = stack.pop()
        children: Iterable[object] = ()
        if isinstance(item, str):
            size += len(item) + 2
        elif isinstance(item, Mapping | list | tuple):
            size += 1 + max(len(item), 1)
        else:
            size += 1
        if size > limit:
            raise InvalidInputError(
                f"{what} is longer than the {limit:,} characters allowed as JSON ({setting})")
        if isinstance(item, str):
            if not storable_text(item):
                raise InvalidInputError(
                    f"{what} must not contain a NUL character (U+0000) or a lone surrogate")
            continue
        if isinstance(item, Mapping):
            if not all(isinstance(key, str) for key in item):
                raise InvalidInputError(
                    f"{what} has a key that is not a string (JSON would make it one)")
            children = [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth == MAX_JSON_DEPTH:
            raise InvalidInputError(
                f"{what} nests more than {MAX_JSON_DEPTH} levels of dicts and lists")
        stack.extend((child, depth + 1) for child in children)


def storable_text(text: str) -> bool:
    """Whether both backends store `text`: it holds no NUL and no lone surrogate."""
    return "\x00" not in text and _encodable(text)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
