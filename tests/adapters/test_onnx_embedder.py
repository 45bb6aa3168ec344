from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from mnemo.adapters import minilm
from mnemo.adapters.hashing import HashEmbedder
from mnemo.adapters.minilm import MiniLMEmbedder, default_embedder
from mnemo.errors import EmbeddingError
from mnemo.ports import Embedder

ROOT = Path(__file__).resolve().parents[2]

MODEL_MISSING = next(
    (
        f"{name} is not installed"
        for name in ("onnxruntime", "tokenizers", minilm.MODEL_PACKAGE)
        if importlib.util.find_spec(name) is None
    ),
    None,
)
needs_model = pytest.mark.skipif(MODEL_MISSING is not None, reason=MODEL_MISSING or "")

# (anchor, paraphrase, unrelated): the paraphrase shares few words with the anchor, so only a
# model of meaning (not word overlap) ranks it first.
TRIPLES = [
    (
        "How do I restart the nginx server?",
        "What's the command to reload nginx?",
        "My grandmother grows tomatoes in her garden.",
    ),
    (
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The new movie is awesome.",
    ),
    (
        "The deployment failed because the disk was full.",
        "We couldn't ship the release: no storage space left on the drive.",
        "She adopted a puppy from the shelter last week.",
    ),
    (
        "I went hiking in the mountains with my kids last weekend.",
        "Last Saturday my children and I took a trek up the hills.",
        "Quarterly revenue grew by twelve percent.",
    ),
]


@pytest.fixture(scope="module")
def model() -> MiniLMEmbedder:
    """One loaded embedder for the module (loading takes ~0.3 s)."""
    embedder = MiniLMEmbedder()
    embedder.load_sync()
    return embedder


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Makes every outgoing connection and name lookup fail, and records the attempts."""
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args[1:] if args and isinstance(args[0], socket.socket) else args)
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts


@pytest.mark.slow
def test_import_loads_nothing() -> None:
    """Importing the module imports neither onnxruntime nor tokenizers."""
    code = (
        "import sys, mnemo.adapters.minilm as m; m.MiniLMEmbedder(); "
        "assert 'onnxruntime' not in sys.modules and 'tokenizers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_constructor_validates() -> None:
    """threads and batch_size must be positive integers; the embedder names itself."""
    embedder = MiniLMEmbedder()
    assert isinstance(embedder, Embedder)
    assert (embedder.dim, embedder.name, embedder.loaded) == (384, "minilm", False)
    with pytest.raises(ValueError, match="threads"):
        MiniLMEmbedder(threads=0)
    with pytest.raises(ValueError, match="batch_size"):
        MiniLMEmbedder(batch_size=True)


def test_vendored_tokenizer_is_pinned() -> None:
    """The vendored tokenizer.json has the pinned digest and its NOTICE names its origin."""
    minilm.verify_sha256(minilm.TOKENIZER_PATH, minilm.TOKENIZER_SHA256)
    notice = (minilm.TOKENIZER_PATH.parent / "NOTICE").read_text()
    assert "sentence-transformers/all-MiniLM-L6-v2" in notice
    assert "Apache License 2.0" in notice
    assert (minilm.TOKENIZER_PATH.parent / "LICENSE").is_file()


@pytest.mark.slow
@needs_model
async def test_shape_dtype_and_norm(model: MiniLMEmbedder) -> None:
    """embed returns a float32 (n, 384) array of unit rows, empty texts included."""
    vectors = await model.embed(["nginx reverse proxy", "database backups", ""])
    assert isinstance(vectors, np.ndarray)
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


@needs_model
async def test_no_texts_gives_empty_matrix() -> None:
    """An empty batch is a (0, 384) array and does not load the model."""
    embedder = MiniLMEmbedder()
    assert (await embedder.embed([])).shape == (0, 384)
    assert not embedder.loaded


@needs_model
async def test_paraphrases_beat_unrelated(model: MiniLMEmbedder) -> None:
    """A paraphrase scores far above an unrelated sentence (0.54-0.79 vs below 0.03 here)."""
    vectors = await model.embed([text for triple in TRIPLES for text in triple])
    for anchor, paraphrase, unrelated in vectors.reshape(len(TRIPLES), 3, -1):
        # HashEmbedder gets 0.01-0.56 for these paraphrases: word overlap alone fails this.
        assert float(anchor @ paraphrase) > 0.4
        assert float(anchor @ unrelated) < 0.15


@needs_model
async def test_deterministic_and_batch_independent(model: MiniLMEmbedder) -> None:
    """A text gets the same vector on every call, alone or in batches of any size."""
    texts = [text for triple in TRIPLES for text in triple] * 3  # 36 texts: 3 chunks of 16
    batch = await model.embed(texts)
    np.testing.assert_array_equal(batch, await model.embed(texts))
    for i in (0, 5, 17, 35):
        np.testing.assert_allclose((await model.embed([texts[i]]))[0], batch[i], atol=1e-5)
    np.testing.assert_allclose(model.embed_sync(texts[:20]), batch[:20], atol=1e-5)


@needs_model
async def test_a_long_text_is_not_padded_into_the_short_ones_chunk(
    model: MiniLMEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long query among fifteen short tags runs in a chunk of its own (each chunk is padded
    to its longest text), and every vector comes back at its text's place. Before, the sixteen
    ran as one chunk of sixteen rows of 256 tokens, and other embeddings waited for it."""
    long_text = "deploy nginx gunicorn postgres pgbouncer certificate backup " * 30
    texts = [f"tag {i}" for i in range(7)] + [long_text] + [f"tag {i}" for i in range(7, 15)]
    chunks: list[list[str]] = []
    infer = model._infer

    def recorded(chunk: list[str]) -> Any:
        chunks.append(chunk)
        return infer(chunk)

    monkeypatch.setattr(model, "_infer", recorded)
    vectors = await model.embed(texts)
    assert sorted(len(c) for c in chunks) == [1, 15]
    assert [long_text] in chunks
    for i in (0, 7, 15):
        np.testing.assert_allclose((await model.embed([texts[i]]))[0], vectors[i], atol=1e-5)


