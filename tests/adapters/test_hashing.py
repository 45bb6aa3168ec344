from __future__ import annotations

import gc
import random
import string
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

from mnemo.adapters.hashing import HashEmbedder
from mnemo.adapters.uri import embedder_from_uri
from mnemo.errors import InvalidInputError
from mnemo.ports import Embedder

ROOT = Path(__file__).resolve().parents[2]


def cosine(embedder: HashEmbedder, a: str, b: str) -> float:
    va, vb = embedder.embed_sync([a, b])
    return float(va @ vb)


def test_hash_embedder_is_an_embedder() -> None:
    """HashEmbedder satisfies the Embedder protocol and names its scheme and features'
    version (hash2: the words and stems of `mnemo.text`)."""
    embedder = HashEmbedder()
    assert isinstance(embedder, Embedder)
    assert embedder.dim == 512
    assert embedder.name == "hash2"


async def test_shape_dtype_and_norm() -> None:
    """embed returns a float32 (n, dim) array of unit rows."""
    vectors = await HashEmbedder(dim=64).embed(["nginx reverse proxy", "database backups"])
    assert isinstance(vectors, np.ndarray)
    assert vectors.shape == (2, 64)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


async def test_no_texts_gives_empty_matrix() -> None:
    """An empty batch is a (0, dim) array."""
    assert (await HashEmbedder(dim=8).embed([])).shape == (0, 8)


async def test_large_batches_match_small_ones() -> None:
    """A batch embedded in a worker thread equals the same texts embedded inline."""
    embedder = HashEmbedder()
    texts = [f"step {i}: restart the worker number {i % 7}" for i in range(600)]
    big = await embedder.embed(texts)
    small = await embedder.embed(texts[:3])
    np.testing.assert_array_equal(big[:3], small)


async def test_a_long_text_is_embedded_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of many characters (a query at the size limit) is embedded in a worker
    thread, a short one inline: its features cost about 0.3 us a character of the loop."""
    embedder = HashEmbedder(dim=64)
    threads: list[threading.Thread] = []
    inline = embedder.embed_sync

    def recorded(texts: list[str]) -> np.ndarray:
        threads.append(threading.current_thread())
        return inline(texts)

    monkeypatch.setattr(embedder, "embed_sync", recorded)
    long = " ".join(f"word{i}" for i in range(4000))
    assert (await embedder.embed([long])).shape == (1, 64)
    await embedder.embed(["a short query"])
    assert threads[0] is not threading.current_thread()
    assert threads[1] is threading.current_thread()


def test_empty_text_is_zero_vector() -> None:
    """A text without words embeds to zeros; one of only stopwords still gets a vector."""
    empty, punctuation, stop = HashEmbedder().embed_sync(["", "?!  ...", "it is what it is"])
    assert not empty.any()
    assert not punctuation.any()
    assert np.linalg.norm(stop) == pytest.approx(1.0, rel=1e-5)


def test_a_large_vocabulary_leaves_nothing_for_the_garbage_collector_to_walk() -> None:
    """The features of 30,000 distinct words, kept for the next texts, are in no container
    the garbage collector tracks: a full collection (on whatever thread allocates, holding
    the GIL) does not walk them, and the event loop does not wait for it to."""
    draw = random.Random(7)
    words = [
        "".join(draw.choices(string.ascii_lowercase, k=9)) for _ in range(30_000)]
    embedder = HashEmbedder()
    embedder.embed_sync([" ".join(words)])
    walked = [o for o in gc.get_objects()
              if o is not words and isinstance(o, dict | list | set) and len(o) >= len(words)]
    assert walked == []


def test_deterministic_across_instances() -> None:
    """Two instances give identical vectors."""
    texts = ["The build failed with exit code 137", "Paris is the capital of France"]
    np.testing.assert_array_equal(
        HashEmbedder().embed_sync(texts), HashEmbedder().embed_sync(texts)
    )


@pytest.mark.slow
def test_deterministic_across_processes() -> None:
    """The hash is stable across interpreters (no salted built-in hash)."""
    code = (
        "from mnemo.adapters.hashing import HashEmbedder;"
        "print(HashEmbedder(dim=16).embed_sync(['nginx reverse proxy on port 8080']).tolist())"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(runs) == 1


@pytest.mark.parametrize(
    ("anchor", "paraphrase", "unrelated"),
    [
        (
            "How do I configure nginx as a reverse proxy?",
            "Setting up an nginx reverse proxy configuration",
            "My cat likes to sleep on the warm windowsill.",
        ),
        (
            "I adopted a puppy from the shelter last week.",
            "Last week I adopted a shelter puppy.",
            "The quarterly tax report is due on Friday.",
        ),
        (
            "The database backup failed with a timeout error",
            "backups of the database are timing out",
            "She painted a landscape in watercolours.",
        ),
    ],
)
def test_paraphrase_scores_above_unrelated(anchor: str, paraphrase: str, unrelated: str) -> None:
    """Texts sharing words score well above unrelated ones."""
    embedder = HashEmbedder()
    assert cosine(embedder, anchor, paraphrase) > cosine(embedder, anchor, unrelated) + 0.3


@pytest.mark.parametrize("dim", [0, 16_001, 10**9])
def test_rejects_bad_dimension(dim: int) -> None:
    """A dimension below 1 or above what pgvector holds is refused before any vector is
    made: a billion would ask for gigabytes at the first embed."""
    with pytest.raises(InvalidInputError, match="dim"):
        HashEmbedder(dim=dim)
    with pytest.raises(InvalidInputError, match="dim"):
        embedder_from_uri(f"hash:{dim}")


@given(st.lists(st.text(max_size=200), max_size=5))
def test_any_text_embeds_to_finite_unit_or_zero_vector(texts: list[str]) -> None:
    """Whatever the text, its vector is finite and has norm 1 or 0."""
    vectors = HashEmbedder(dim=32).embed_sync(texts)
    assert vectors.shape == (len(texts), 32)
    assert np.isfinite(vectors).all()
    for norm in np.linalg.norm(vectors, axis=1):
        assert norm == pytest.approx(1.0, rel=1e-5) or norm == 0.0
