"""`Worker`: one thread running jobs in arrival order for callers on the event loop (a hop
cheaper than `anyio.to_thread.run_sync`), and reads begun now, awaited later (`PendingRead`)."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import anyio

T = TypeVar("T")

log = logging.getLogger("mnemo")


class Worker:
    """A daemon thread that runs one job at a time, in arrival order, until `stop`."""

    def __init__(self, name: str) -> None:
        # `(fn, future, loop)`; a posted job is `(fn, None, None)`.
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fn, future, loop = job
            if future is None:
                try:
                    fn()
                except Exception:
                    log.exception("a posted job failed")
                continue
            try:
                result = fn()
            except BaseException as exc:
                _reply(loop, future, None, exc)
            else:
                _reply(loop, future, result, None)

    async def call(self, fn: Callable[[], T]) -> T:
        """Runs `fn()` in the thread; a cancelled caller still waits for the job to end."""
        future = self.start(fn)
        with anyio.CancelScope(shield=True):
            result = await future
        return result

    def start(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Queues `fn()` and returns its future, settled on the running loop when it ends."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self.jobs.put((fn, future, loop))
        return future

    def post(self, fn: Callable[[], object]) -> None:
        """Queues `fn()` in order and returns at once (`fn` reports its own failures; one that
        escapes is logged)."""
        self.jobs.put((fn, None, None))

    def stop(self) -> None:
        """Ends the thread once the jobs given before are done."""
        self.jobs.put(None)

    async def stopped(self) -> None:
        """`stop`, and waits (at most 10 s) until the thread has ended."""
        self.stop()
        await anyio.to_thread.run_sync(self._thread.join, 10.0)


def _reply(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any,
    exc: BaseException | None,
) -> None:
    """Settles `future` on its loop, unless that loop has closed."""
    try:
        loop.call_soon_threadsafe(_settle, future, result, exc)
    except RuntimeError:
        if not loop.is_closed():
            raise


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.cancelled():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


class Queued(Generic[T]):
    """A job queued on a worker thread; `error` maps what it raised to what `result` raises."""

    def __init__(
        self, future: asyncio.Future[T],
        error: Callable[[BaseException], BaseException] = lambda exc: exc,
    ) -> None:
        self._future = future
        self._error = error

    async def result(self) -> T:
        """What the job returned (a cancelled caller leaves it running, its answer dropped)."""
        try:
            return await self._future
        except Exception as exc:  # a cancellation (BaseException) goes through
            translated = self._error(exc)
            if translated is exc:
                raise
            raise translated from exc

    def discard(self) -> None:
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
