"""`OpenAIEmbedder` over a real socket: ordering, batching, dimension detection and checks."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

from mnemo.adapters.embeddings import DimensionUnknown, OpenAIEmbedder
from mnemo.errors import EmbeddingError, InvalidInputError
from mnemo.ports import Embedder
from mnemo.retry import Backoff
from tests.adapters.provider_server import Answer, Fail, ProviderServer, Raw, vector

FAST = Backoff(base=0.001)


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer(dim=8) as s:
        yield s


async def test_embeds_in_input_order(server: ProviderServer) -> None:
    """Vectors come back as float32 rows in input order, though the server sends them reversed."""
    texts = ["alpha one", "bravo two", "charlie three"]
    async with OpenAIEmbedder("e", base_url=server.openai_url, api_key="k", dim=8) as embedder:
        vectors = await embedder.embed(texts)
    assert vectors.dtype == np.float32
    assert vectors.shape == (3, 8)
    np.testing.assert_array_equal(vectors, np.array([vector(t, 8) for t in texts]))
    [sent] = server.requests
    assert sent.path == "/v1/embeddings"
    assert sent.body == {"model": "e", "input": texts}
    assert sent.headers["authorization"] == "Bearer k"


async def test_batches(server: ProviderServer) -> None:
    """batch_size=2 sends 5 texts as 3 requests; the rows stay in order."""
    texts = [f"w{i} text" for i in range(5)]
    async with OpenAIEmbedder("e", base_url=server.openai_url, dim=8, batch_size=2) as embedder:
        vectors = await embedder.embed(texts)
    assert sorted(len(r.body["input"]) for r in server.requests) == [1, 2, 2]
    np.testing.assert_array_equal(vectors, np.array([vector(t, 8) for t in texts]))


async def test_dim_is_detected_once(server: ProviderServer) -> None:
    """Before detection `dim` raises a clear EmbeddingError (and the protocol check says no);
    detect_dim asks once."""
    async with OpenAIEmbedder("e", base_url=server.openai_url) as embedder:
        with pytest.raises(EmbeddingError, match="detect_dim"):
            _ = embedder.dim
        assert not isinstance(embedder, Embedder)
        assert await embedder.detect_dim() == 8
        assert await embedder.detect_dim() == 8
        assert embedder.dim == 8
        assert isinstance(embedder, Embedder)
    assert len(server.requests) == 1


async def test_unknown_dim_error_is_both_kinds() -> None:
    """The unknown-dimension error is an EmbeddingError and an AttributeError."""
    assert issubclass(DimensionUnknown, EmbeddingError)
    assert issubclass(DimensionUnknown, AttributeError)


async def test_other_dimension_is_refused_naming_both(server: ProviderServer) -> None:
    """A reply of dimension 8 for an embedder of dimension 16 is an EmbeddingError naming both."""
    async with OpenAIEmbedder("e", base_url=server.openai_url, dim=16) as embedder:
        with pytest.raises(EmbeddingError, match="dimension 8, but the embedder's dimension is 16"):
            await embedder.embed(["x"])


async def test_dimension_change_between_replies(server: ProviderServer) -> None:
    """A detected dimension holds: a later reply of another size is refused."""
    async with OpenAIEmbedder("e", base_url=server.openai_url) as embedder:
        await embedder.detect_dim()
        server.script(Answer(dim=4))
        with pytest.raises(EmbeddingError, match=r"dimension 4.*dimension is 8"):
            await embedder.embed(["x"])


async def test_http_errors_name_the_status(server: ProviderServer) -> None:
    """Failures become EmbeddingError naming the HTTP status."""
    async with OpenAIEmbedder(
        "e", base_url=server.openai_url, dim=8, max_retries=1, backoff=FAST
    ) as embedder:
        server.script(Fail(500, "gpu fell over"), Fail(500, "gpu fell over"))
        with pytest.raises(EmbeddingError, match=r"HTTP 500.*gpu fell over"):
            await embedder.embed(["x"])
        server.script(Fail(400, "input too long"))
        with pytest.raises(EmbeddingError, match=r"HTTP 400.*input too long"):
            await embedder.embed(["x"])


async def test_a_failing_batch_raises_its_own_error(server: ProviderServer) -> None:
    """With several batches, one refused batch raises its EmbeddingError, not a group."""
    async with OpenAIEmbedder(
        "e", base_url=server.openai_url, dim=8, batch_size=1, max_retries=0
    ) as embedder:
        server.script(Fail(400, "nope"))
        with pytest.raises(EmbeddingError, match="nope"):
            await embedder.embed(["a", "b", "c"])


async def test_wrong_vector_count_is_refused(server: ProviderServer) -> None:
    """One vector for two texts is an EmbeddingError."""
    reply = {"data": [{"index": 0, "embedding": [0.0] * 8}], "usage": {"prompt_tokens": 1}}
    server.script(Raw(json.dumps(reply).encode()))
    async with OpenAIEmbedder("e", base_url=server.openai_url, dim=8) as embedder:
        with pytest.raises(EmbeddingError, match="1 vectors for 2 texts"):
            await embedder.embed(["a", "b"])


async def test_retry_then_success(server: ProviderServer) -> None:
    """A 429 then success returns the vectors."""
    server.script(Fail(429, "slow down", {"Retry-After": "0"}))
    async with OpenAIEmbedder("e", base_url=server.openai_url, dim=8) as embedder:
        vectors = await embedder.embed(["a"])
    assert vectors.shape == (1, 8)
    assert server.statuses == [429, 200]


async def test_empty_input_and_bad_arguments(server: ProviderServer) -> None:
    """No texts, no request; a bad dim or batch size is refused at construction."""
    async with OpenAIEmbedder("e", base_url=server.openai_url, dim=8) as embedder:
        assert (await embedder.embed([])).shape == (0, 8)
    assert server.requests == []
    with pytest.raises(InvalidInputError):
        OpenAIEmbedder("e", base_url=server.openai_url, dim=0)
    with pytest.raises(InvalidInputError):
        OpenAIEmbedder("e", base_url=server.openai_url, batch_size=0)
