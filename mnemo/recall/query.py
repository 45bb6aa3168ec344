"""What a recall's query becomes: its words for BM25, and the embedder that embeds it."""

from __future__ import annotations

import unicodedata
from collections.abc import Awaitable, Callable, Sequence

from mnemo.adapters import _text
from mnemo.inputs import query_words
from mnemo.ports import Embedder


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

    The rest stays as written, for the search to split (`mnemo.inputs.query_words`):
    rebuilt from `_text.words`, "हिन्दी" was ह, न and द, as those stop at a combining mark.
    Composed first, so that an accent is no mark beside a stopword's letters ("a" in "á").
    """
    kept = _text.without_stopwords(unicodedata.normalize("NFC", query))
    return kept if query_words(kept) else query


def words(query: str) -> list[str]:
    """The query's lower-cased words, as `restates` compares them."""
    return _text.tokens(query)


# A near-exact restatement may differ by one word only when it is at least this long: in a
# shorter text one word is too much of its meaning.
_NEAR_EXACT_WORDS = 5


def restatement(query: Sequence[str], text: str) -> int | None:
    """How closely `text` restates the query whose lower-cased words (`words`) are `query`:
    0 for the same words in the same order (case, punctuation and spacing aside), 1 for a
    near-exact restatement (five words or more, one word added, dropped or changed), None
    otherwise."""
    # Every word of `text` is a substring of its lowered text, so a restatement leaves at most
    # one of the query's words out of it: most candidates are turned away here, without
    # tokenizing them.
    lowered = _text.normalise(text).lower()
    if sum(word not in lowered for word in set(query)) > 1:
        return None
    other = _text.tokens(text)
    if other == list(query):
        return 0
    if min(len(query), len(other)) < _NEAR_EXACT_WORDS or abs(len(query) - len(other)) > 1:
        return None
    return 1 if _one_edit(list(query), other) else None


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
