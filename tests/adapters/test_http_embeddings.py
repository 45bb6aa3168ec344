"""`OpenAIEmbedder` over a real socket: ordering, batching, dimension detection and checks."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

from mnemo.adapters.embeddings import DimensionUnknown, OpenAIEmbedder
from mnemo.calls.retry import Backoff
from mnemo.errors import EmbeddingError, InvalidInputError
from mnemo.ports import Embedder
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
    assert sent.body == {"model": "e", "input": texts, "encoding_format": "base64"}
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
    for dim in (0, 16_001):
        with pytest.raises(InvalidInputError):
            OpenAIEmbedder("e", base_url=server.openai_url, dim=dim)
    with pytest.raises(InvalidInputError):
        OpenAIEmbedder("e", base_url=server.openai_url, batch_size=0)


# ---- the vectors' wire format ---------------------------------------------------------------


async def test_floats_are_asked_for_when_told_and_read_alike(server: ProviderServer) -> None:
    """`encoding_format="float"` asks for JSON numbers; the rows are the same as base64's."""
    texts = ["alpha one", "bravo two"]
    async with OpenAIEmbedder("e", base_url=server.openai_url, dim=8) as packed, \
            OpenAIEmbedder("e", base_url=server.openai_url, dim=8,
                           encoding_format="float") as floats:
        np.testing.assert_array_equal(await packed.embed(texts), await floats.embed(texts))
    assert [r.body["encoding_format"] for r in server.requests] == ["base64", "float"]
    with pytest.raises(InvalidInputError, match="encoding_format"):
        OpenAIEmbedder("e", base_url=server.openai_url, encoding_format="int8")  # type: ignore[arg-type]


async def test_a_server_that_ignores_base64_is_read_as_floats(server: ProviderServer) -> None:
    """Asked for base64, a server that answers numbers (it ignores the parameter) is read."""
    reply = {"data": [{"index": 0, "embedding": [0.5, -0.25]}], "usage": {"prompt_tokens": 1}}
    server.script(Raw(json.dumps(reply).encode()))
    async with OpenAIEmbedder("e", base_url=server.openai_url) as embedder:
        vectors = await embedder.embed(["a"])
        assert embedder.encoding_format == "base64"
    np.testing.assert_array_equal(vectors, np.array([[0.5, -0.25]], dtype=np.float32))


async def test_a_refusal_of_base64_switches_to_floats_for_good(server: ProviderServer) -> None:
    """An error reply naming the parameter is a refusal: the batch is asked again for floats,
    within its budget (a budget of one call has none left for it), and every later request
    asks for floats."""
    server.script(Fail(400, "Unsupported encoding_format: base64"))
    async with OpenAIEmbedder("e", base_url=server.openai_url, dim=8, max_retries=0) as embedder:
        with pytest.raises(EmbeddingError, match=r"refused the request.*encoding_format"):
            await embedder.embed(["alpha one"])
        assert embedder.encoding_format == "float"
    server.script(Fail(400, "Unsupported encoding_format: base64"))
    async with OpenAIEmbedder("e", base_url=server.openai_url, dim=8) as embedder:
        first = await embedder.embed(["alpha one"])
        second = await embedder.embed(["bravo two"])
        assert embedder.encoding_format == "float"
    np.testing.assert_array_equal(first, np.array([vector("alpha one", 8)]))
    np.testing.assert_array_equal(second, np.array([vector("bravo two", 8)]))
    assert [r.body["encoding_format"] for r in server.requests] == [
        "base64", "base64", "float", "float"]
    assert server.statuses == [400, 400, 200, 200]


async def test_other_errors_are_not_taken_for_a_refusal_of_base64(
    server: ProviderServer,
) -> None:
    """An error that does not name the format (an unknown model) stays an error, and base64
    stays asked for."""
    server.script(Fail(404, "model 'e' not found"))
    async with OpenAIEmbedder("e", base_url=server.openai_url, dim=8) as embedder:
        with pytest.raises(EmbeddingError, match=r"HTTP 404.*not found"):
            await embedder.embed(["x"])
        assert embedder.encoding_format == "base64"
    assert len(server.requests) == 1


