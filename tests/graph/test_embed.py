"""`mnemo.ports.embed`: an embedder's failure reaches the caller as one
`EmbeddingError` that says what failed."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

import mnemo
from mnemo.ports import embed


class Refusing:
    """An embedder that fails with `error`."""

    def __init__(self, error: Exception) -> None:
        self.dim, self.name, self.error = 8, "refusing", error

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise self.error


async def test_an_embedders_own_embedding_error_is_passed_on_as_it_is() -> None:
    """Before, it was wrapped again: "the embedder failed: EmbeddingError('...')"."""
    refused = mnemo.EmbeddingError("the server refused the request: HTTP 400")
    with pytest.raises(mnemo.EmbeddingError) as caught:
        await embed(Refusing(refused), ["a text"])
    assert caught.value is refused


async def test_another_exception_becomes_an_embedding_error_with_it_as_the_cause() -> None:
    with pytest.raises(mnemo.EmbeddingError, match="the embedder failed: RuntimeError") as caught:
        await embed(Refusing(RuntimeError("gone")), ["a text"])
    assert isinstance(caught.value.__cause__, RuntimeError)
