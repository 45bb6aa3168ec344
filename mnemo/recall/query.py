"""What a recall's query becomes: its words for BM25, and the embedder that embeds it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from mnemo.adapters import _text
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
    left."""
    kept = [w for w in _text.words(query) if not _text.is_stopword(w.lower())]
    return " ".join(kept) if kept else query
