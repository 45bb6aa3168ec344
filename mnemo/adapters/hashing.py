"""`HashEmbedder`: a dependency-free embedder built from hashed word and character n-grams.

Content words, their bigrams and character trigrams are hashed (BLAKE2b, stable across
processes) into `dim` signed buckets, weighted by kind and by 1 + log tf, and L2-normalised. A
text of only stopwords falls back to them; one without words embeds to zeros."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from mnemo import cpu, text as _text
from mnemo.errors import check_count
from mnemo.ports import MAX_DIM

_UNIGRAM, _BIGRAM, _TRIGRAM = 0, 1, 2
_TYPE_WEIGHTS = np.array([1.0, 0.6, 0.3], dtype=np.float64)
# A feature key packs the 32-bit hash with the feature type above it.
_TYPE_SHIFT = 32
_HASH_MASK = (1 << 32) - 1
_ROW_SHIFT = 34
_MASK64 = np.uint64(_HASH_MASK)
_GOLDEN, _M1, _M2 = np.uint64(0x9E3779B1), np.uint64(0x85EBCA6B), np.uint64(0xC2B2AE35)
_S13, _S16 = np.uint64(13), np.uint64(16)
# A text costs at least what this many characters do.
_TEXT_CHARS = 16
# Texts are embedded in slices of about this many characters, so no numpy call holds the GIL long.
_SLICE_CHARS = 64_000


def _hash(feature: str) -> int:
    return int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=4).digest(), "little")


def _mix(first: npt.NDArray[np.int64], second: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Stable 32-bit hashes of ordered pairs of hashes (bigrams), with MurmurHash3's finaliser."""
    # In uint64 a product of two 32-bit values never overflows; its low 32 bits are kept.
    h = (first.astype(np.uint64) * _GOLDEN + second.astype(np.uint64)) & _MASK64
    h ^= h >> _S16
    h = (h * _M1) & _MASK64
    h ^= h >> _S13
    h = (h * _M2) & _MASK64
    return (h ^ (h >> _S16)).astype(np.int64)


class HashEmbedder:
    """An `Embedder` of hashed n-gram features: deterministic, offline, fast."""

    def __init__(self, dim: int = 512) -> None:
        self.dim = dim = check_count("dim", dim, minimum=1, maximum=MAX_DIM)
        # The URI `mnemo.embedder_from_uri` builds this from again; "hash" names retired features.
        self.name = "hash2" if dim == 512 else f"hash2:{dim}"
        # token -> its features as uint32s (is_stopword, unigram hash, trigram hashes), cleared
        # when full; bytes, which the garbage collector never walks.
        self._tokens: dict[str, bytes] = {}

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """One unit (or zero) float32 row per text; a long batch in a worker thread."""
        chars = sum(map(len, texts)) + _TEXT_CHARS * len(texts)
        return await cpu.run(lambda: self.embed_sync(texts), chars)

    def embed_sync(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        slices: list[npt.NDArray[np.float32]] = []
        start = chars = 0
        for end, text in enumerate(texts, 1):
            chars += len(text)
            if chars >= _SLICE_CHARS or end == len(texts):
                slices.append(self._embed_slice(texts[start:end]))
                start, chars = end, 0
        return np.concatenate(slices) if slices else np.zeros((0, self.dim), np.float32)

    def _embed_slice(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        unigrams, trigrams = bytearray(), bytearray()
        unigram_counts: list[int] = []
        trigram_counts: list[int] = []
        cache = self._tokens
        for text in texts:
            entries = [cache.get(token) or self._token(token) for token in _text.tokens(text)]
            content = [entry for entry in entries if not entry[0]] or entries
            before = len(trigrams)
            for entry in content:
                unigrams += entry[4:8]
                trigrams += entry[8:]
            unigram_counts.append(len(content))
            trigram_counts.append((len(trigrams) - before) // 4)
        out = np.zeros((len(texts), self.dim), dtype=np.float64)
        if not unigrams:
            return out.astype(np.float32)
        rows = np.arange(len(texts), dtype=np.int64)
        uni = np.frombuffer(unigrams, dtype="<u4").astype(np.int64)
        uni_rows = np.repeat(rows, unigram_counts)
        # Bigrams pair each unigram with the next one of the same text.
        same_text = uni_rows[1:] == uni_rows[:-1]
        bigrams = _mix(uni[:-1][same_text], uni[1:][same_text])
        keys = np.concatenate(
            [
                (uni_rows << _ROW_SHIFT) | (_UNIGRAM << _TYPE_SHIFT) | uni,
                (uni_rows[1:][same_text] << _ROW_SHIFT) | (_BIGRAM << _TYPE_SHIFT) | bigrams,
                (np.repeat(rows, trigram_counts) << _ROW_SHIFT)
                | (_TRIGRAM << _TYPE_SHIFT)
                | np.frombuffer(trigrams, dtype="<u4").astype(np.int64),
            ]
        )
        unique, counts = np.unique(keys, return_counts=True)
        kinds = (unique >> _TYPE_SHIFT) & 0b11
        hashes = unique & _HASH_MASK
        signs = np.where((hashes >> 31) & 1, -1.0, 1.0)
        values = signs * _TYPE_WEIGHTS[kinds] * (1.0 + np.log(counts))
        np.add.at(out, (unique >> _ROW_SHIFT, hashes % self.dim), values)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return out.astype(np.float32)

    def _token(self, token: str) -> bytes:
        if len(self._tokens) >= 200_000:
            self._tokens.clear()
        marked = f"<{token}>"
        entry = self._tokens[token] = np.array(
            [_text.is_stopword(token), _hash("w:" + _text.stem(token)),
             *(_hash("c:" + marked[i : i + 3]) for i in range(len(marked) - 2))],
            dtype="<u4").tobytes()
        return entry
