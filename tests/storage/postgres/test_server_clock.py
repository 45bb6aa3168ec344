"""Memories on hosts whose clocks disagree, sharing one PostgreSQL database: every lease,
heartbeat and last use is the server's time (`ServerClock`), so a host's clock running ahead
or behind by more than a lease neither takes live work over nor has its own taken. (SQLite is
shared on one host, by one clock: there is nothing to disagree.)"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

import mnemo
from mnemo import State
from mnemo.storage.postgres.clock import ServerClock
from mnemo.storage.postgres.connection import Postgres
from tests.fakes import EventLog, FakeEmbedder, FakeLLM

REPO = "r"
SKEWS = {"ahead": timedelta(hours=1), "behind": -timedelta(hours=1)}


def off_by(skew: timedelta) -> Callable[[], datetime]:
    """A host clock `skew` away from this one."""
    return lambda: datetime.now(UTC) + skew


async def server_time(pg: Postgres) -> datetime:
    [(now,)] = await pg.fetch_all("SELECT clock_timestamp()")
    assert isinstance(now, datetime)
    return now


@pytest.mark.parametrize("skew", SKEWS.values(), ids=SKEWS.keys())
async def test_the_clock_reads_the_servers_time_whatever_the_hosts_says(
    pg_url: str, skew: timedelta
) -> None:
    async with Postgres(pg_url) as pg:
        clock = ServerClock(pg, host=off_by(skew))
        assert abs(clock.now() - await server_time(pg)) > timedelta(minutes=59)
        await clock.sync()
        assert abs(clock.now() - await server_time(pg)) < timedelta(seconds=1)


class Looks:
    """What a Memory's janitor found to take over, look by look (`Coordination.takeable`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, mem: mnemo.Memory) -> None:
        self.found: list[set[str]] = []
        self._changed = anyio.Event()
        co = mem._backend.coordination
        takeable = co.takeable

        async def looking(*args: Any, **kwargs: Any) -> Any:
            leases = await takeable(*args, **kwargs)
            self.found.append({lease.id for lease in leases})
            self._changed.set()
            self._changed = anyio.Event()
            return leases

        monkeypatch.setattr(co, "takeable", looking)

    async def after(self, looks: int) -> None:
        """Waits for `looks` more looks (the first may have begun before)."""
        wanted = len(self.found) + looks
        with anyio.fail_after(10):
            while len(self.found) < wanted:
                await self._changed.wait()


async def open_on(
    stack: AsyncExitStack, pg_url: str, llm: FakeLLM, events: EventLog, skew: timedelta
) -> mnemo.Memory:
    """A Memory on a host whose clock is `skew` off, with repo "r" and a short lease (its
    janitor looks every 1.5 s)."""
    mem = mnemo.Memory(pg_url, llm=llm, embedder=FakeEmbedder(), on_event=events,
                       config=mnemo.Config(lease_timeout=3.0))
    mem._backend.clock.host = off_by(skew)  # type: ignore[attr-defined]
    await stack.enter_async_context(mem)
    await mem.open_repo(REPO)
    return mem


@pytest.mark.parametrize("skew", SKEWS.values(), ids=SKEWS.keys())
async def test_a_host_whose_clock_is_off_leaves_live_work_with_its_holder(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, skew: timedelta
) -> None:
    """A extracts a session (its model held) and beats; B, on a host an hour ahead, looks
    for work twice and finds none; then the work ends through A. And the other way round: B,
    an hour behind, extracts, and A, whose host keeps good time, leaves it to B. Before,
    each host's own clock stamped and judged leases and heartbeats: B ahead took A's live
    extraction over (A's lease had ended an hour ago by B's clock), and A took B's over
    when B was behind (B's lease, by B's clock, ended an hour before it was written)."""
    llms = {"good": FakeLLM(), "off": FakeLLM()}
    events = {"good": EventLog(), "off": EventLog()}
    async with AsyncExitStack() as stack:
        good = await open_on(stack, pg_url, llms["good"], events["good"], timedelta(0))
        off = await open_on(stack, pg_url, llms["off"], events["off"], skew)
        holder, watcher = ("good", "off") if skew > timedelta(0) else ("off", "good")
        mems = {"good": good, "off": off}
        looks = Looks(monkeypatch, mems[watcher])
        held = llms[holder].hold("semantic")
        sid = await mems[holder].start_session("explore the house", repo=REPO)
        await mems[holder].append(sid, "walk north", "go north")
        await mems[holder].close(sid)
        with anyio.fail_after(5):
            await held.started.wait()
        await looks.after(2)
        assert not [found for found in looks.found if sid in found]
        held.release()
        landed = await events[holder].wait_state(mems[holder], sid, State.READY, State.FAILED)
        assert landed is State.READY
        assert "semantic" not in llms[watcher].tasks()
