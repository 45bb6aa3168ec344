"""Token counts for budgets: tiktoken's `cl100k_base` when it loads (looked up on first use),
else an estimate that errs high (a token per 4 ASCII characters plus one per other
character), plus `MESSAGE_OVERHEAD` a message."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial

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
