"""Bounds on what callers hand mnemo: the size of every public text, and the terms of a query.

Issue 9 (item 13): an unbounded observation was accepted and then kept the offline heuristics
busy for minutes, and a recall query of 926 words became an FTS5 query of 926 OR terms (48 s
in raw SQL). So every public text input is checked here against `Config.max_text_chars`
before anything is stored, and every lexical query keeps at most `text.MAX_QUERY_TERMS` distinct
terms: what a recall, a search or an extraction costs is then bounded by the input bound, not
by what a caller sent.
"""

from __future__ import annotations

import json
import math

from mnemo.errors import InvalidInputError

# About 8,000 tokens: a long tool output or several pages of text, while the worst input the
# offline heuristics see still costs them tens of milliseconds (docs/DECISIONS.md).
DEFAULT_MAX_TEXT_CHARS = 32_000
# The highest `Config.max_text_chars`. PostgreSQL's full-text search refuses a text whose
# lexemes and positions pass 1 MB ("string is too long for tsvector"), and a step's node holds
# its observation and its action. The densest text costs 4 bytes a character: distinct words
# of four-byte characters (CJK Extension B), each character 4 bytes and each word 4 more of
# count and position for its separator (ASCII four-letter words cost 1.6). Two texts of
# 120,000 make 0.96 MB. SQLite has no such limit; one bound keeps the backends alike (a probe
# found PostgreSQL refusing, as a storage fault, what SQLite stored). About 30,000 tokens.
MAX_TEXT_CHARS_LIMIT = 120_000
# The longest identifier (a repo name, source_id, thread_id, ...), in UTF-8 bytes: PostgreSQL's
# btree index entries hold at most 2,704 bytes, and a repo name with a source id is one entry.
MAX_ID_BYTES = 1_000


def check_text(
    value: object, what: str, *, limit: int, blank_ok: bool = False, stored: bool = True
) -> str:
    """`value`, checked to be a string of at most `limit` characters (and not blank, unless
    `blank_ok`). A text that is `stored` must not hold NUL; a query (not stored) may, as its
    words never do.

    Raises:
        InvalidInputError: not a string, blank, longer than `limit`, or holding a NUL
            character (U+0000: PostgreSQL's text cannot store it, so no backend takes it).
    """
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, got {type(value).__name__}")
    if stored and "\x00" in value:
        raise InvalidInputError(f"{what} must not contain a NUL character (U+0000)")
    if not _encodable(value):
        raise InvalidInputError(f"{what} is not valid Unicode (a lone surrogate)")
    if not blank_ok and not value.strip():
        raise InvalidInputError(f"{what} must not be blank")
    if len(value) > limit:
        raise InvalidInputError(
            f"{what} is {len(value):,} characters long, more than the {limit:,} allowed "
            "(Config.max_text_chars)"
        )
    return value


def check_id(value: object, what: str) -> str:
    """`value`, checked to be an identifier mnemo can store and look up on every backend: a
    non-blank string without NUL or a lone surrogate (PostgreSQL's text takes neither, and
    SQLite's driver cannot encode the second).

    Raises:
        InvalidInputError: it is not.
    """
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{what} must be a non-blank string, got {value!r}")
    return check_storable(value, what)


def check_storable(value: str, what: str) -> str:
    """`value`, checked to hold no NUL and no lone surrogate and to be at most `MAX_ID_BYTES`
    long: a key that no store can hold, so no lookup may send it (PostgreSQL refuses a NUL,
    SQLite's driver a lone surrogate, PostgreSQL's indexes a key past 2,704 bytes).

    Raises:
        InvalidInputError: it is not.
    """
    if "\x00" in value or not _encodable(value):
        raise InvalidInputError(
            f"{what} must not contain a NUL character (U+0000) or a lone surrogate"
        )
    size = len(value.encode())
    if size > MAX_ID_BYTES:
        raise InvalidInputError(
            f"{what} is {size:,} bytes long in UTF-8, more than the {MAX_ID_BYTES:,} allowed"
        )
    return value


def check_count(name: str, value: object, *, minimum: int = 0, maximum: float = math.inf) -> int:
    """An integer argument within [minimum, maximum].

    Raises:
        InvalidInputError: not an integer (bools refused) or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        bound = f"between {minimum} and {maximum}" if math.isfinite(maximum) else f">= {minimum}"
        raise InvalidInputError(f"{name} must be an integer {bound}, got {value!r}")
    return value


def check_json(value: object, what: str, *, limit: int) -> str:
    """The JSON text of `value` (keys sorted), checked to be at most `limit` characters: how
    metadata is bounded, since it is stored and shown as that text.

    Raises:
        InvalidInputError: not JSON-serialisable (NaN and infinities are not), its JSON is
            longer than `limit`, or it holds a NUL character (escaped in JSON, but
            PostgreSQL's jsonb refuses it).
    """
    try:
        # NaN and Infinity are not JSON: PostgreSQL's jsonb refuses them, SQLite kept them.
        text = json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what} is not JSON-serialisable: {exc}") from exc
    if _holds_nul(value):
        raise InvalidInputError(
            f"{what} must not contain a NUL character (U+0000) or a lone surrogate"
        )
    if len(text) > limit:
        raise InvalidInputError(
            f"{what} is {len(text):,} characters long as JSON, more than the {limit:,} "
            "allowed (Config.max_text_chars)"
        )
    return text


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _holds_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value or not _encodable(value)
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_nul(item) for item in value)
    return False
