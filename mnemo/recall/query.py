"""What a recall's query becomes: its words for BM25, and the embedder that embeds it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio.to_thread

from mnemo import text as _text
from mnemo.ports import Embedder
from mnemo.recall.speakers import query_names, without_names
from mnemo.text import MAX_QUERY_TERMS, query_words

# A query up to this long is split on the event loop; a longer one in a worker thread (one at
# the size limit would hold the loop on a busy machine).
INLINE_CHARS = 2_000


@dataclass(frozen=True, slots=True)
class QueryParts:
    """What recall makes of a query: `terms` for BM25 (`keywords`), `words` for restatements
    (`words`), `dense` for the dense channel (the query, or `without_names` of it), and the
    `names` it mentions for the speaker match (`speakers.query_names`)."""

    terms: str
    words: list[str]
    dense: str
    names: frozenset[str]


def query_parts(query: str, *, dense_without_names: bool) -> QueryParts:
    """The parts of `query` (see `QueryParts`)."""
    return QueryParts(keywords(query), words(query),
                      without_names(query) if dense_without_names else query,
                      query_names(query))


async def split(query: str, *, dense_without_names: bool) -> QueryParts:
    """`query_parts`, in a worker thread for a query longer than `INLINE_CHARS`: each part
    reads the whole query, so its cost grows with the query's length."""
    if len(query) <= INLINE_CHARS:
        return query_parts(query, dense_without_names=dense_without_names)
    return await anyio.to_thread.run_sync(
        lambda: query_parts(query, dense_without_names=dense_without_names)
    )


class _Queries:
    """An embedder's query side, as an `Embedder`."""

    def __init__(
        self, dim: int, embed: Callable[[Sequence[str]], Awaitable[Sequence[Sequence[float]]]]
    ) -> None:
        self.dim = dim
        self._embed = embed

    async def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        return await self._embed(texts)


def query_side(embedder: Embedder) -> Embedder:
    """The embedder to embed a query with. Models trained with prefixes (e5: "query: "
    against "passage: ") embed what searches differently from what is stored, through an
    `embed_queries` method; the others embed both alike."""
    queries = getattr(embedder, "embed_queries", None)
    return embedder if queries is None else _Queries(embedder.dim, queries)


def keywords(query: str) -> str:
    """The query without stopwords, for BM25: "when did", "the" and "to" only add noise to an
    OR query (measured on LoCoMo: R@10 0.40 -> 0.52 lexical-only). All of it if nothing is
    left.

    The rest stays as written, for the search to split (`mnemo.text.query_words`), composed
    (NFC), so that an accent is no mark beside a stopword's letters ("a" in "á").
    """
    kept = _text.without_stopwords(query)
    return kept if query_words(kept) else query


# The longest query whose restatements are looked for, in words: twice the words a search
# keeps (`mnemo.text.MAX_QUERY_TERMS`). A longer query is searched, not restated; the check
# reads at most this many words (and two more) of each candidate, whatever its length.
RESTATED_WORDS = 2 * MAX_QUERY_TERMS


def words(query: str) -> list[str]:
    """The query's lower-cased words, as `restatement` compares them: at most
    `RESTATED_WORDS` + 1 (a longer query restates nothing)."""
    return _text.first_tokens(query, RESTATED_WORDS + 1)


# A near-exact restatement may differ by one word only when it is at least this long: in a
# shorter text one word is too much of its meaning.
_NEAR_EXACT_WORDS = 5


def restatement(query: Sequence[str], text: str) -> int | None:
    """How closely `text` restates the query whose lower-cased words (`words`) are `query`:
    0 for the same words in the same order (case, punctuation and spacing aside), 1 for a
    near-exact restatement (five words or more, one word added, dropped or changed), None
    otherwise, and for a query of more than `RESTATED_WORDS` words. The work is bounded by
    the query's words: at most `len(query) + 2` words of `text` are read."""
    if not query or len(query) > RESTATED_WORDS:
        return None
    if len(text) <= _TURN_AWAY_CHARS and text.isascii() and _two_missing(query, text.lower()):
        return None
    other = _text.first_tokens(text, len(query) + 2)
    if other == list(query):
        return 0
    if min(len(query), len(other)) < _NEAR_EXACT_WORDS or abs(len(query) - len(other)) > 1:
        return None
    return 1 if _one_edit(list(query), other) else None


# An ASCII text up to this long is turned away before it is split when two of the query's
# words are not in it (each of its words is a substring of its lower-cased text, `mnemo.text`
# splits ASCII so): most candidates restate nothing, and splitting each would cost. Another
# text is split as far as the query's length only.
_TURN_AWAY_CHARS = 1_000


def _two_missing(query: Sequence[str], lowered: str) -> bool:
    """Whether two distinct words of `query` are not substrings of `lowered`: then at most
    `len(query) - 2` of the text's words can be the query's, too few for either tier."""
    missing = 0
    for word in set(query):
        if word not in lowered:
            missing += 1
            if missing == 2:
                return True
    return False


def _one_edit(a: list[str], b: list[str]) -> bool:
    """At most one word inserted, deleted or substituted between `a` and `b`."""
    if len(a) > len(b):
        a, b = b, a
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    if len(a) == len(b):
        return a[i + 1 :] == b[i + 1 :]
    return a[i:] == b[i + 1 :]
