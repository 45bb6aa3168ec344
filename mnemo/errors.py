"""Every exception mnemo raises on purpose.

```
MnemoError
├── InvalidInputError (ValueError)     bad arguments, raised before anything is stored
├── NotFoundError (LookupError)        unknown session or repo: .resource, .id
├── ConflictError                      same id, different payload
├── SessionError                       a call the session's state refuses: .reason, .state
├── PipelineError                      close_and_commit / ingest gave up: .reason
├── StorageError                       the store failed or stayed locked: .reason
└── AdapterError                       a model or embedding provider failed
    ├── LLMError
    │   ├── LLMReplyError                an answer that stayed unusable
    │   ├── LLMContextError              a prompt longer than the model's context
    │   └── LLMTimeout (TimeoutError)
    └── EmbeddingError
```

Foreign errors become the `__cause__` of an `LLMError`, `EmbeddingError` or `StorageError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum


class MnemoError(Exception):
    """Root of every error mnemo raises on purpose."""


class InvalidInputError(MnemoError, ValueError):
    """An argument is malformed; nothing was stored."""


class NotFoundError(MnemoError, LookupError):
    """An unknown session or repo."""

    def __init__(self, resource: str, id: str) -> None:
        super().__init__(f"unknown {resource}: {id!r}")
        self.resource = resource
        self.id = id


class ConflictError(MnemoError):
    """An id is already taken by a different payload."""


class SessionError(MnemoError):
    """A session call that its state refuses, or an async operation that did not run; `state` is
    the session's `mnemo.State`."""

    def __init__(self, reason: str, *, state: StrEnum | None,
                 session_id: str | None = None) -> None:
        where = f"{session_id}: " if session_id else ""
        super().__init__(f"{where}{reason} (state {state})")
        self.reason = reason
        self.state = state
        self.session_id = session_id


class PipelineError(MnemoError):
    """A pipeline gave up: `reason` is "extraction_failed" or "extraction_timeout"."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class StorageError(MnemoError):
    """The store failed: `reason` is "busy", "unavailable", "corrupt", "extension_missing",
    "closed" or "read_only"; nothing of the failed write was stored."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class AdapterError(MnemoError):
    """A model or embedding provider failed."""


class LLMError(AdapterError):
    """The LLM failed, timed out, or kept answering something unusable."""


class LLMReplyError(LLMError):
    """The LLM answered, but after the task's re-asks its reply still could not be read."""


class LLMContextError(LLMError):
    """The request is longer than the model's context (refused, or cut short with room left
    under its max_tokens); a shorter prompt may go through."""


class LLMTimeout(LLMError, TimeoutError):
    """The LLM did not answer in time."""


class EmbeddingError(AdapterError):
    """The embedder failed or produced vectors of the wrong shape."""


@contextmanager
def first_error() -> Iterator[None]:
    """Re-raises the first error of a task group's `ExceptionGroup` as itself."""
    try:
        yield
    except BaseExceptionGroup as group:
        for leaf in _leaves(group):
            if isinstance(leaf, Exception):
                raise leaf from leaf.__cause__
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc
