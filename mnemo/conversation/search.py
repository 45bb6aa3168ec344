"""Keyword search over every thread's messages, the backend-neutral part: a query is quoted
words the backends OR-combine; relevance picks a pool, which `rank_by_recency` reorders."""

from __future__ import annotations

import heapq
import re
import unicodedata
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TypeVar

from mnemo.conversation.model import SearchHit
from mnemo.conversation.render import flat
from mnemo.text import is_stopword, stem

SNIPPET_CHARS = 300
# A snippet starts at most `SNIPPET_LEAD` words and `LEAD_CHARS` characters before the word
# it shows, and holds `SNIPPET_WORDS` words.
SNIPPET_LEAD = 8
LEAD_CHARS = 100
SNIPPET_WORDS = 48
VIEW_SNAPSHOTS = 3

# A candidate's key in its backend (a rowid, a message id): ties are broken by it.
K = TypeVar("K", int, str)


def recency_weight(age_seconds: float) -> float:
    """0.5 + 0.5 * 2^(-age / 30 days); 1.0 for a message from now (or the future)."""
    age_days = max(0.0, age_seconds) / 86_400.0
    return 0.5 + 0.5 * float(0.5 ** (age_days / 30.0))


def pool_size(limit: int) -> int:
    """How many of the most relevant candidates recency may reorder for `limit` hits (8 a hit,
    40 at least)."""
    return max(40, limit * 8)


def rank_by_recency(
    candidates: Iterable[tuple[K, float, datetime]], *, now: datetime, limit: int
) -> list[tuple[float, K]]:
    """The best `limit` of (key, relevance, recorded_at) candidates as (rank, key), best
    first by relevance times `recency_weight` (ties: the larger key)."""
    return heapq.nlargest(limit, ((relevance * recency_weight((now - at).total_seconds()), key)
                                  for key, relevance, at in candidates))


def hit_snippet(text: str, words: Sequence[str]) -> str:
    """The message's text on one line when it fits `SNIPPET_CHARS`, else from a little before
    the first query word it holds (folded, lightly stemmed; up to `SNIPPET_LEAD` words and
    `LEAD_CHARS` characters before it), else its start; the same on every backend."""
    tokens = text.split()
    whole = " ".join(tokens)
    if len(whole) <= SNIPPET_CHARS:
        return whole
    at = _first_word(whole, tokens, words)
    if at is None:
        return flat(" ".join(tokens[:SNIPPET_WORDS]), SNIPPET_CHARS)
    begin, lead = at, 0
    while begin > max(0, at - SNIPPET_LEAD) and lead + len(tokens[begin - 1]) < LEAD_CHARS:
        begin -= 1
        lead += len(tokens[begin]) + 1
    shown = ("..." if begin else "") + " ".join(tokens[begin:at + SNIPPET_WORDS])
    return flat(shown, SNIPPET_CHARS)


def _first_word(whole: str, tokens: list[str], words: Sequence[str]) -> int | None:
    """The index in `tokens` (`whole`'s, space-joined) of the first that holds a query word."""
    folded = [word for word in map(_fold, words) if not is_stopword(word)]
    keys = {key for word in folded for key in (word, stem(word)) if len(key) >= 2}
    if not keys:
        return None
    keyed = re.compile("|".join(map(re.escape, sorted(keys, key=lambda k: (-len(k), k)))))
    if whole.isascii():  # one scan of the text, which folds to its own length
        at = _word_start(keyed, whole.lower())
        return None if at is None else whole.count(" ", 0, at)
    for i, token in enumerate(tokens):
        if _word_start(keyed, _fold(token)) is not None:
            return i
    return None


def _word_start(keyed: re.Pattern[str], text: str) -> int | None:
    """Where the first match of `keyed` (longest keys first) in `text` that starts a word
    (after no letter or digit: an underscore splits words) begins; a key of two letters must
    be the whole word ("id" of "ids" is not "idea")."""
    for found in keyed.finditer(text):
        start, end = found.span()
        if (start == 0 or not text[start - 1].isalnum()) and (
                end - start > 2 or end == len(text) or not text[end].isalnum()):
            return start
    return None


def _fold(text: str) -> str:
    """`text` case-folded and without its accents ("Café" and "cafe" alike)."""
    folded = text.casefold()
    if folded.isascii():  # most text: nothing to decompose
        return folded
    return "".join(c for c in unicodedata.normalize("NFKD", folded) if not unicodedata.combining(c))


def render_hits(hits: Sequence[SearchHit]) -> str:
    """Hits as text for a model: one line each, with the id to pass to view_messages."""
    if not hits:
        return "No messages found."
    return "\n".join(
        f"{i}. [{h.message_id}] thread {h.thread_id}, message {h.seq} ({h.role}): "
        f"{flat(h.snippet, SNIPPET_CHARS + 20)}"
        for i, h in enumerate(hits, 1))