@pytest.mark.parametrize(("embedding", "problem"), [
    ("not base64 at all!", "not base64"),
    ("AAAA", "3 bytes, not float32s"),
    ([[0.0, 1.0], 3], "non-numeric"),
    (["x", "y"], "non-numeric"),
])
async def test_malformed_vectors_are_an_embedding_error(
    server: ProviderServer, embedding: object, problem: str
) -> None:
    """A vector that is neither numbers nor base64 of float32s is an EmbeddingError saying so."""
    reply = {"data": [{"index": 0, "embedding": embedding}], "usage": {"prompt_tokens": 1}}
    server.script(Raw(json.dumps(reply).encode()))
    async with OpenAIEmbedder("e", base_url=server.openai_url, max_retries=0) as embedder:
        with pytest.raises(EmbeddingError, match=problem):
            await embedder.embed(["a"])


async def test_a_reply_without_data_is_retried_within_the_budget(server: ProviderServer) -> None:
    """A 200 reply without a data list is garbage: retried like a cut body (it
    raised at once), and past the budget an EmbeddingError saying what was wrong."""
    server.script(Raw(json.dumps({"object": "list"}).encode()))
    async with OpenAIEmbedder("e", base_url=server.openai_url, dim=8, backoff=FAST) as embedder:
        vectors = await embedder.embed(["alpha one"])
    np.testing.assert_array_equal(vectors, np.array([vector("alpha one", 8)]))
    assert len(server.requests) == 2
    server.script(Raw(json.dumps({"object": "list"}).encode()))
    async with OpenAIEmbedder("e", base_url=server.openai_url, dim=8, max_retries=0) as embedder:
        with pytest.raises(EmbeddingError, match="missing required field `data`"):
            await embedder.embed(["x"])


async def test_one_vector_per_token_is_named_with_its_fix() -> None:
    """A server that answers each text with one vector per token (llama-cpp-python's with a
    model that does not pool) is an EmbeddingError saying so and how to start it with pooling,
    not "non-numeric vectors"."""
    with ProviderServer(dim=8, per_token=True) as server:
        async with OpenAIEmbedder("e", base_url=server.openai_url, max_retries=0) as embedder:
            with pytest.raises(EmbeddingError) as caught:
                await embedder.embed(["deploy the billing service"])
    message = str(caught.value)
    assert "4 vectors of dimension 8" in message
    assert "one per token" in message
    assert "--pooling mean" in message


async def test_a_refusal_without_pooling_says_how_to_start_the_server(
    server: ProviderServer,
) -> None:
    """llama-server started with --pooling none refuses /v1/embeddings (its words, recorded
    from a real one); the EmbeddingError adds how to start it with pooling."""
    server.script(Fail(400, "Pooling type 'none' is not OAI compatible. Please use a "
                            "different pooling type"))
    async with OpenAIEmbedder("e", base_url=server.openai_url, dim=8, max_retries=0) as embedder:
        with pytest.raises(EmbeddingError, match=r"not OAI compatible.*--pooling mean"):
            await embedder.embed(["a"])


async def test_usage_counts_a_reply_that_reports_only_total_tokens(server: ProviderServer) -> None:
    """A server that reports `total_tokens` alone (no `prompt_tokens`) still has its tokens
    counted in `total_usage`, as the transport counts them."""
    reply = {"data": [{"index": 0, "embedding": [0.5] * 8}], "usage": {"total_tokens": 7}}
    server.script(Raw(json.dumps(reply).encode()))
    async with OpenAIEmbedder("e", base_url=server.openai_url, dim=8) as embedder:
        await embedder.embed(["a"])
        assert embedder.total_usage.input_tokens == 7
        assert embedder.total_usage.output_tokens == 0
