"""Extraction over HTTP: close-to-ready time and rate-limited throughput, against a local server.

Every LLM call goes over a real socket to the fake provider of `tests/adapters/provider_server.py`
on 127.0.0.1 (a thread per connection; it answers mnemo's tasks with valid data after a fixed
latency), through `OpenAICompatible` and its `Transport` (retries, rate gate, concurrency cap).
The fake runs in a process of its own (`_provider_process.py`), as a model server does: in the
bench's process its threads would wait for the GIL the client holds (`--in-process` runs it
there, for comparison). The embedder is mnemo's in-process `HashEmbedder`, so only the LLM has
latency.

1. Close-to-ready. Episodes of 1, 2, 4, 8 and 16 trajectories of 2 steps each are appended,
   every call at `--latency`; the wall time runs from `await mem.close(sid)` to the
   "transition" event to "ready" (an anyio.Event set by `on_event`; nothing polls). The
   critical path is mnemo's longest chain of dependent calls: round 1 asks every trajectory's
   semantic and procedural at once (the last procedural scoring the last step), round 2 the
   "return" scoring of each trajectory with several instructions (here each has two): 2 x
   latency, whatever the number of trajectories, which run side by side. The repo's
   `llm_concurrency` and the adapter's `max_concurrency` ceiling are raised to 64 so neither
   is what is measured. The adapter's concurrency adapts to the server (it starts at 2 for a
   server it has not met): the first row is its first contact with the server, at the
   largest size; the others run on what it learned. "Rounds" counts the waves of requests the
   server saw (a new wave starts after a gap of half the latency). "Client CPU" is the CPU
   time of the event loop's thread from close to ready (`time.thread_time`), which load moves
   less than wall times. Goal (after first contact): <= 1.2x the critical path, and at most
   2 rounds.
2. Throughput under a requests/min limit. 32 tasks call `generate` in a loop for `--seconds`
   through an adapter with `requests_per_minute=--rpm`; completed calls per minute are
   compared with the limit (goal >= 90%), and the busiest second the server saw shows that
   the limiter smooths (one second's worth of burst, not a minute's).

Run: `.venv/bin/python scripts/bench_extraction.py [--quick] [--latency 0.1] [--rpm 600]
[--seconds 30] [--in-process]`. `--quick` is the short run.
`import mnemo` finds the venv's install (an editable one points at the main checkout): set
`PYTHONPATH` to measure another checkout, e.g. a worktree of an older commit for a before/after
pair; the facts table names the `mnemo` measured.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import anyio
from _bench import facts_table, machine_facts, markdown_table, ms, ratio, verdict
from rich.console import Console
from rich.table import Table

import mnemo
from mnemo.adapters.openai import OpenAICompatible
from mnemo.episode import reward_request

# The fake provider lives with the tests that use it; the bench borrows it from there.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _provider_process import ProviderProcess

from tests.adapters.provider_server import ProviderServer

# The server the bench talks to: the fake in a process of its own, or in this one.
Server = ProviderProcess | ProviderServer

console = Console()
READY_GOAL = 1.2
THROUGHPUT_GOAL = 0.9
CHAIN = 2  # reward(last step) | semantic | procedural, then return
ROUNDS_GOAL = 2
WAIT_LIMIT_S = 60.0
WORKERS = 32
TOPICS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa"
).split()


@dataclass(frozen=True, slots=True)
class Sizes:
    trajectories: tuple[int, ...]
    repeats: int
    seconds: float


FULL = Sizes(trajectories=(1, 2, 4, 8, 16), repeats=3, seconds=30.0)
QUICK = Sizes(trajectories=(1, 4, 16), repeats=1, seconds=6.0)


class Ready:
    """An `on_event` sink: `expect(sid)` gives an event set when the session reaches ready
    or failed; `reached` says which."""

    def __init__(self) -> None:
        self._waiting: dict[str, anyio.Event] = {}
        self.reached: dict[str, str] = {}

    def expect(self, session_id: str) -> anyio.Event:
        self._waiting[session_id] = anyio.Event()
        return self._waiting[session_id]

    def __call__(self, event: mnemo.Event) -> None:
        to = event.data.get("to")
        if event.kind != "transition" or to not in (mnemo.State.READY, mnemo.State.FAILED):
            return
        waiter = self._waiting.pop(event.session_id or "", None)
        if waiter is not None:
            self.reached[event.session_id or ""] = str(to)
            waiter.set()


# ---- 1. close-to-ready ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadyRow:
    trajectories: int
    walls_s: list[float]
    calls: int
    latency_s: float
    rounds: int
    cpus_s: list[float]
    # The adapter's first burst to this server: its concurrency limit starts low (2) and
    # learns the server's room during it; a repo remembers it for the next adapter.
    first_contact: bool = False

    @property
    def label(self) -> str:
        return f"{self.trajectories}" + (" (first contact)" if self.first_contact else "")

    @property
    def expected_calls(self) -> int:
        # semantic, procedural (the last one scoring the last step) and return each
        return 3 * self.trajectories

    @property
    def critical_s(self) -> float:
        return CHAIN * self.latency_s

    @property
    def wall_s(self) -> float:
        return median(self.walls_s)

    @property
    def vs_critical(self) -> float:
        return self.wall_s / self.critical_s

    @property
    def met(self) -> bool:
        return self.vs_critical <= READY_GOAL and self.rounds <= ROUNDS_GOAL


def arrivals(server: Server, since: int = 0) -> list[float]:
    """When each request from the `since`-th on reached the server (`time.monotonic()`)."""
    if isinstance(server, ProviderProcess):
        return server.arrivals(since)
    return [r.at for r in server.requests[since:]]


async def one_close(
    mem: mnemo.Memory, server: Server, ready: Ready, trajectories: int, latency: float
) -> tuple[float, int, int, float]:
    """Appends `trajectories` x 2 steps, then times close -> ready, every call at `latency`
    (a server does not answer faster while a session appends); returns (seconds, LLM calls
    made meanwhile, rounds of them, the event loop thread's CPU seconds)."""
    server.latency = latency
    sid = await mem.start_session("ship the release", repo="bench")
    seen: set[str] = set()
    for k in range(trajectories):
        for j in range(2):
            info = await mem.append(sid, f"{TOPICS[k]} step {j}", f"run task {k}.{j}")
            seen.add(info.trajectory_id)
    if len(seen) != trajectories:
        raise RuntimeError(f"expected {trajectories} trajectories, got {len(seen)}")
    before = len(arrivals(server))
    arrived = ready.expect(sid)
    start, cpu = time.perf_counter(), time.thread_time()
    await mem.close(sid)
    with anyio.fail_after(WAIT_LIMIT_S):
        await arrived.wait()
    wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
    if ready.reached.get(sid) != mnemo.State.READY:
        raise RuntimeError(f"{sid} ended {ready.reached.get(sid)}, not ready")
    seen = sorted(arrivals(server, before))
    await mem.discard(sid)
    await mem.end_session(sid)
    return wall, len(seen), waves(seen, latency / 2), cpu


def waves(times: list[float], gap: float) -> int:
    """How many groups `times` (sorted) fall into, a new one starting after a `gap`."""
    return sum(1 for i, at in enumerate(times) if i == 0 or at - times[i - 1] > gap)


async def bench_ready(server: Server, sizes: Sizes, latency: float) -> list[ReadyRow]:
    ready = Ready()
    rows: list[ReadyRow] = []
    # Given to the Memory too: a provider's limiter is sized by the first config that asks,
    # and the Memory's own default config may ask first.
    config = mnemo.Config(llm_concurrency=64)
    async with (
        OpenAICompatible("bench", base_url=server.openai_url, max_concurrency=64) as llm,
        mnemo.Memory(
            ":memory:", llm=llm, embedder=mnemo.HashEmbedder(), config=config, on_event=ready
        ) as mem,
    ):
        await mem.open_repo("bench", config=config)
        largest = max(sizes.trajectories)
        console.log(f"close-to-ready: {largest} trajectories, first contact")
        wall, calls, seen, cpu = await one_close(mem, server, ready, largest, latency)
        rows.append(ReadyRow(largest, [wall], calls, latency, seen, [cpu], first_contact=True))
        for trajectories in sizes.trajectories:
            console.log(f"close-to-ready: {trajectories} trajectories x {sizes.repeats}")
            walls: list[float] = []
            cpus: list[float] = []
            calls = rounds = 0
            for _ in range(sizes.repeats):
                wall, calls, seen, cpu = await one_close(mem, server, ready, trajectories,
                                                         latency)
                walls.append(wall)
                cpus.append(cpu)
                rounds = max(rounds, seen)
            rows.append(ReadyRow(trajectories, walls, calls, latency, rounds, cpus))
    return rows


def ready_table(rows: list[ReadyRow], latency: float) -> Table:
    table = Table(title=f"1. Close-to-ready over HTTP ({latency * 1000:.0f} ms per LLM call)")
    for name in ("trajectories", "LLM calls (seen/expected)", "rounds", "critical path ms",
                 "median ms", "min-max ms", "client CPU ms", "x critical", "goal"):
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(
            row.label, f"{row.calls}/{row.expected_calls}", str(row.rounds),
            ms(row.critical_s), ms(row.wall_s), f"{ms(min(row.walls_s))}-{ms(max(row.walls_s))}",
            ms(median(row.cpus_s)), ratio(row.vs_critical), verdict(row.met),
        )
    return table


# ---- 2. throughput under a requests/min limit ------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThroughputRow:
    rpm: float
    seconds: float
    completed: int
    errors: int
    busiest_second: int
    latency_s: float

    @property
    def per_minute(self) -> float:
        return self.completed / self.seconds * 60.0

    @property
    def share(self) -> float:
        return self.per_minute / self.rpm


async def bench_throughput(
    server: Server, rpm: float, seconds: float, latency: float
) -> ThroughputRow:
    console.log(f"throughput: rpm={rpm:g} for {seconds:g} s, {WORKERS} callers")
    server.latency = latency
    request = reward_request(goal="ship the release", subgoal="build", observation="build ok",
                             action="make", next_observation=None)
    completed = errors = 0
    before = len(arrivals(server))

    async def caller(llm: OpenAICompatible) -> None:
        nonlocal completed, errors
        while True:
            try:
                await llm.generate(request)
            except mnemo.LLMError:
                errors += 1
            else:
                completed += 1

    async with OpenAICompatible(
        "bench", base_url=server.openai_url, requests_per_minute=rpm, max_concurrency=WORKERS
    ) as llm:
        # Cancelled at the deadline: a call still waiting then is not counted.
        with anyio.move_on_after(seconds):
            async with anyio.create_task_group() as tg:
                for _ in range(WORKERS):
                    tg.start_soon(caller, llm)
    seen = sorted(arrivals(server, before))
    server.latency = 0.0
    return ThroughputRow(rpm, seconds, completed, errors, busiest(seen, 1.0), latency)


def busiest(times: list[float], window: float) -> int:
    """The most arrivals in any `window` seconds (`times` sorted)."""
    most = start = 0
    for end, at in enumerate(times):
        while at - times[start] >= window:
            start += 1
        most = max(most, end - start + 1)
    return most


def throughput_table(rows: list[ThroughputRow]) -> Table:
    table = Table(title="2. Throughput under a requests/min limit")
    for name in ("limit rpm", "window s", "completed", "errors", "achieved rpm", "of limit",
                 "busiest second", "goal"):
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(
            f"{row.rpm:g}", f"{row.seconds:g}", str(row.completed), str(row.errors),
            f"{row.per_minute:,.0f}", f"{row.share:.0%}", f"{row.busiest_second} req",
            verdict(row.share >= THROUGHPUT_GOAL),
        )
    return table


# ---- summary and main -------------------------------------------------------------------------


def summary(ready: list[ReadyRow], throughput: list[ThroughputRow], latency: float) -> str:
    rows = [
        [f"close-to-ready, {row.label} trajectories ({row.calls} calls)",
         f"{ms(row.wall_s)} ms, {row.rounds} rounds, client CPU {ms(median(row.cpus_s))} ms",
         f"≤ {READY_GOAL}x {ms(row.critical_s)} ms, ≤ {ROUNDS_GOAL} rounds",
         f"{ratio(row.vs_critical)} {verdict(row.met)}"]
        for row in ready
    ]
    rows += [
        [f"throughput at rpm={row.rpm:g} ({row.seconds:g} s, {WORKERS} callers)",
         f"{row.per_minute:,.0f} rpm; busiest second {row.busiest_second}",
         f"≥ {THROUGHPUT_GOAL:.0%} of limit",
         f"{row.share:.0%} {verdict(row.share >= THROUGHPUT_GOAL)}"]
        for row in throughput
    ]
    head = (f"LLM latency {latency * 1000:.0f} ms per call, over HTTP to a local fake provider "
            "(scripts/bench_extraction.py)\n\n")
    return head + markdown_table(["measure", "result", "goal", "outcome"], rows)


def parse_args() -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes, a 6 s window")
    parser.add_argument("--latency", type=float, default=0.1, help="seconds per LLM call")
    parser.add_argument("--rpm", type=float, default=600.0, help="requests/min limit")
    parser.add_argument("--seconds", type=float, default=None,
                        help="throughput window (default 30, quick 6)")
    parser.add_argument("--in-process", action="store_true",
                        help="run the fake provider in this process (threads), not its own")
    return parser.parse_args()


async def run(sizes: Sizes, latency: float, rpm: float, seconds: float, in_process: bool
              ) -> None:
    with ProviderServer() if in_process else ProviderProcess() as server:
        ready = await bench_ready(server, sizes, latency)
        console.print(ready_table(ready, latency))
        throughput = [await bench_throughput(server, rpm, seconds, latency)]
        console.print(throughput_table(throughput))
    console.rule("Summary (Markdown, for BENCHMARKS.md)")
    console.print(summary(ready, throughput, latency), markup=False, highlight=False,
                  soft_wrap=True)


def main() -> None:
    args = parse_args()
    sizes = QUICK if args.quick else FULL
    seconds = args.seconds if args.seconds is not None else sizes.seconds
    console.print(facts_table({**machine_facts(), "anyio backend": "asyncio",
                               "sizes": "quick" if args.quick else "full",
                               "fake provider": "this process" if args.in_process
                               else "its own process",
                               "mnemo": str(Path(mnemo.__file__).parent)}))
    started = time.perf_counter()
    anyio.run(run, sizes, args.latency, args.rpm, seconds, args.in_process)
    console.print(f"[dim]total {time.perf_counter() - started:.1f} s[/]")


if __name__ == "__main__":
    main()
