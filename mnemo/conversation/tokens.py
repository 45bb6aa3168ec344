"""Token counts for budgets: a real tokenizer when one is installed, else an estimate.

With `tiktoken` importable and its `cl100k_base` encoding loadable, counts are exact for
OpenAI's GPT-4-era models and close for others. Otherwise the estimate is one token per 4
ASCII characters (rounded up) plus one per non-ASCII character: English prose and code run
at 3.5 to 4.5 characters a token in BPE vocabularies, and accented, CJK or emoji characters
often take a token (or more) each, so the estimate errs on the high side, which keeps a
budget a budget. Each message also costs `MESSAGE_OVERHEAD` tokens for its role and framing,
as chat formats do.

The tokenizer is looked up on first use, not at import (tiktoken may read its cache or fetch
the encoding then); a failure to load it falls back to the estimate for the whole process.
"""

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
