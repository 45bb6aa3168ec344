"""The search tags' vectors kept between recalls (mnemo/recall/query.py): the same
matrix as embedding everything, fewer texts embedded, bounded, per embedder."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, strategies as st

import mnemo
from mnemo.recall.query import TagVectors
from tests.fakes import FakeEmbedder


class Counting(mnemo.HashEmbedder):
    """The hashing embedder, recording each call's texts."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[list[str]] = []

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.asked.append(list(texts))
        return np.asarray(await super().embed(texts), dtype=np.float32)


WORDS = st.sampled_from(["caroline", "melanie", "art", "adoption", "camping", "pottery"])


@given(recalls=st.lists(st.tuples(st.text(min_size=1, max_size=20), st.lists(WORDS, max_size=5)),
                        min_size=1, max_size=8),
       size=st.integers(0, 4))
async def test_each_recall_gets_what_embedding_everything_gives(
    recalls: list[tuple[str, list[str]]], size: int
) -> None:
    """Whatever was kept (or evicted: `size` is small), the rows are the query's and each
    tag's vectors, in order, repeats included; the kept entries never pass `size`."""
    embedder = Counting()
    kept = TagVectors(size)
    for query, tags in recalls:
        got = await kept.embed(embedder, query, tags)
        expected = np.asarray(await mnemo.HashEmbedder().embed([query, *tags]), np.float32)
        np.testing.assert_allclose(got, expected, atol=1e-6)
        assert len(kept) <= size


async def test_a_kept_tag_is_not_embedded_again() -> None:
    embedder = Counting()
    kept = TagVectors()
    await kept.embed(embedder, "what art does Caroline make", ["caroline", "art"])
    await kept.embed(embedder, "where did Caroline go camping", ["caroline", "camping"])
    assert embedder.asked == [
        ["what art does Caroline make", "caroline", "art"],
        ["where did Caroline go camping", "camping"],
    ]


async def test_each_embedder_keeps_its_own_vectors() -> None:
    """Two embedders (two repos' models) never answer for each other."""
    one, other = FakeEmbedder(dim=8), FakeEmbedder(dim=16)
    kept = TagVectors()
    first = await kept.embed(one, "q", ["caroline"])
    second = await kept.embed(other, "q", ["caroline"])
    assert first.shape == (2, 8)
    assert second.shape == (2, 16)


async def test_a_failing_embedder_keeps_nothing() -> None:
    embedder = FakeEmbedder()
    embedder.fail = True
    kept = TagVectors()
    with pytest.raises(mnemo.EmbeddingError):
        await kept.embed(embedder, "q", ["caroline"])
    assert len(kept) == 0
