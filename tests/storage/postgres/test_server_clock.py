"""Memories on hosts whose clocks disagree, sharing one PostgreSQL database: every lease,
heartbeat, last use and message age is the server's time (`ServerClock`), so a host's clock
running ahead or behind by more than a lease neither takes live work over nor has its own
taken, nor erases messages another host just wrote. (SQLite is shared on one host, by one
clock: there is nothing to disagree.)"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

import mnemo
from mnemo import State
from mnemo.storage import clock as clocks
from mnemo.storage.postgres.connection import Postgres
from mnemo.storage.postgres.store import ServerClock
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


def near(clock: ServerClock, server: datetime) -> bool:
    return abs(clock.now() - server) < timedelta(seconds=1)


@pytest.mark.parametrize("skew", SKEWS.values(), ids=SKEWS.keys())
async def test_the_clock_reads_the_servers_time_whatever_the_hosts_says(
    pg_url: str, skew: timedelta
) -> None:
    """Then a step of the host's wall clock (NTP, a date set by hand) moves nothing: the time
    since the read is counted on a monotonic clock (it used to be host time plus an offset)."""
    async with Postgres(pg_url) as pg:
        clock = ServerClock(pg, host=off_by(skew))
        assert not near(clock, await server_time(pg))
        await clock.sync()
        assert near(clock, await server_time(pg))
        clock.host = off_by(-skew)
        assert near(clock, await server_time(pg))


async def test_the_clock_runs_on_from_its_read_by_the_hosts_monotonic_clock(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between two reads, `now` moves as far as the monotonic clock does (here 30 s on,
    made up), whatever the wall clock does (here nothing)."""
    async with Postgres(pg_url) as pg:
        clock = ServerClock(pg)
        await clock.sync()
        before = clock.now()
        ticks = clocks.elapsed()
        monkeypatch.setattr(clocks, "elapsed", lambda: ticks + 30.0)
        assert abs(clock.now() - before - timedelta(seconds=30)) < timedelta(seconds=1)


async def test_a_failed_read_of_the_servers_time_keeps_the_last(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Postgres(pg_url) as pg:
        clock = ServerClock(pg, host=off_by(SKEWS["ahead"]))
        await clock.sync()

        def away() -> Any:
            raise mnemo.StorageError("unavailable", "the server is away")

        monkeypatch.setattr(pg, "connection", away)
        with pytest.raises(mnemo.StorageError):
            await clock.sync()
        monkeypatch.undo()
        assert near(clock, await server_time(pg))


async def test_a_memory_whose_first_read_of_the_servers_time_fails_leaves_nothing_open(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The open raises the read's StorageError and closes the pool it had opened (it
    stayed open)."""

    async def away(self: ServerClock) -> None:
        raise mnemo.StorageError("unavailable", "the server is away")

    monkeypatch.setattr(ServerClock, "sync", away)
    mem = mnemo.Memory(pg_url, llm=FakeLLM(), embedder=FakeEmbedder())
    with pytest.raises(mnemo.StorageError):
        await mem.__aenter__()
    assert mem._backend.postgres._pool.closed  # type: ignore[attr-defined]


class Looks:
    """What a Memory's takeover task found to take over, look by look (`Coordination.takeable`)."""

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
    takeover task looks every 1.5 s)."""
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


async def test_the_takeover_task_reads_the_servers_time_again_at_each_look(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read gone wrong (here: an hour off) is mended by the next look, which a host
    that drifts, or a first read made across a stalled loop, needs."""
    async with AsyncExitStack() as stack:
        mem = await open_on(stack, pg_url, FakeLLM(), EventLog(), timedelta(0))
        clock: ServerClock = mem._backend.clock  # type: ignore[attr-defined]
        looks = Looks(monkeypatch, mem)
        assert clock._read is not None
        server, at = clock._read
        clock._read = (server - timedelta(hours=1), at)
        await looks.after(2)
        assert near(clock, await server_time(mem._backend.postgres))  # type: ignore[attr-defined]


async def test_a_conversation_is_timed_by_the_stores_clock(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages are stamped, and their ttl judged, with the server's time as this Memory
    reads it, not its host's: threads are shared by every Memory on the database, and a host
    ahead by more than the ttl erased the messages another host had just written.
    Here the server reads two hours behind this host."""
    async with AsyncExitStack() as stack:
        mem = await open_on(stack, pg_url, FakeLLM(), EventLog(), timedelta(0))
        clock: ServerClock = mem._backend.clock  # type: ignore[attr-defined]

        async def read_kept() -> None:  # the takeover task's looks leave the read below alone
            return None

        monkeypatch.setattr(clock, "sync", read_kept)
        await Looks(monkeypatch, mem).after(2)  # none still reading the time as it was
        assert clock._read is not None
        server, at = clock._read
        clock._read = (server - timedelta(hours=2), at)
        conversation = mem.conversation(ttl=3600)
        await conversation.save("t", [{"role": "user", "content": "hello"}])
        pg: Postgres = mem._backend.postgres  # type: ignore[attr-defined]
        [(recorded,)] = await pg.fetch_all("SELECT recorded_at FROM messages")
        assert abs(recorded - clock.now()) < timedelta(minutes=1)
        assert [m["content"] for m in await conversation.load("t")] == ["hello"]
        assert not near(clock, await server_time(pg))  # the made-up read held throughout
