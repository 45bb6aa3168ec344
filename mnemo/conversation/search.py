"""Keyword search over every thread's messages: the backend-neutral part.

Any user text is a safe query: it is split into words (`mnemo.inputs.query_words`, distinct,
at most `MAX_QUERY_TERMS`), and a backend (`ThreadStore.search`) searches for them with
stemming, quoting each word so nothing in it is query syntax and OR-combining them. AND, OR
and NOT are words like any other (API.md): an agent writing "keep NOT delete" means the words,
and an operator would silently drop matches.

Ranking: the backend's relevance score (bm25 on SQLite) picks a pool of the best candidates
(`POOL_FACTOR` times the limit, at least `MIN_POOL`), then each score is weighted by recency,
`0.5 + 0.5 * 2^(-age / 30 days)` (`rank_by_recency`): a month-old message keeps 75% of its
score and none drops below half, so relevance leads and recency breaks near-ties. Snippets
(about 300 characters, `clip`) are made only for the hits returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TypeVar

from mnemo.conversation.model import SearchHit
from mnemo.conversation.render import flat

POOL_FACTOR = 8
MIN_POOL = 40
HALF_LIFE_DAYS = 30.0
SNIPPET_CHARS = 300
VIEW_SNAPSHOTS = 3

# A candidate's key in its backend (a rowid, a message id): ties are broken by it.
K = TypeVar("K", int, str)


def recency_weight(age_seconds: float) -> float:
    """0.5 + 0.5 * 2^(-age / 30 days); 1.0 for a message from now (or the future)."""
    age_days = max(0.0, age_seconds) / 86_400.0
    return 0.5 + 0.5 * float(0.5 ** (age_days / HALF_LIFE_DAYS))


def pool_size(limit: int) -> int:
    """How many of the most relevant candidates recency may reorder for `limit` hits."""
    return max(MIN_POOL, limit * POOL_FACTOR)


def rank_by_recency(
    candidates: Iterable[tuple[K, float, datetime]], *, now: datetime, limit: int
) -> list[tuple[float, K]]:
    """The best `limit` of (key, relevance, recorded_at) candidates as (rank, key), best
    first: relevance (higher is better) times `recency_weight`; ties go to the larger key."""
    return sorted(
        (
            (relevance * recency_weight((now - at).total_seconds()), key)
            for key, relevance, at in candidates
        ),
        reverse=True,
    )[:limit]


def clip(snippet: str) -> str:
    """A snippet on one line, at most `SNIPPET_CHARS` characters."""
    one = " ".join(snippet.split())
    return one if len(one) <= SNIPPET_CHARS else one[: SNIPPET_CHARS - 3].rstrip() + "..."


def render_hits(hits: Sequence[SearchHit]) -> str:
    """Hits as text for a model: one line each, with the id to pass to view_messages."""
    if not hits:
        return "No messages found."
    return "\n".join(
        f"{i}. [{h.message_id}] thread {h.thread_id}, message {h.seq} ({h.role}): "
        f"{flat(h.snippet, SNIPPET_CHARS + 20)}"
        for i, h in enumerate(hits, 1)
    )
