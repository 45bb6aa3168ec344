"""The loop ticker the loop-freedom tests rely on (tests/loop.py): it sees a blocked loop, and it
keeps the test process's earlier heap out of the collections it measures."""

from __future__ import annotations

import gc
import time

from tests.loop import ticking


def in_collected_generations(obj: object) -> bool:
    return any(o is obj for generation in range(3) for o in gc.get_objects(generation))


def block_the_loop(seconds: float) -> None:
    time.sleep(seconds)


async def test_a_blocked_loop_shows_as_a_late_tick() -> None:
    async with ticking() as ticker:
        block_the_loop(0.06)  # on purpose: the ticker must see it
        await ticker.next_tick()
    assert ticker.longest >= 0.06


async def test_the_heap_before_is_frozen_while_ticking_and_thawed_after() -> None:
    before: list[list[int]] = [[1]]  # tracked by the collector, made before the ticker
    assert in_collected_generations(before)
    async with ticking():
        assert not in_collected_generations(before)
        during: list[list[int]] = [[2]]
        assert in_collected_generations(during)  # what the code under test makes is collected
    assert in_collected_generations(before)
    assert gc.get_freeze_count() == 0