@needs_model
async def test_long_texts_are_truncated_at_256_tokens(model: MiniLMEmbedder) -> None:
    """Words past token 256 do not change a vector; words at token ~200 still do."""
    sentence = "the quick brown fox jumps over the lazy dog "  # 9 tokens
    short, long = sentence * 22, sentence * 40  # 198 and 360 tokens
    vectors = await model.embed(
        [short + "apples", short + "volcanoes erupting", long + "apples", long + "volcanoes"]
    )
    assert not np.allclose(vectors[0], vectors[1], atol=1e-4)
    np.testing.assert_array_equal(vectors[2], vectors[3])


@needs_model
async def test_concurrent_first_calls_load_once() -> None:
    """Concurrent first calls share one load and get the vectors a lone call gets."""
    embedder = MiniLMEmbedder()
    results: dict[int, np.ndarray[Any, Any]] = {}

    async def run(i: int) -> None:
        results[i] = await embedder.embed([TRIPLES[i][0]])

    async with anyio.create_task_group() as tg:
        for i in range(len(TRIPLES)):
            tg.start_soon(run, i)
    together = await embedder.embed([triple[0] for triple in TRIPLES])
    for i in range(len(TRIPLES)):
        np.testing.assert_allclose(results[i][0], together[i], atol=1e-5)


@needs_model
async def test_loads_and_embeds_offline(offline: list[Any]) -> None:
    """Loading and embedding make no network attempt (every connection would fail)."""
    embedder = MiniLMEmbedder()
    await embedder.load()
    vectors = await embedder.embed(["offline please"])
    assert vectors.shape == (1, 384)
    assert offline == []


async def test_tampered_model_is_refused(tmp_path: Path) -> None:
    """A model whose sha256 differs raises EmbeddingError naming the file and both digests."""
    try:
        original = minilm.bundled_model_path()
    except EmbeddingError:
        original = tmp_path / "original.onnx"
        original.write_bytes(b"\x08\x07not really a model")
    tampered = tmp_path / "model.onnx"
    shutil.copyfile(original, tampered)
    with tampered.open("r+b") as file:
        file.seek(-1, 2)
        last = file.read(1)
        file.seek(-1, 2)
        file.write(bytes([last[0] ^ 0xFF]))
    embedder = MiniLMEmbedder(model_path=tampered)
    with pytest.raises(EmbeddingError) as caught:
        await embedder.embed(["hello"])
    message = str(caught.value)
    assert str(tampered) in message
    assert minilm.MODEL_SHA256 in message
    assert hashlib.sha256(tampered.read_bytes()).hexdigest() in message
    assert not embedder.loaded


def test_missing_model_package_falls_back_to_hashing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """default_embedder returns HashEmbedder, warning once, when the weights are missing."""
    monkeypatch.setattr(minilm, "MODEL_PACKAGE", "mnemo_no_such_model_package")
    monkeypatch.setattr(minilm, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="mnemo"):
        first, second = default_embedder(), default_embedder()
    assert isinstance(first, HashEmbedder)
    assert isinstance(second, HashEmbedder)
    warnings = [r for r in caplog.records if "mnemo_no_such_model_package" in r.getMessage()]
    assert len(warnings) == 1


def test_missing_runtime_falls_back_to_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """default_embedder returns HashEmbedder when onnxruntime cannot be imported."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    monkeypatch.setattr(minilm, "_warned", False)
    assert isinstance(default_embedder(), HashEmbedder)


def test_missing_tokenizers_falls_back_to_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """default_embedder returns HashEmbedder when tokenizers is not installed."""
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    monkeypatch.setattr(minilm, "_warned", False)
    assert isinstance(default_embedder(), HashEmbedder)


@needs_model
def test_choosing_the_default_imports_no_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """default_embedder imports neither onnxruntime nor tokenizers (a Memory that only reads
    never pays for them); the first embed does."""
    imported: list[str] = []
    real = importlib.import_module

    def watched(name: str, package: str | None = None) -> Any:
        imported.append(name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", watched)
    monkeypatch.setattr(minilm, "_SHARED", {})  # no model loaded by an earlier test
    embedder = default_embedder()
    assert isinstance(embedder, MiniLMEmbedder)
    assert imported == []
    anyio.run(embedder.embed, ["nginx"])
    assert {"onnxruntime", "tokenizers"} <= set(imported)


@needs_model
def test_default_is_minilm_when_installed() -> None:
    """With everything installed and intact, default_embedder is the MiniLM embedder."""
    embedder = default_embedder()
    assert isinstance(embedder, MiniLMEmbedder)
    assert not embedder.loaded
