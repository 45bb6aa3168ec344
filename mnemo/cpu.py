"""Python work that runs off the event loop, one piece at a time per loop (`off_loop`'s one
slot), in short C calls (the loop waits for a whole one): BENCHMARKS.md has the figures."""

from __future__ import annotations

import gc
import importlib
import json
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TypeVar

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar

T = TypeVar("T")

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
