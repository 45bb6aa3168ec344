"""The search tags' vectors, kept from one recall to the next.

A recall embeds its query and its plan's search tags in one call. The tags are a few words
each ("caroline", "adoption"), and the same ones come back query after query (a speaker's
name, a topic): on a LoCoMo conversation 4.6 texts a recall, each adding to the default
embedder's call. So each embedder's tag vectors are kept (least recently used out
first) and only the query and the tags not seen yet are embedded. An embedder gives a text
the same vector whenever it is asked (mnemo records a repo's model and refuses another), so
nothing a recall returns depends on what was kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from mnemo.episode.annotation import embed
from mnemo.graph.model import Vector
from mnemo.ports import Embedder
from mnemo.recall.query import query_side

# Tags kept across every repo's embedder: 4,096 x 384 floats is 6 MB.
KEPT = 4096


class TagVectors:
    """`embed(query_side(embedder), [query, *tags])`, with the tags' vectors remembered."""

    def __init__(self, size: int = KEPT) -> None:
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        self._size = size
        # (id(embedder), tag) -> (the embedder, its vector): the embedder is held so that its
        # id is not reused by another while the entry lives.
        self._kept: OrderedDict[tuple[int, str], tuple[Embedder, Vector]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    async def embed(self, embedder: Embedder, query: str, tags: Sequence[str]) -> Vector:
        """The vectors of `query` then of each of `tags`, as rows of one matrix.

        Raises:
            EmbeddingError: as `mnemo.episode.annotation.embed`.
        """
        unique = dict.fromkeys(tags)
        known = {tag: vector for tag in unique if (vector := self._get(embedder, tag)) is not None}
        missing = [tag for tag in unique if tag not in known]
        fresh = await embed(query_side(embedder), [query, *missing])
        for tag, vector in zip(missing, fresh[1:], strict=True):
            known[tag] = vector
            self._put(embedder, tag, vector)
        if not tags:
            return fresh
        return np.vstack([fresh[0], *(known[tag] for tag in tags)])

    def _get(self, embedder: Embedder, tag: str) -> Vector | None:
        entry = self._kept.get((id(embedder), tag))
        if entry is None or entry[0] is not embedder:
            return None
        self._kept.move_to_end((id(embedder), tag))
        return entry[1]

    def _put(self, embedder: Embedder, tag: str, vector: Vector) -> None:
        if self._size == 0:
            return
        self._kept[(id(embedder), tag)] = (embedder, vector.copy())
        self._kept.move_to_end((id(embedder), tag))
        while len(self._kept) > self._size:
            self._kept.popitem(last=False)
