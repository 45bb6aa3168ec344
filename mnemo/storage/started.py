"""Reads begun now and finished later (`mnemo.graph.ports.PendingRead`): a job queued on a worker
thread runs while its caller goes on (recall embeds its query meanwhile), and the caller
awaits its answer only where it needs it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Queued(Generic[T]):
    """A job queued on a worker thread (its future, settled by the thread); `error` turns
    what the job raised into what `result` raises (by default, itself)."""

    def __init__(
        self, future: asyncio.Future[T],
        error: Callable[[BaseException], BaseException] = lambda exc: exc,
    ) -> None:
        self._future = future
        self._error = error

    async def result(self) -> T:
        """What the job returned (a caller cancelled meanwhile leaves the job to run on, its
        answer dropped)."""
        try:
            return await self._future
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            translated = self._error(exc)
            if translated is exc:
                raise
            raise translated from exc

    def discard(self) -> None:
        """Its result is not wanted: a failure is dropped, not reported as never retrieved."""
        if self._future.done():
            _retrieve(self._future)
        else:
            self._future.add_done_callback(_retrieve)


class DeferredRead(Generic[T]):
    """A read that runs when its result is asked for: for a store that cannot begin it early."""

    def __init__(self, read: Callable[[], Awaitable[T]]) -> None:
        self._read = read

    async def result(self) -> T:
        return await self._read()

    def discard(self) -> None:
        return None


class FallbackRead(Generic[T]):
    """`first`'s result, or, when it is None, the result of `otherwise` (run then)."""

    def __init__(
        self, first: Queued[T | None], otherwise: Callable[[], Awaitable[T]]
    ) -> None:
        self._first = first
        self._otherwise = otherwise

    async def result(self) -> T:
        found = await self._first.result()
        return await self._otherwise() if found is None else found

    def discard(self) -> None:
        self._first.discard()


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
