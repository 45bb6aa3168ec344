"""`Worker`: one thread running jobs in the order given; a job begun and never awaited may
outlive its event loop."""

from __future__ import annotations

import threading

import anyio

from mnemo.cpu import Worker


def test_a_job_that_ends_after_its_loop_closed_is_dropped_and_the_thread_goes_on() -> None:
    """A job begun (`start`) and never awaited that ends after its event loop closed: its
    answer is dropped, and the thread serves the jobs given after it."""
    worker = Worker("mnemo-test-worker")
    gate = threading.Event()

    async def begin() -> None:
        worker.start(lambda: gate.wait(10))

    anyio.run(begin)  # the loop closes while the job waits
    gate.set()

    async def after() -> int:
        with anyio.fail_after(10):
            answer: int = await worker.start(lambda: 7)
        return answer

    try:
        assert anyio.run(after) == 7
    finally:
        worker.stop()
