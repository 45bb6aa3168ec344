"""Token counts for budgets: tiktoken's `cl100k_base` when it loads (looked up on first use),
else an estimate that errs high (a token per 4 ASCII characters plus one per other
character), plus `MESSAGE_OVERHEAD` a message."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

MESSAGE_OVERHEAD = 4


@cache
def _encoder() -> Callable[[str], int] | None:
    try:
        import tiktoken  # type: ignore[import-not-found, unused-ignore]

        encoding = tiktoken.get_encoding("cl100k_base")
    except Exception:
        # Not installed, or the encoding could not be loaded (offline with no cache): estimate.
        return None

    def count(text: str) -> int:
        return len(encoding.encode(text, disallowed_special=()))

    return count


def estimate_tokens(text: str) -> int:
    """The documented estimate: ceil(ASCII characters / 4) + non-ASCII characters."""
    ascii_chars = len(text.encode("ascii", "ignore"))
    return -(-ascii_chars // 4) + (len(text) - ascii_chars)


def count_tokens(text: str) -> int:
    """Tokens in `text`: exact with tiktoken (cl100k_base), else `estimate_tokens`."""
    encode = _encoder()
    return encode(text) if encode is not None else estimate_tokens(text)
