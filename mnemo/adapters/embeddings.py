"""`OpenAIEmbedder`: an `Embedder` over OpenAI's `POST {base_url}/embeddings` (also Ollama, vLLM,
llama.cpp server). The dimension is given as `dim` or told by the first reply; vectors are
asked for as base64, falling back to floats for a server that refuses it."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from contextlib import suppress
from functools import partial
from typing import Literal, Unpack

import anyio
import msgspec
import numpy as np
import numpy.typing as npt

from mnemo.adapters._http import Counts, HTTPFailure, HTTPOptions, Tokens, logger
from mnemo.adapters._model import OPENAI_BASE_URL, HTTPModel, adapt
from mnemo.adapters.limit import ServerProfile
from mnemo.calls.retry import Budget
from mnemo.errors import (
    EmbeddingError,
    EmbeddingTimeout,
    InvalidInputError,
    check_count,
    first_error,
)
from mnemo.ports import MAX_DIM

Encoding = Literal["base64", "float"]
# An error reply refuses base64 when its message names the parameter or the format.
_COMPLAINT_WORDS = ("encoding_format", "encoding format", "base64")


class DimensionUnknown(EmbeddingError, AttributeError):
    """`dim` read before it is known; an AttributeError, so the `Embedder` check fails meanwhile."""


class OpenAIEmbedder(HTTPModel):
    """An `Embedder` calling `POST {base_url}/embeddings`, `batch_size` texts a request, batches
    concurrently. `api_key` defaults to `OPENAI_API_KEY`; the other keywords are `HTTPOptions`.
    Raises InvalidInputError for a bad `dim`, `batch_size` or limit, or no key for OpenAI's API."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str = OPENAI_BASE_URL,
        api_key: str | None = None,
        dim: int | None = None,
        batch_size: int = 128,
        prices: Mapping[str, tuple[float, float]] | None = None,
        encoding_format: Encoding = "base64",
        **options: Unpack[HTTPOptions],
    ) -> None:
        if encoding_format not in ("base64", "float"):
            raise InvalidInputError(
                f"encoding_format must be 'base64' or 'float', got {encoding_format!r}")
        self._batch_size = check_count("batch_size", batch_size, minimum=1)
        self._dim = None if dim is None else check_count("dim", dim, minimum=1, maximum=MAX_DIM)
        options.setdefault("max_concurrency", 4)
        super().__init__(model, base_url, api_key, prices, options, provider="openai",
                         error=EmbeddingError, timeout_error=EmbeddingTimeout,
                         kind="embedding model")
        self.encoding_format: Encoding = encoding_format

    @property
    def dim(self) -> int:
        """The vector dimension, given or detected; `DimensionUnknown` before `detect_dim()`."""
        if self._dim is None:
            raise DimensionUnknown(
                f"{self.name}: the embedding dimension is not known yet; pass dim= or await "
                "detect_dim() before opening a repo"
            )
        return self._dim

    @dim.setter
    def dim(self, value: int) -> None:
        self._dim = check_count("dim", value, minimum=1, maximum=MAX_DIM)

    def server_profile(self) -> ServerProfile:
        return ServerProfile(self._http.limit.state(), encoding=self.encoding_format)

    def adopt_server_profile(self, stored: ServerProfile) -> None:
        if stored.encoding == "float":
            self.encoding_format = "float"
        super().adopt_server_profile(stored)

    async def detect_dim(self) -> int:
        """The vector dimension, asking the server with one short text if it is not known."""
        if self._dim is None:
            await self.embed(["dimension probe"])
        return self.dim

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """One float32 row per text; EmbeddingError for a failed request or a bad reply."""
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        starts = range(0, len(texts), self._batch_size)
        parts: list[npt.NDArray[np.float32] | None] = [None] * len(starts)

        async def one(slot: int, start: int) -> None:
            parts[slot] = await self._batch(texts[start : start + self._batch_size])

        if len(parts) == 1:
            await one(0, 0)
        else:
            with first_error():  # a failed batch raises its own EmbeddingError, not a group
                async with anyio.create_task_group() as tg:
                    for slot, start in enumerate(starts):
                        tg.start_soon(one, slot, start)
        return np.concatenate([part for part in parts if part is not None], axis=0)

    async def _batch(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        reply = await self._send(list(texts))
        rows = self._rows(reply, len(texts))
        if self._dim is None:
            self._dim = len(rows[0])
        for row in rows:
            if len(row) != self._dim:
                raise EmbeddingError(
                    f"{self._http.name} returned vectors of dimension {len(row)}, but the "
                    f"embedder's dimension is {self._dim}"
                )
        if reply.usage is not None:
            self._usage(*reply.tokens())
        return np.stack(rows).astype(np.float32, copy=False)

    async def _send(self, texts: list[str]) -> Embeddings:
        """POSTs one batch; a refusal of base64 switches to floats for good and asks again."""
        budget = Budget(self.retry_policy)
        while True:
            encoding = self.encoding_format
            payload = {"model": self.model, "input": texts, "encoding_format": encoding}
            refusal = (partial(HTTPFailure.names_any, words=_COMPLAINT_WORDS)
                       if encoding == "base64" else None)
            try:
                return await self._http.post_json(
                    "/embeddings", payload, Embeddings, budget=budget, refusal=refusal,
                    kind="embed")
            except EmbeddingError as exc:
                failure = exc.__cause__
                if isinstance(failure, HTTPFailure) and failure.names_any(("pooling",)):
                    raise EmbeddingError(f"{exc}. {POOLING_FIX}") from failure
                adapt(exc, budget, refusal, self._to_floats)

    def _to_floats(self, failure: HTTPFailure) -> None:
        # Concurrent batches may see the same refusal: only the first one logs it.
        if self.encoding_format == "base64":
            self.encoding_format = "float"
            logger.warning("%s refused base64 vectors (%s); asking for floats from now on",
                           self._http.name, failure)

    def _rows(self, reply: Embeddings, count: int) -> list[npt.NDArray[np.float32]]:
        """The reply's vectors ordered by `index`, checked to be one per text."""
        indexed: dict[int, npt.NDArray[np.float32]] = {}
        for position, item in enumerate(reply.data):
            index = position if item.index is None else item.index
            if not 0 <= index < count or index in indexed:
                raise EmbeddingError(
                    f"{self._http.name}: data[{position}] has a bad index {index!r} "
                    f"for {count} inputs"
                )
            indexed[index] = self._vector(position, item.embedding)
        if len(indexed) != count:
            raise EmbeddingError(
                f"{self._http.name} returned {len(indexed)} vectors for {count} texts"
            )
        return [indexed[i] for i in range(count)]

    def _vector(self, position: int, raw: list[object] | str) -> npt.NDArray[np.float32]:
        """One embedding as a float32 row: JSON numbers, or base64 of little-endian float32."""
        if isinstance(raw, str):
            try:
                packed = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise EmbeddingError(
                    f"{self._http.name}: data[{position}]'s embedding is not base64") from exc
            if len(packed) % 4:
                raise EmbeddingError(
                    f"{self._http.name}: data[{position}]'s embedding is {len(packed)} bytes, "
                    "not float32s")
            return np.frombuffer(packed, dtype="<f4")
        if raw and all(isinstance(item, list) for item in raw):
            sizes = sorted({len(item) for item in raw if isinstance(item, list)})
            size = str(sizes[0]) if len(sizes) == 1 else "/".join(map(str, sizes[:3]))
            raise EmbeddingError(
                f"{self._http.name} returned {len(raw)} vectors of dimension {size} for "
                f"text {position}, one per token, instead of one vector per text: the server "
                f"does not pool its token embeddings. {POOLING_FIX}"
            )
        with suppress(TypeError, ValueError):
            if (row := np.asarray(raw, dtype=np.float32)).ndim == 1:
                return row
        raise EmbeddingError(f"{self._http.name} returned non-numeric vectors")


POOLING_FIX = (
    "Start it with pooling (llama.cpp's llama-server: --pooling mean; llama-cpp-python: a "
    "pooling type other than none) or serve an embedding model, which pools"
)


class _Vector(msgspec.Struct):
    # JSON numbers, base64 of float32s, or (a server that does not pool) a list per token.
    embedding: str | list[object]
    index: int | None = None


class Embeddings(msgspec.Struct):
    """An embeddings reply: its vectors (none: garbage, retried) and the tokens it read."""

    data: list[_Vector]
    usage: Counts | None = None

    def tokens(self) -> Tokens:
        counts = self.usage or Counts()
        return counts.prompt_tokens if counts.total_tokens is None else counts.total_tokens, 0
