"""The ports mnemo talks through (`LLM`, `Embedder` with its checked calls, `Reranker`), their
values (an embedder's float32 vectors: compared by cosine, stored as bytes), and the `on_event`
callback (`Event`, `Events`): what an adapter or a fake needs."""

from __future__ import annotations

import inspect
import logging
import math
import operator
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TypeAlias, TypeVar, runtime_checkable

import anyio
import numpy as np
import numpy.typing as npt

from mnemo.errors import EmbeddingError, EmbeddingTimeout, InvalidInputError

log = logging.getLogger("mnemo")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens spent by one call (or summed over many), and its cost when priced. `calls`
    counts the model calls, of which `retries` were transport retries and `re_asks` re-asked
    after an unusable reply; `saved_*` is what a retried extraction did not spend again
    (`mnemo.extraction.memo`). Equality compares tokens and cost only.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None
    calls: int = field(default=0, compare=False)
    retries: int = field(default=0, compare=False)
    re_asks: int = field(default=0, compare=False)
    saved_calls: int = field(default=0, compare=False)
    saved_input_tokens: int = field(default=0, compare=False)
    saved_output_tokens: int = field(default=0, compare=False)

    def __add__(self, other: Usage) -> Usage:
        counts = {f.name: getattr(self, f.name) + getattr(other, f.name)
                  for f in fields(self) if f.name != "cost"}
        cost = None if self.cost is None and other.cost is None else (
            (self.cost or 0.0) + (other.cost or 0.0))
        return Usage(cost=cost, **counts)


def add_usage(total: Usage | None, more: Usage | None) -> Usage | None:
    """`total + more`, None meaning "not reported"."""
    if total is None:
        return more
    return total if more is None else total + more


# A JSON value and a JSON object, for annotations only (msgspec reads `object` for these).
JSONValue: TypeAlias = (
    "str | int | float | bool | Sequence[JSONValue] | Mapping[str, JSONValue] | None")
