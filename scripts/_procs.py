"""Many worker processes on one store, for `bench_sessions.py --processes`.

For each backend and each number of processes N, every case gets a fresh store; the parent
opens the repo once (and, for the shared case, starts the one session), then starts N worker
processes (multiprocessing, spawn). Each worker opens its own `mnemo.Memory` on the store with
the bench's instant fake LLM and embedder, warms up, says it is ready, and waits on a start
event; the parent sets one deadline for all of them and the event. Until the deadline each
worker runs its case in a loop; an operation in flight at the deadline finishes and counts,
and the wall time runs from the start to the last worker's last operation.

- append: each worker appends to its own session. Total appends/s, and per-append p50/p99
  over the samples of every worker.
- commit: each worker runs cycles of start_session, K appends, close_and_commit, end_session.
  Commits/s (episodes committed per second) and nodes/s (the receipts' node ids).
- shared: every worker appends to ONE session; appends through several Memory objects are
  serialised by compare-and-set on the session's version, so this shows what that costs.

After each case the parent reads the store back (`list_sessions`): the steps it holds must be
the appends the workers saw accepted, and in the shared case the indexes the workers were given
must be unique and contiguous. A refused operation (a `MnemoError`) is counted, not retried.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as EventType
from typing import Any

import anyio
import anyio.to_thread
from _bench import Latency, markdown_table, us
from _stores import Stores
from rich.table import Table

import mnemo

REPO = "bench"
CASES = ("append", "commit", "shared")
# Spawned workers import numpy, mnemo and the bench before they are ready: on a busy 2-core
# machine four of them can take tens of seconds.
READY_LIMIT_S = 180.0
OBSERVATION = "The test run shows 3 failures in tests/session/test_machine.py; step {j}."
ACTION = "open mnemo/session/queue.py and read TicketQueue.leave ({j})"

Factory = Callable[[], Any]


@dataclass(frozen=True, slots=True)
class ProcSizes:
    """How long and how much each worker works."""

    seconds: float  # timed wall per case, the same deadline for every worker
    commit_steps: int  # K: appends per commit cycle
    warmup: int  # appends (or commit cycles) before the start, untimed


QUICK_PROCS = ProcSizes(seconds=4.0, commit_steps=5, warmup=20)
FULL_PROCS = ProcSizes(seconds=15.0, commit_steps=5, warmup=50)


def parse_processes(value: str) -> tuple[int, ...]:
    """`--processes`'s type: "1,2,4" -> (1, 2, 4)."""
    counts = tuple(int(part) for part in value.split(",") if part.strip())
    if not counts or min(counts) < 1:
        raise ValueError(f"--processes takes positive counts like 1,2,4, not {value!r}")
    return counts


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    store: str
    case: str
    worker: int
    sizes: ProcSizes
    session_id: str | None  # the shared session, in the shared case


@dataclass(frozen=True, slots=True)
class WorkerResult:
    worker: int
    samples_ns: list[int] = field(default_factory=list)  # timed appends
    indexes: list[int] = field(default_factory=list)  # step indexes given (shared case)
    appends: int = 0  # accepted appends, warm-up included
    commits: int = 0
    nodes: int = 0
    refused: int = 0
    ended: float = 0.0  # time.monotonic() after the last timed operation
    error: str | None = None


def worker_main(spec: WorkerSpec, llm: Factory, embedder: Factory, ready: Any,
                start: EventType, deadline: Any, results: Any) -> None:
    """A worker process: one Memory on the store, the case until the deadline, one result."""
    try:
        result = anyio.run(_work, spec, llm, embedder, ready, start, deadline)
    except Exception:
        ready.put(spec.worker)  # never leave the parent waiting for a worker that died
        result = WorkerResult(spec.worker, error=traceback.format_exc())
    results.put(result)


async def _work(spec: WorkerSpec, llm: Factory, embedder: Factory, ready: Any,
                start: EventType, deadline: Any) -> WorkerResult:
    async with mnemo.Memory(spec.store, llm=llm(), embedder=embedder()) as mem:
        run = _Run(mem, spec)
        await run.warm_up()
        ready.put(spec.worker)
        # A blocking wait on another thread: the Memory's heartbeat keeps running meanwhile.
        await anyio.to_thread.run_sync(start.wait)
        until = float(deadline.value)
        while time.monotonic() < until:
            await run.once()
        ended = time.monotonic()
        return WorkerResult(spec.worker, run.samples, run.indexes, run.appends, run.commits,
                            run.nodes, run.refused, ended)


