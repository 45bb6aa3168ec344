"""Python work that runs off the event loop, one piece at a time per event loop.

Pure-Python work gains nothing from a second thread, and every thread that wants the GIL
lengthens the loop's wait for it (BENCHMARKS.md, "Figures behind the code"): such work takes
the one slot of `off_loop`, and keeps each C call short (the loop waits for all of one)."""

from __future__ import annotations

import gc
import importlib
import json
import sys
from collections.abc import Callable
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


# Work on fewer characters than this stays on the loop: below it, the work costs less than a
# thread hop and a wait for the slot (BENCHMARKS.md, "Figures behind the code").
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


# The characters one C call of `dumps` encodes at most (strings counted down to `_DEPTH`
# levels: deeper ones are those of a step's metadata, bounded by `max_text_chars`).
_SLICE = 1 << 18
_DEPTH = 3


def dumps(value: object, *, sort_keys: bool = False) -> str:
    """`json.dumps(value, ensure_ascii=False, sort_keys=sort_keys)`, the same text, built by
    short C calls: each item of a long value by a call of its own, a long string by slices.

    Raises:
        TypeError, ValueError: as `json.dumps`.
    """
    if not _longer(value, _SLICE):
        return json.dumps(value, ensure_ascii=False, sort_keys=sort_keys)
    if isinstance(value, str):
        return '"' + "".join(json.dumps(value[i:i + _SLICE], ensure_ascii=False)[1:-1]
                             for i in range(0, len(value), _SLICE)) + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(dumps(v, sort_keys=sort_keys) for v in value) + "]"
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        keys = sorted(value) if sort_keys else value
        return "{" + ", ".join(json.dumps(k, ensure_ascii=False) + ": "
                               + dumps(value[k], sort_keys=sort_keys) for k in keys) + "}"
    return json.dumps(value, ensure_ascii=False, sort_keys=sort_keys)


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
    """Imports `name`, a module that lives as long as the process, then freezes the
    collector's objects (`gc.freeze`) if the import was the first: a full collection would
    otherwise walk everything the import made, holding the GIL."""
    first = name not in sys.modules
    module = importlib.import_module(name)
    if first:
        gc.freeze()
    return module
