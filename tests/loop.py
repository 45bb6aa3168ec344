"""How long the event loop was kept from running: a task that ticks every 5 ms and records how
late each tick was, for the tests that say a wait or a computation stays off the loop.

A full (generation 2) garbage collection stops every thread while it walks the whole heap, and
the heap of a test process that has run a thousand tests is large: on a slow machine one
collection took 0.34 s and failed a 0.25 s bound. That pause is the
interpreter's, proportional to what the test process holds, not a wait mnemo put on the loop.
So while a `Ticker` runs, the objects that existed before it are frozen out of collection
(`gc.freeze`, as a long-running application does after start-up); what the code under test
allocates is still collected, and its collections still count.
"""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

TICK = 0.005


class Ticker:
    """`gaps`: the seconds between consecutive ticks; `longest`: the largest of them."""

    def __init__(self) -> None:
        self.gaps: list[float] = []
        self._ticked = anyio.Event()

    @property
    def longest(self) -> float:
        return max(self.gaps, default=0.0)

    async def next_tick(self) -> None:
        """Returns after the next tick has been recorded."""
        await self._ticked.wait()

    async def _run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        last = time.perf_counter()
        task_status.started()
        while True:
            await anyio.sleep(TICK)
            now = time.perf_counter()
            self.gaps.append(now - last)
            last = now
            self._ticked.set()
            self._ticked = anyio.Event()


@asynccontextmanager
async def ticking() -> AsyncIterator[Ticker]:
    """Runs a `Ticker` over the block, with the heap from before it frozen out of
    collection; the ticker stops (and the heap thaws) when the block ends."""
    ticker = Ticker()
    # No collection first: it would walk the whole heap each time, and what the freeze keeps
    # of the garbage returns to collection when the block ends.
    gc.freeze()
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(ticker._run)
            try:
                yield ticker
            finally:
                tg.cancel_scope.cancel()
    finally:
        gc.unfreeze()