class _Run:
    """One worker's case: its session, its counters, one operation (or cycle) at a time."""

    def __init__(self, mem: mnemo.Memory, spec: WorkerSpec) -> None:
        self.mem, self.spec = mem, spec
        self.session_id = spec.session_id
        self.samples: list[int] = []
        self.indexes: list[int] = []
        self.appends = self.commits = self.nodes = self.refused = 0
        self._j = 0

    async def warm_up(self) -> None:
        if self.spec.case == "append":
            self.session_id = await self.mem.start_session(
                f"worker {self.spec.worker}", repo=REPO)
        for _ in range(self.spec.sizes.warmup if self.spec.case != "commit" else 2):
            await self.once(timed=False)

    async def once(self, *, timed: bool = True) -> None:
        try:
            if self.spec.case == "commit":
                await self._cycle(timed)
            else:
                assert self.session_id is not None
                await self._append(self.session_id, timed)
        except mnemo.MnemoError:
            self.refused += 1

    async def _append(self, session_id: str, timed: bool) -> None:
        j, self._j = self._j, self._j + 1
        tag = f"w{self.spec.worker}.{j}"
        begun = time.perf_counter_ns()
        info = await self.mem.append(session_id, OBSERVATION.format(j=tag),
                                     ACTION.format(j=tag))
        if timed:
            self.samples.append(time.perf_counter_ns() - begun)
        self.appends += 1
        self.indexes.append(info.index)

    async def _cycle(self, timed: bool) -> None:
        session_id = await self.mem.start_session(f"cycle of worker {self.spec.worker}",
                                                  repo=REPO)
        for _ in range(self.spec.sizes.commit_steps):
            await self._append(session_id, timed)
        receipt = await self.mem.close_and_commit(session_id)
        await self.mem.end_session(session_id)
        if timed:
            self.commits += 1
            self.nodes += len(receipt.node_ids)


@dataclass(frozen=True, slots=True)
class ProcRow:
    """One case with N processes on one backend."""

    backend: str
    case: str
    processes: int
    wall_s: float
    latency: Latency | None
    appends: int  # timed
    commits: int
    nodes: int
    refused: int
    check: str  # what reading the store back found

    @property
    def appends_per_s(self) -> float:
        return self.appends / self.wall_s

    @property
    def commits_per_s(self) -> float:
        return self.commits / self.wall_s

    @property
    def nodes_per_s(self) -> float:
        return self.nodes / self.wall_s


async def bench_processes(stores: Stores, backend: str, counts: Sequence[int],
                          sizes: ProcSizes, llm: Factory, embedder: Factory,
                          log: Callable[[str], None]) -> list[ProcRow]:
    rows = []
    for case in CASES:
        for n in counts:
            log(f"processes ({backend}): {case}, {n} worker(s) x {sizes.seconds:g} s")
            rows.append(await run_case(stores, backend, case, n, sizes, llm, embedder))
    return rows


async def run_case(stores: Stores, backend: str, case: str, n: int, sizes: ProcSizes,
                   llm: Factory, embedder: Factory) -> ProcRow:
    store = str(await stores.fresh(backend, f"procs-{case}-{n}"))
    shared: str | None = None
    async with mnemo.Memory(store, llm=llm(), embedder=embedder()) as mem:
        await mem.open_repo(REPO)
        if case == "shared":
            shared = await mem.start_session("one session, every worker", repo=REPO)
    specs = [WorkerSpec(store, case, i, sizes, shared) for i in range(n)]
    begun, results = await anyio.to_thread.run_sync(_run_workers, specs, llm, embedder)
    failed = [r for r in results if r.error is not None]
    if failed:
        raise RuntimeError(f"worker {failed[0].worker} failed:\n{failed[0].error}")
    samples = [s for r in results for s in r.samples_ns]
    return ProcRow(
        backend, case, n, max(r.ended for r in results) - begun,
        Latency.of(samples) if samples else None, len(samples),
        sum(r.commits for r in results), sum(r.nodes for r in results),
        sum(r.refused for r in results), await _check(store, case, results, llm, embedder),
    )


