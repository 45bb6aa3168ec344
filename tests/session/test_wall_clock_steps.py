"""A step of the host's wall clock (NTP, a date set by hand, a VM resumed) moves no lease: a
live holder's work is neither taken over by another Memory nor lost by it, on both backends.
The step is real for the whole process (`time_machine` moves `datetime.now` and `time.time`;
the monotonic and boot time clocks go on), as a host's clock step is for every process on it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest
import time_machine

import mnemo
from mnemo import State
from tests.backends import sql
from tests.conftest import REPO
from tests.fakes import EventLog, FakeEmbedder, FakeLLM, Hold
from tests.storage.postgres.test_server_clock import Looks

STEPS = {"ahead": timedelta(hours=2), "behind": -timedelta(hours=2)}
ROOT = Path(__file__).resolve().parents[2]


async def open_on(
    stack: AsyncExitStack, store: str, llm: FakeLLM, events: EventLog
) -> mnemo.Memory:
    """A Memory with repo "r" and a lease of 30 s (it beats every 10 s: a step lands between
    two beats, when its lease was stamped before the step)."""
    mem = mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), on_event=events,
                       config=mnemo.Config(lease_timeout=30.0))
    await stack.enter_async_context(mem)
    await mem.open_repo(REPO)
    return mem


async def extracting(mem: mnemo.Memory, llm: FakeLLM) -> tuple[str, Hold, str]:
    """A session of `mem` extracting, its semantic call held: its id, the hold, and the id
    of its holder (`mem`)."""
    held = llm.hold("semantic")
    sid = await mem.start_session("explore the house", repo=REPO)
    await mem.append(sid, "walk north", "go north")
    await mem.close(sid)
    await held.started.wait()
    [(holder,)] = await sql(mem, "SELECT holder FROM sessions WHERE id = ?", sid)
    return sid, held, str(holder)


@pytest.mark.parametrize("step", STEPS.values(), ids=STEPS.keys())
async def test_a_step_of_the_wall_clock_leaves_live_work_with_its_holder(
    store: str, monkeypatch: pytest.MonkeyPatch, step: timedelta
) -> None:
    """A extracts a session (its model held) and beats; the wall clock steps two hours; B
    looks for work at once (a repo opened) and finds none, the lease stays A's, and the work
    ends through A. On SQLite, leases were stamped and judged with the wall clock: after a
    step ahead B found A's lease ended two hours ago and took its live extraction over."""
    llm_a, llm_b, events_a = FakeLLM(), FakeLLM(), EventLog()
    async with AsyncExitStack() as stack:
        a = await open_on(stack, store, llm_a, events_a)
        b = await open_on(stack, store, llm_b, EventLog())
        sid, held, holder = await extracting(a, llm_a)
        with time_machine.travel(datetime.now(UTC) + step, tick=True):
            looks = Looks(monkeypatch, b)
            await b.open_repo(REPO)  # the takeover task looks now, before A beats again
            await looks.after(1)
            assert not [found for found in looks.found if sid in found]
            assert await sql(b, "SELECT holder FROM sessions WHERE id = ?", sid) == [(holder,)]
            held.release()
            landed = await events_a.wait_state(a, sid, State.READY, State.FAILED)
        assert landed is State.READY
        assert "semantic" not in llm_b.tasks()


def spawn(store: str, *, hours: float) -> subprocess.Popen[bytes]:
    """`tests.session.clock_child` on `store`, its wall clock `hours` off."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.session.clock_child", store, str(hours)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )


@pytest.mark.slow
async def test_a_process_whose_wall_clock_is_ahead_leaves_live_work_with_its_holder(
    store: str,
) -> None:
    """A extracts a session (its model held) and beats; a process on the same host whose
    wall clock reads two hours ahead opens the store and looks for work: it takes nothing,
    and the work ends through A. It took A's live extraction over (by its clock, A's lease
    had ended two hours ago)."""
    llm_a, events_a = FakeLLM(), EventLog()
    async with AsyncExitStack() as stack:
        a = await open_on(stack, store, llm_a, events_a)
        sid, held, holder = await extracting(a, llm_a)
        child = spawn(store, hours=2)
        try:
            assert child.stdout is not None
            with anyio.fail_after(60):
                line = await anyio.to_thread.run_sync(child.stdout.readline)
            assert line, "the child died"
            assert "semantic" not in json.loads(line)
            assert await sql(a, "SELECT holder FROM sessions WHERE id = ?", sid) == [(holder,)]
        finally:
            await anyio.to_thread.run_sync(lambda: child.communicate(b"\n", timeout=30))
        held.release()
        landed = await events_a.wait_state(a, sid, State.READY, State.FAILED)
        assert landed is State.READY
