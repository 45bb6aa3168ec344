"""A Semantic load embeds the messages that have no vector yet in bounded batches, one
embedder call (and timeout) each, and keeps every batch it made: a load that fails part way
leaves the next one only the rest to embed (both backends)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import mnemo
from mnemo.conversation.service import BATCH_TEXTS
from tests.conversation._support import user
from tests.fakes import FakeEmbedder


class Batches(FakeEmbedder):
    """A FakeEmbedder that records each call's size and fails its `fail_at`-th call."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []
        self.fail_at: int | None = None

    async def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        self.sizes.append(len(texts))
        if self.fail_at == len(self.sizes):
            raise RuntimeError("the embedder is down")
        return await super().embed(texts)


async def test_a_semantic_load_embeds_what_it_lacks_in_batches(store: str) -> None:
    embedder = Batches()
    count = 2 * BATCH_TEXTS + 22
    async with mnemo.Memory(store, embedder=embedder) as mem:
        await mem.conversation().save("t", [user(f"note {i} on the deploy") for i in range(count)])
        assert embedder.sizes == []  # a Recent save stores no vectors
        semantic = mem.conversation(retrieval=mnemo.Semantic(k=5))
        embedder.sizes.clear()
        embedder.fail_at = 3
        with pytest.raises(mnemo.EmbeddingError):
            await semantic.load("t", query="note on the deploy")
        assert embedder.sizes == [BATCH_TEXTS, BATCH_TEXTS, 22]
        embedder.sizes.clear()
        embedder.fail_at = None
        loaded = await semantic.load("t", query="note on the deploy")
        assert embedder.sizes == [22, 1]  # the batch that failed, then the query
        assert len(loaded) == 5
        embedder.sizes.clear()
        await semantic.load("t", query="note on the deploy")
        assert embedder.sizes == [1]


class Probing(Batches):
    """A `Batches` that, as an HTTP embedder, learns its dimension by asking (`detect_dim`)."""

    def __init__(self) -> None:
        super().__init__()
        self.probes = 0

    async def detect_dim(self) -> int:
        self.probes += 1
        return self.dim


async def test_a_save_or_append_with_nothing_new_asks_the_embedder_nothing(store: str) -> None:
    """With Semantic retrieval, a re-save of a stored history and an append of no message ask
    the embedder nothing, not even its dimension (an HTTP embedder's request)."""
    history = [user("note on the deploy"), user("the rollout is done")]
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.conversation(retrieval=mnemo.Semantic(k=5)).save("t", history)
    embedder = Probing()
    async with mnemo.Memory(store, embedder=embedder) as mem:
        semantic = mem.conversation(retrieval=mnemo.Semantic(k=5))
        assert await semantic.save("t", history) == []
        assert await semantic.append("t", []) == []
        assert (embedder.sizes, embedder.probes) == ([], 0)