def _run_workers(specs: list[WorkerSpec], llm: Factory,
                 embedder: Factory) -> tuple[float, list[WorkerResult]]:
    """Starts the workers, waits until all are ready, starts them together; returns the
    start time and their results."""
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    start, deadline = ctx.Event(), ctx.Value("d", 0.0)
    procs = [ctx.Process(target=worker_main,
                         args=(spec, llm, embedder, ready, start, deadline, results))
             for spec in specs]
    for proc in procs:
        proc.start()
    try:
        for _ in specs:
            ready.get(timeout=READY_LIMIT_S)
        begun = time.monotonic()
        deadline.value = begun + specs[0].sizes.seconds
        start.set()
        limit = specs[0].sizes.seconds + READY_LIMIT_S
        collected = [results.get(timeout=limit) for _ in specs]
    except queue.Empty:
        raise RuntimeError(f"a worker neither reported nor failed within "
                           f"{READY_LIMIT_S:.0f} s") from None
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for channel in (ready, results):
            channel.close()
            channel.join_thread()
    return begun, collected


async def _check(store: str, case: str, results: list[WorkerResult], llm: Factory,
                 embedder: Factory) -> str:
    """The store read back: its steps against the appends the workers saw accepted."""
    async with mnemo.Memory(store, llm=llm(), embedder=embedder()) as mem:
        live = await mem.list_sessions()
    accepted = sum(r.appends for r in results)
    if case == "commit":
        # Every cycle ended its session; only a refused cycle's session may be left.
        return "ok" if not live else f"{len(live)} sessions left"
    held = sum(s.steps for s in live)
    found = "ok" if held == accepted else f"{held:,} steps stored, {accepted:,} accepted"
    if case == "shared":
        indexes = sorted(i for r in results for i in r.indexes)
        if indexes != list(range(len(indexes))):
            found += "; indexes not unique and contiguous"
    return found


def procs_table(rows: list[ProcRow], sizes: ProcSizes) -> Table:
    table = Table(title="6. Many processes on one store (one Memory per worker process)")
    for name in ("backend", "case", "processes", "appends/s", "p50 µs", "p99 µs",
                 "commits/s", "nodes/s", "refused", "store read back"):
        table.add_column(name, justify="left" if name in ("backend", "case", "store read back")
                         else "right")
    for row in rows:
        cells = _cells(row)
        table.add_row(row.backend, CASE_LABELS[row.case], str(row.processes), *cells,
                      str(row.refused), row.check)
    table.caption = (
        f"{sizes.seconds:g} s of wall time per case after every worker is ready; instant fake "
        f"LLM and embedder. append: one session per worker; commit: cycles of start, "
        f"{sizes.commit_steps} appends, close_and_commit, end; shared: every worker appends "
        "to one session. p50/p99 per append over all workers. refused = operations that "
        "raised a MnemoError."
    )
    return table


CASE_LABELS = {
    "append": "append, own session",
    "commit": "commit cycles",
    "shared": "append, one shared session",
}


def _cells(row: ProcRow) -> list[str]:
    lat = row.latency
    p50, p99 = ("n/a", "n/a") if lat is None else (us(lat.p50_us), us(lat.p99_us))
    commits = (f"{row.commits_per_s:,.1f}", f"{row.nodes_per_s:,.0f}") if (
        row.case == "commit") else ("", "")
    return [f"{row.appends_per_s:,.0f}", p50, p99, *commits]


def procs_markdown(rows: list[ProcRow]) -> str:
    return markdown_table(
        ["backend", "case", "processes", "appends/s", "p50 / p99 µs", "commits/s", "nodes/s",
         "refused", "store read back"],
        [[row.backend, CASE_LABELS[row.case], str(row.processes), cells[0],
          f"{cells[1]} / {cells[2]}", cells[3], cells[4], str(row.refused), row.check]
         for row in rows for cells in [_cells(row)]],
    )
