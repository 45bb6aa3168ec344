"""A child process for the wall clock test: a Memory on STORE in a process whose wall clock
is HOURS off (`time_machine`: `datetime.now` and `time.time`, not the monotonic clocks), with
repo "r" opened with the test's fake models. Once its takeover task has looked for work (and taken
what it found) after the repo opened, it prints the tasks its LLM was asked as JSON, then
waits for a line on stdin and closes.

    python -m tests.session.clock_child STORE HOURS
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import time_machine

import mnemo
from mnemo.session import timers
from tests.fakes import FakeEmbedder, FakeLLM


async def run(store: str, hours: float) -> None:
    llm = FakeLLM()
    with time_machine.travel(datetime.now(UTC) + timedelta(hours=hours), tick=True):
        async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(),
                                config=mnemo.Config(lease_timeout=30.0)) as mem:
            take_over, opened, looked = timers.take_over, False, anyio.Event()

            async def looking(live: Any) -> None:
                after = opened
                await take_over(live)
                if after:
                    looked.set()

            timers.take_over = looking
            await mem.open_repo("r")  # the takeover task looks again, now
            opened = True
            with anyio.fail_after(30):
                await looked.wait()
            print(json.dumps(llm.tasks()), flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)


if __name__ == "__main__":
    anyio.run(run, sys.argv[1], float(sys.argv[2]))
