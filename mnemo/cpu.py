"""Work that runs off the event loop. Python work runs one piece at a time per loop
(`off_loop`'s one slot), in short C calls (the loop waits for a whole one): BENCHMARKS.md has
the figures. A store's calls run on its own `Worker` thread, in arrival order (a hop cheaper
than `anyio.to_thread.run_sync`), and a read begun now is awaited later (`Queued`)."""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import logging
import queue
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from types import ModuleType
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar

T = TypeVar("T")

log = logging.getLogger("mnemo")

_SLOT: RunVar[anyio.CapacityLimiter] = RunVar("mnemo_cpu_slot")


def slot() -> anyio.CapacityLimiter:
    """The slot of the running event loop (a limiter belongs to one loop)."""
    try:
        return _SLOT.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(1)
        _SLOT.set(limiter)
        return limiter


# Work on fewer characters than this stays on the loop (cheaper than a thread hop).
ON_LOOP_CHARS = 4_000


async def off_loop(func: Callable[[], T], *, abandon_on_cancel: bool = False) -> T:
    """`func()` in a worker thread, when the slot is free. With `abandon_on_cancel`, a
    cancelled caller returns at once and the thread finishes on its own."""
    return await anyio.to_thread.run_sync(func, limiter=slot(), abandon_on_cancel=abandon_on_cancel)


async def run(func: Callable[[], T], size: int, *, on_loop_below: int = ON_LOOP_CHARS,
              abandon_on_cancel: bool = False) -> T:
    """`func()`, whose cost grows with `size` (characters of input, or the unit of
    `on_loop_below`): on the loop below `on_loop_below`, else `off_loop`."""
    if size < on_loop_below:
        return func()
    return await off_loop(func, abandon_on_cancel=abandon_on_cancel)


# The characters one C call of `dumps` encodes at most.
_SLICE = 1 << 18
_DEPTH = 3


def dumps(value: object, *, sort_keys: bool = False) -> str:
    """`json.dumps(value, ensure_ascii=False, sort_keys=sort_keys)`, built by short C calls
    (`pieces`) and one join; raises as `json.dumps`."""
    return "".join(pieces(value, sort_keys=sort_keys))


def pieces(value: object, *, sort_keys: bool = False) -> Iterator[str]:
    """The text of `dumps(value)` in pieces, each made by a short C call (an item of a long
    value, a long string by slices): a digest reads them without one long string."""
    if not _longer(value, _SLICE):
        yield json.dumps(value, ensure_ascii=False, sort_keys=sort_keys)
    elif isinstance(value, str):
        yield '"'
        for i in range(0, len(value), _SLICE):
            yield json.dumps(value[i:i + _SLICE], ensure_ascii=False)[1:-1]
        yield '"'
    elif isinstance(value, list | tuple):
        yield "["
        for n, item in enumerate(value):
            yield ", " if n else ""
            yield from pieces(item, sort_keys=sort_keys)
        yield "]"
    elif isinstance(value, dict) and all(isinstance(k, str) for k in value):
        yield "{"
        for n, key in enumerate(sorted(value) if sort_keys else value):
            yield (", " if n else "") + json.dumps(key, ensure_ascii=False) + ": "
            yield from pieces(value[key], sort_keys=sort_keys)
        yield "}"
    else:
        yield json.dumps(value, ensure_ascii=False, sort_keys=sort_keys)


def _longer(value: object, chars: int) -> bool:
    """Whether the strings of `value` down to `_DEPTH` levels hold more than `chars`
    characters; it stops reading as soon as they do."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            chars -= len(item)
            if chars < 0:
                return True
        elif depth < _DEPTH and isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif depth < _DEPTH and isinstance(item, list | tuple):
            stack.extend((v, depth + 1) for v in item)
    return False


def import_kept(name: str) -> ModuleType:
    """Imports `name` (a module kept for the process's life), then, if the import was the
    first, freezes the collector's objects so that a full collection skips them."""
    first = name not in sys.modules
    module = importlib.import_module(name)
    if first:
        gc.freeze()
    return module


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

    def __init__(self, first: Queued[T | None], otherwise: Callable[[], Awaitable[T]]) -> None:
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