JSONObject: TypeAlias = "dict[str, JSONValue]"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call in an LLM reply."""

    name: str
    arguments: JSONObject
    id: str | None = None


# `LLMRequest.tool_choice` asking for a call of any of the request's tools.
REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class LLMRequest:
    """One task for the LLM. When `schema` is set, the reply's `data` is the JSON value the
    model answered, asked to match it (the task reads what it needs). `tool_choice`: None
    leaves it to the model, `REQUIRED` asks for a call of any of `tools`, a tool's name for
    that one; each adapter sends it in its provider's form.
    """

    task: str
    system: str
    messages: Sequence[Mapping[str, object]]
    schema: JSONObject | None = None
    tools: Sequence[Mapping[str, object]] | None = None
    max_tokens: int | None = None
    tool_choice: str | None = None


@dataclass(frozen=True, slots=True)
class LLMResponse:
    """An LLM reply: free `text`, structured `data` (a JSON value), and tool calls."""

    text: str = ""
    data: object = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage | None = None


@runtime_checkable
class LLM(Protocol):
    async def generate(self, request: LLMRequest) -> LLMResponse: ...


@runtime_checkable
class Reranker(Protocol):
    """Orders a recall's best candidates for its query: the indexes of `texts`, best first.
    Indexes out of range or repeated are ignored; those left out follow in their order."""

    async def rerank(self, query: str, texts: Sequence[str]) -> Sequence[int]: ...


# What an embedder returns: one vector per text, as nested sequences or a 2-D numpy array.
Vectors = Sequence[Sequence[float]] | npt.NDArray[np.floating[Any]]


@runtime_checkable
class Embedder(Protocol):
    dim: int

    async def embed(self, texts: Sequence[str]) -> Vectors: ...


# The most dimensions an embedder's vectors may have (pgvector's `vector` holds 16,000).
MAX_DIM = 16_000


async def detect_dim(embedder: Embedder) -> int:
    """The embedder's dimension, letting one that learns it from its first reply ask first
    (reading `dim` raises while it is unknown). EmbeddingError: the request failed;
    InvalidInputError: no `dim`, or not a whole number from 1 to `MAX_DIM`."""
    if (detect := getattr(embedder, "detect_dim", None)) is not None:
        await detect()
    try:
        dim = embedder.dim
    except AttributeError as exc:
        raise InvalidInputError(
            f"embedder {model_name(embedder)} has no dim (its vectors' dimension)") from exc
    try:
        whole = None if isinstance(dim, bool) else operator.index(dim)  # numpy's ints too
    except TypeError:
        whole = None
    if whole is None or not 1 <= whole <= MAX_DIM:
        raise InvalidInputError(
            f"embedder {model_name(embedder)} has dim {dim!r}: a whole number from 1 to "
            f"{MAX_DIM:,} is needed")
    return whole


async def embed(embedder: Embedder, texts: Sequence[str]) -> npt.NDArray[np.float32]:
    """The embedder's vectors as a float32 matrix, checked for shape: EmbeddingError when it
    failed (another exception as the `__cause__`) or returned the wrong count or dimension."""
    if not texts:
        return np.zeros((0, embedder.dim), dtype=np.float32)
    try:
        raw = await embedder.embed(list(texts))
    except EmbeddingError:
        raise  # says what failed already
    except Exception as exc:
        kind = EmbeddingTimeout if isinstance(exc, TimeoutError) else EmbeddingError
        raise kind(f"the embedder failed: {exc!r}") from exc
    try:
        matrix = np.asarray(raw, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise EmbeddingError(f"the embedder returned something that is not vectors: {exc}") from exc
    if matrix.ndim != 2 or matrix.shape[0] != len(texts):
        raise EmbeddingError(f"the embedder returned {matrix.shape} for {len(texts)} texts")
    if matrix.shape[1] != embedder.dim:
        raise EmbeddingError(
            f"the embedder returned vectors of dimension {matrix.shape[1]}, "
            f"but it declares dimension {embedder.dim}")
    if not np.all(np.isfinite(matrix)):
        raise EmbeddingError("the embedder returned a vector with NaN or infinite values")
    return matrix


def vector_to_blob(vector: npt.NDArray[np.float32]) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


def vector_from_blob(blob: bytes) -> npt.NDArray[np.float32]:
    return np.frombuffer(blob, dtype=np.float32)


# A float32 cosine may land a few units in its seventh digit below an exact threshold.
COSINE_TOLERANCE = 1e-5


def reaches(similarity: float, threshold: float) -> bool:
    """Whether a cosine computed from float32 vectors is at or above `threshold`."""
    return similarity >= threshold - COSINE_TOLERANCE


def cosine(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    """Raw cosine similarity of two vectors (0 when either is zero)."""
    # Three dot products: cheaper than np.linalg.norm on small vectors.
    aa, bb = float(np.dot(a, a)), float(np.dot(b, b))
    if aa == 0.0 or bb == 0.0:
        return 0.0
    return float(np.dot(a, b)) / math.sqrt(aa * bb)


def check_dim(repo: str, embedder: Embedder, dim: int) -> None:
    """Raises EmbeddingError when the embedder's vectors would not fit the repo's `dim`."""
    if dim and embedder.dim != dim:
        raise EmbeddingError(
            f"repo {repo!r} holds vectors of dimension {dim}, but the embedder "
            f"{getattr(embedder, 'name', type(embedder).__name__)} makes "
            f"dimension {embedder.dim}; open the repo with an embedder of its dimension")


def model_name(model: object) -> str:
    """What identifies a model: its `name` when it has one (its URI, e.g.
    "openai:gpt-4o-mini"), else its class's qualified name. Work is resumed only by a
    Memory whose model has the same."""
    name = getattr(model, "name", None)
    if isinstance(name, str) and name:
        return name
    kind = type(model)
    return f"{kind.__module__}.{kind.__qualname__}"


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened: `kind` is e.g. "transition", "step_appended",
    "trajectory_committed", "changeset_applied", "recall_executed", "session_expired"."""

    kind: str
    session_id: str | None
    repo: str | None
    data: JSONObject = field(default_factory=dict)


EventCallback = Callable[[Event], Awaitable[None] | None]


class Events:
    """Delivers events to the user's callback, in order, in the task that caused them; one
    that raises is logged, never propagated, and once called it runs to its end."""

    def __init__(self, callback: EventCallback | None) -> None:
        self._callback = callback

    async def emit(self, kind: str, *, session_id: str | None = None, repo: str | None = None,
                   **data: JSONValue) -> None:
        if self._callback is None:
            return
        await deliver(self._callback, Event(kind, session_id, repo, data), f"on_event ({kind})")

    async def applied(self, repo: str, node_ids: Sequence[str], changeset_id: str, *,
                      session_id: str | None = None, **data: JSONValue) -> None:
        """Reports a changeset that added to the graph: a session's, an ingest's, a
        `remember`'s or a `correct`'s ("changeset_applied")."""
        await self.emit("changeset_applied", session_id=session_id, repo=repo,
                        node_ids=list(node_ids), changeset_id=changeset_id, **data)


async def deliver(callback: Callable[[T], Awaitable[None] | None], value: T, what: str) -> None:
    """Calls the user's sync or async `callback` with `value`, shielded; an exception it
    raises is logged (naming `what`), never propagated."""
    with anyio.CancelScope(shield=True):
        try:
            result = callback(value)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("%s callback failed", what)
