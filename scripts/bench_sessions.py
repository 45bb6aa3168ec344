"""Session benchmarks: what mnemo costs around the LLM, measured with fakes that cost nothing.

Every Memory here is a real SQLite file (WAL, `synchronous=NORMAL`: the default
`mnemo.Memory(path)`) in a temporary directory, driven through the public API only. The LLM
and embedder are fakes defined below, so what is left is mnemo's own work: state machine,
annotation plumbing, SQLite writes, extraction orchestration and commits.

1. Append latency. `FastLLM` answers every task at once with fixed valid data and
   `FastEmbedder` returns a constant unit vector. 1, 10 and 100 sessions append their steps
   concurrently in one anyio task group; each `await mem.append(...)` is timed with
   `perf_counter_ns` (p50/p99 in µs), throughput is appends / wall time. One more row has a
   single session append beside 2,000 idle ones (idle sessions should cost an append
   nothing). Beside them: a bare durable insert of the same `steps` row (stdlib sqlite3, WAL,
   synchronous=NORMAL, one BEGIN/COMMIT per insert) into mnemo's own table definition.
   Goal: append p50 ≤ 150 µs.
2. Close-to-ready. `TopicLLM` sleeps 100 ms per call (the embedder is instant); episodes of 1,
   4 and 16 trajectories of 2 steps each. The wall time runs from `await mem.close(sid)` to
   the "transition" event to "ready" (an anyio.Event set by `on_event`; nothing polls). It is
   compared with the critical path: the longest chain of dependent LLM calls in the
   extraction, times the latency. Goal: ≤ 1.2x the critical path.
3. Commit throughput. A ready session holding thousands of nodes (many facts, a few shared
   concepts, distinct intents; two sizes, to show how it scales) is committed with
   `mem.commit` into a fresh repo; nodes/s is compared with raw
   `executemany` of the very rows mnemo wrote (read back from its file) into a fresh file with
   mnemo's schema (nodes, links, vectors, the FTS5 external-content table and its triggers),
   in one transaction. Goal: ≥ 0.5x raw.
4. RSS per idle session. In a fresh process, RSS (after `gc.collect()`) before and after
   starting 2,000 sessions that each append one step and stay collecting.
5. Connections (PostgreSQL). 100 sessions append concurrently, as in 1, while another
   connection samples `pg_stat_activity` for the database every 10 ms: the peak, the count
   when the appends end (the Memory still open), and after the Memory closed.

With `--store URL|embedded` (scripts/_stores.py) every case also runs on PostgreSQL, in the
same run, each in a fresh database, and the tables get a backend column. PostgreSQL's
baselines (scripts/_pg_rows.py) are the same rows written without mnemo: one transaction per
`steps` row through psycopg, and the commit's rows read back from mnemo's database and
written into a fresh one in one transaction by `executemany` and by binary `COPY`.

6. Many processes on one store. With `--processes 1,2,4` the run measures only
   this (scripts/_procs.py): for each count N, N worker processes, each with its own Memory on
   one fresh store, append to their own sessions, run start/append/close_and_commit cycles,
   and all append to one shared session; appends/s, p50/p99, commits/s and nodes/s.

Run: `.venv/bin/python scripts/bench_sessions.py [--quick] [--profile] [--store URL|embedded]
[--processes N[,N...]]`. `--quick` shrinks every size; `--profile`
adds cProfile listings of the append and commit paths (SQLite).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import hashlib
import io
import math
import pstats
import sqlite3
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path
from statistics import median
from typing import Any

import _pg_rows
import _procs
import anyio
import anyio.to_thread
import numpy as np
import numpy.typing as npt
from _bench import (
    Latency,
    facts_table,
    machine_facts,
    markdown_table,
    ms,
    ratio,
    rss_bytes,
    us,
    verdict,
)
from _stores import POSTGRES, SQLITE, Stores, open_stores, store_argument
from rich.console import Console
from rich.table import Table

import mnemo

# The one import from outside the facade: the fakes read a request's inputs the way mnemo's
# own offline LLM does, so they follow the prompts if those change.
from mnemo.calls.tasks import task_inputs

# Wide enough for the tables when the output is a file or a pipe (rich assumes 80 there).
console = Console(width=None if sys.stdout.isatty() else 120)

DIM = 384
APPEND_GOAL_US = 150.0
READY_GOAL = 1.2
COMMIT_GOAL = 0.5
LLM_LATENCY_S = 0.1
MEM0_ADD_MS = 0.55  # mem0's storage-only add at 100 memories, for scale
WAIT_LIMIT_S = 60.0

OBSERVATION = (
    "The test run shows 3 failures in tests/session/test_machine.py after the queue refactor;"
    " the traceback points at Turnstile.leave. Step {j}."
)
ACTION = "open mnemo/session/queue.py and read Turnstile.leave ({j})"
STATE_TEXT = (
    "The agent is debugging failing session tests; the suspect is the turnstile that keeps"
    " appends in call order."
)


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each section does."""

    appends_per_level: int  # total appends per concurrency level, split across its sessions
    concurrency: tuple[int, ...]
    warmup_appends: int
    idle_beside_append: int  # idle sessions alive while one more session appends
    ready_trajectories: tuple[int, ...]
    ready_repeats: int
    commit_trajectories: tuple[int, ...]  # per changeset, of 2 steps each
    commit_facts: int  # per trajectory, 2 concepts each from a small shared pool
    commit_instructions: int  # per trajectory, each with its own intent
    commit_repeats: int
    idle_sessions: int


FULL = Sizes(
    appends_per_level=6_000,
    concurrency=(1, 10, 100),
    warmup_appends=200,
    idle_beside_append=2_000,
    ready_trajectories=(1, 4, 16),
    ready_repeats=5,
    commit_trajectories=(100, 250),
    commit_facts=10,
    commit_instructions=3,
    commit_repeats=2,
    idle_sessions=2_000,
)
QUICK = Sizes(
    appends_per_level=1_500,
    concurrency=(1, 10, 100),
    warmup_appends=100,
    idle_beside_append=2_000,
    ready_trajectories=(1, 4, 16),
    ready_repeats=2,
    commit_trajectories=(30, 60),
    commit_facts=10,
    commit_instructions=3,
    commit_repeats=1,
    idle_sessions=2_000,
)


# ---- fakes -------------------------------------------------------------------------------


def _reply(data: Any = None, text: str = "") -> mnemo.LLMResponse:
    return mnemo.LLMResponse(text=text, data=data)


# Fixed valid answers to the API contract's task table. The subgoal never changes, so an episode
# stays one trajectory and append embeds only its first subgoal.
_FIXED: dict[str, mnemo.LLMResponse] = {
    "state": _reply(text=STATE_TEXT),
    "subgoal": _reply({"reasoning": "Same sub-task as before.", "subgoal": "fix the tests"}),
    "reward": _reply({"reward": 0.5}),
    "semantic": _reply({"facts": []}),
    "procedural": _reply({"instructions": []}),
    "return": _reply({"scores": []}),
    "merge_intent": _reply({"intent": "fix the failing tests"}),
}


class FastLLM:
    """An `mnemo.LLM` that answers every task at once (it never even yields)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        self.calls[request.task] += 1
        return _FIXED[request.task]


class FastEmbedder:
    """An `mnemo.Embedder` returning the same unit vector for every text, at once."""

    def __init__(self, dim: int = DIM) -> None:
        self.dim = dim
        self._unit = np.full(dim, 1.0 / math.sqrt(dim), dtype=np.float32)

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return np.tile(self._unit, (len(texts), 1))


CONCEPTS = ("sqlite", "wal", "turnstile", "session queue", "pytest", "anyio")


class TopicLLM:
    """An `mnemo.LLM` whose subgoal is the first word of the observation ("topic3 step 1" ->
    "topic3"), so trajectories split where the topic changes. "semantic" answers `facts`
    facts (2 concepts each from `CONCEPTS`), "procedural" `instructions` instructions (each
    with its own intent), "return" scores them all. Each call first sleeps `latency` seconds
    (settable between phases; 0 answers at once)."""

    def __init__(self, *, facts: int, instructions: int, latency: float = 0.0) -> None:
        self.facts, self.instructions, self.latency = facts, instructions, latency
        self.calls: Counter[str] = Counter()

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        self.calls[request.task] += 1
        if self.latency > 0:
            await anyio.sleep(self.latency)
        return self._answer(request.task, task_inputs(request))

    def _answer(self, task: str, inputs: dict[str, Any]) -> mnemo.LLMResponse:
        if task == "subgoal":
            topic = str(inputs["observation"]).split()[0]
            return _reply({"reasoning": f"Working on {topic}.", "subgoal": topic})
        if task == "semantic":
            subgoal = inputs["subgoal"]
            return _reply({"facts": [
                {
                    "proposition": f"In {subgoal}, observation {i} showed that the build passes.",
                    "concepts": [CONCEPTS[i % len(CONCEPTS)], CONCEPTS[(i + 1) % len(CONCEPTS)]],
                    "confidence": 0.9,
                }
                for i in range(self.facts)
            ]})
        if task == "procedural":
            subgoal = inputs["subgoal"]
            return _reply({"instructions": [
                {
                    "intent": f"handle {subgoal} case {i}",
                    "condition": f"when {subgoal} case {i} appears",
                    "instruction": f"For {subgoal}, apply remedy {i} and rerun the tests.",
                    "expected_outcome": "the tests pass",
                }
                for i in range(self.instructions)
            ]})
        if task == "return":
            return _reply({"scores": [
                {"index": item["index"], "return_score": 7} for item in inputs["instructions"]
            ]})
        if task == "merge_intent":
            return _reply({"intent": inputs["existing"]})
        return _FIXED[task]


class TopicEmbedder:
    """An `mnemo.Embedder` where equal texts get equal vectors and different texts nearly
    orthogonal ones (a Gaussian vector seeded by the text's hash: |cos| is about 0.05 at 384
    dimensions), so subgoals split trajectories and intents never merge by accident."""

    def __init__(self, dim: int = DIM) -> None:
        self.dim = dim
        self._cache: dict[str, npt.NDArray[np.float32]] = {}

    def vector(self, text: str) -> npt.NDArray[np.float32]:
        found = self._cache.get(text)
        if found is None:
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
            raw = np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
            found = self._cache[text] = raw / np.linalg.norm(raw)
        return found

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return np.stack([self.vector(t) for t in texts])


class Arrivals:
    """An `on_event` callback: sets a session's anyio.Event when it reaches ready or failed."""

    def __init__(self) -> None:
        self._waiting: dict[str, anyio.Event] = {}
        self.reached: dict[str, str] = {}

    def expect(self, session_id: str) -> anyio.Event:
        event = self._waiting[session_id] = anyio.Event()
        return event

    def __call__(self, event: mnemo.Event) -> None:
        to = event.data.get("to")
        if event.kind != "transition" or to not in (mnemo.State.READY, mnemo.State.FAILED):
            return
        waiter = self._waiting.pop(event.session_id or "", None)
        if waiter is not None:
            self.reached[event.session_id or ""] = str(to)
            waiter.set()


async def close_until_ready(mem: mnemo.Memory, arrivals: Arrivals, session_id: str) -> float:
    """Closes the session and returns the seconds until its transition to ready."""
    ready = arrivals.expect(session_id)
    start = time.perf_counter()
    await mem.close(session_id)
    with anyio.fail_after(WAIT_LIMIT_S):
        await ready.wait()
    elapsed = time.perf_counter() - start
    if arrivals.reached.get(session_id) != mnemo.State.READY:
        raise RuntimeError(f"{session_id} ended {arrivals.reached.get(session_id)}, not ready")
    return elapsed


# ---- schema copied from a mnemo file -----------------------------------------------------


async def make_mnemo_file(path: Path) -> None:
    async with mnemo.Memory(path, llm=FastLLM(), embedder=FastEmbedder()):
        pass


def table_ddl(path: Path, tables: Sequence[str]) -> list[str]:
    """The CREATE statements of `tables` (with their indexes and triggers) in creation order.

    Read from a file mnemo made, so the baselines use exactly mnemo's definitions.
    """
    marks = ",".join("?" * len(tables))
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            f"SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND tbl_name IN ({marks})"
            " ORDER BY rowid",
            list(tables),
        ).fetchall()
    return [sql for (sql,) in rows]


def open_plain(path: Path, ddl: Sequence[str]) -> sqlite3.Connection:
    """A stdlib connection configured as mnemo's (WAL, NORMAL, foreign keys) with `ddl`."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    for statement in ddl:
        conn.execute(statement)
    return conn


# ---- 1. append latency -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendLevel:
    sessions: int
    steps_each: int
    latency: Latency
    per_second: float
    idle: int = 0
    connections: _pg_rows.Connections | None = None

    @property
    def label(self) -> str:
        plural = "" if self.sessions == 1 else "s"
        text = f"{self.sessions} session{plural} x {self.steps_each:,} steps"
        return f"{text}, {self.idle:,} idle sessions alive" if self.idle else text


async def _drive(mem: mnemo.Memory, session_id: str, steps: int, samples: list[int]) -> None:
    for j in range(steps):
        observation, action = OBSERVATION.format(j=j), ACTION.format(j=j)
        start = time.perf_counter_ns()
        await mem.append(session_id, observation, action)
        samples.append(time.perf_counter_ns() - start)


async def append_level(store: str | Path, sessions: int, steps_each: int, warmup: int,
                       idle: int = 0, *, watch: bool = False) -> AppendLevel:
    """Times every append of `sessions` sessions appending `steps_each` steps concurrently,
    beside `idle` sessions that appended one step each and stay collecting. With `watch` (a
    PostgreSQL store), also samples the database's connections meanwhile."""
    counts: list[int] = []
    at_end = 0
    async with mnemo.Memory(store, llm=FastLLM(), embedder=FastEmbedder()) as mem:
        await mem.open_repo("bench")
        await _start_idle(mem, "bench", idle)
        warm = await mem.start_session("warm up", repo="bench")
        await _drive(mem, warm, warmup, [])
        ids = [await mem.start_session(f"goal {i}", repo="bench") for i in range(sessions)]
        samples: list[int] = []
        gc.collect()
        async with anyio.create_task_group() as watcher:
            done = anyio.Event()
            if watch:
                watcher.start_soon(_pg_rows.watch_connections, str(store), done, counts)
            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for session_id in ids:
                    tg.start_soon(_drive, mem, session_id, steps_each, samples)
            wall = time.perf_counter() - start
            done.set()
        if watch:
            at_end = await _pg_rows.count_connections_at(str(store))
    connections = None
    if watch:
        after, gone_s = await _pg_rows.connections_gone(str(store))
        connections = _pg_rows.Connections(len(counts), max(counts), at_end, after, gone_s)
    return AppendLevel(sessions, steps_each, Latency.of(samples), len(samples) / wall, idle,
                       connections)


async def _start_idle(mem: mnemo.Memory, repo: str, count: int) -> None:
    for i in range(count):
        session_id = await mem.start_session(f"idle goal {i}", repo=repo)
        await mem.append(session_id, OBSERVATION.format(j=i), ACTION.format(j=i))


def step_rows(count: int) -> list[tuple[Any, ...]]:
    """Rows shaped like the ones mnemo writes to `steps` (same texts, 384-float blob)."""
    episode = f"episode_{uuid.uuid4().hex}"
    session = f"session_{uuid.uuid4().hex}"
    trajectory = f"trajectory_{uuid.uuid4().hex}"
    blob = np.full(DIM, 1.0 / math.sqrt(DIM), dtype=np.float32).tobytes()
    now = datetime.now(UTC).isoformat()
    return [
        (f"{episode}:{i}", session, episode, i, trajectory, OBSERVATION.format(j=i),
         ACTION.format(j=i), STATE_TEXT, "fix the tests", blob, None, None, now)
        for i in range(count)
    ]


INSERT_STEP = (
    "INSERT INTO steps(id, session_id, episode_id, idx, trajectory_id, observation, action,"
    " state_summary, subgoal, subgoal_vec, reward, metadata, recorded_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def bare_inserts(path: Path, ddl: Sequence[str], count: int, warmup: int,
                 *, with_reward_update: bool) -> Latency:
    """One BEGIN/INSERT/COMMIT per row (plus, optionally, the previous step's reward update,
    which is what mnemo's append writes) into mnemo's `steps` definition."""
    conn = open_plain(path, ddl)
    rows = step_rows(warmup + count)
    episode, session = rows[0][2], rows[0][1]
    conn.execute(
        "INSERT INTO repos(name, config, dim, embedder, created_at)"
        " VALUES ('bench', '{}', ?, 'FastEmbedder', '')", (DIM,),
    )
    conn.execute(
        "INSERT INTO sessions(id, repo, state, config, episode_id, created_at, updated_at)"
        " VALUES (?, 'bench', 'collecting', '{}', ?, '', '')", (session, episode),
    )
    conn.execute(
        "INSERT INTO episodes(id, session_id, goal, status, started_at)"
        " VALUES (?, ?, 'goal', 'open', '')", (episode, session),
    )
    samples: list[int] = []
    for i, row in enumerate(rows):
        start = time.perf_counter_ns()
        conn.execute("BEGIN")
        conn.execute(INSERT_STEP, row)
        if with_reward_update and i:
            conn.execute("UPDATE steps SET reward = ? WHERE id = ?", (0.5, rows[i - 1][0]))
        conn.execute("COMMIT")
        if i >= warmup:
            samples.append(time.perf_counter_ns() - start)
    conn.close()
    return Latency.of(samples)


@dataclass(frozen=True, slots=True)
class AppendReport:
    backend: str
    levels: list[AppendLevel]
    bare: Latency
    bare_with_update: Latency

    @property
    def single(self) -> AppendLevel:
        return self.levels[0]

    @property
    def vs_bare(self) -> float:
        return self.single.latency.p50_us / self.bare.p50_us


async def bench_append(stores: Stores, backend: str, sizes: Sizes,
                       steps_ddl: list[str]) -> AppendReport:
    levels = []
    for sessions in sizes.concurrency:
        steps_each = max(sizes.appends_per_level // sessions, 1)
        console.log(f"append ({backend}): {sessions} session(s) x {steps_each} steps")
        levels.append(
            await append_level(await stores.fresh(backend, f"append-{sessions}"), sessions,
                               steps_each, sizes.warmup_appends)
        )
    idle = sizes.idle_beside_append
    console.log(f"append ({backend}): 1 session beside {idle:,} idle sessions")
    levels.append(
        await append_level(await stores.fresh(backend, "append-idle"), 1,
                           sizes.appends_per_level, sizes.warmup_appends, idle)
    )
    console.log(f"append ({backend}): bare inserts")
    count = sizes.appends_per_level
    if backend == SQLITE:
        bare = bare_inserts(stores.tmp / "bare.db", steps_ddl, count, sizes.warmup_appends,
                            with_reward_update=False)
        bare_update = bare_inserts(stores.tmp / "bare-update.db", steps_ddl, count,
                                   sizes.warmup_appends, with_reward_update=True)
    else:
        total = sizes.warmup_appends + count
        bare = await _pg_rows.bare_inserts(
            str(await stores.fresh(backend, "bare")), step_rows(total), sizes.warmup_appends,
            DIM, with_reward_update=False)
        bare_update = await _pg_rows.bare_inserts(
            str(await stores.fresh(backend, "bare-update")), step_rows(total),
            sizes.warmup_appends, DIM, with_reward_update=True)
    return AppendReport(backend, levels, bare, bare_update)


def append_table(reports: list[AppendReport]) -> Table:
    table = Table(title="1. Append latency (instant fake LLM and embedder)")
    for name in ("backend", "what", "appends", "p50 µs", "p90 µs", "p99 µs", "max µs",
                 "appends/s"):
        table.add_column(name, justify="left" if name in ("backend", "what") else "right")
    for report in reports:
        for level in report.levels:
            lat = level.latency
            table.add_row(
                report.backend, f"mem.append, {level.label}",
                f"{lat.count:,}", us(lat.p50_us), us(lat.p90_us), us(lat.p99_us),
                us(lat.max_us), f"{level.per_second:,.0f}",
            )
        for label, lat in (
            (f"bare {BARE_DRIVER[report.backend]} insert of the steps row", report.bare),
            ("bare insert + previous step's reward update", report.bare_with_update),
        ):
            table.add_row(
                report.backend, label, f"{lat.count:,}", us(lat.p50_us), us(lat.p90_us),
                us(lat.p99_us), us(lat.max_us), f"{1e6 / lat.mean_us:,.0f}",
            )
    verdicts = "; ".join(
        f"{r.backend}: append p50 (1 session) / bare insert p50 = {ratio(r.vs_bare)}, goal "
        f"{verdict(r.single.latency.p50_us <= APPEND_GOAL_US)}" for r in reports
    )
    table.caption = (
        f"{verdicts}. Goal: p50 ≤ {APPEND_GOAL_US:.0f} µs (set as about 15x a bare SQLite "
        f"insert). For scale, mem0's storage-only add is "
        f"{MEM0_ADD_MS} ms at 100 memories. With 10 and 100 sessions, latency includes "
        "waiting for the other sessions' appends (one event loop). Bare rows: "
        "stdlib sqlite3, WAL, synchronous=NORMAL, one BEGIN/COMMIT per row; on PostgreSQL "
        "psycopg on one connection, one transaction per row (the reward update "
        "is the other half of what an append writes)."
    )
    return table


BARE_DRIVER = {SQLITE: "sqlite3", POSTGRES: "psycopg"}


# ---- 2. close-to-ready ---------------------------------------------------------------------


def extraction_dag(trajectories: int, instructions: int = 2) -> dict[str, tuple[str, ...]]:
    """The LLM calls a close makes, each with the calls it waits for (extraction/pipeline.py):
    the last step's reward and every trajectory's semantic and procedural at once; then, for a
    trajectory with several instructions, its return scoring, which needs its procedural (and,
    for the last trajectory, that reward)."""
    dag: dict[str, tuple[str, ...]] = {"reward(last step)": ()}
    for t in range(trajectories):
        last = t == trajectories - 1
        dag[f"semantic[{t}]"] = ()
        dag[f"procedural[{t}]"] = ()
        if instructions > 1:
            needs = (f"semantic[{t}]", f"procedural[{t}]")
            dag[f"return[{t}]"] = (*needs, "reward(last step)") if last else needs
    return dag


def longest_chain(dag: dict[str, tuple[str, ...]]) -> int:
    """The number of calls on the longest dependency chain."""
    depth: dict[str, int] = {}

    def of(call: str) -> int:
        if call not in depth:
            depth[call] = 1 + max((of(d) for d in dag[call]), default=0)
        return depth[call]

    return max(of(call) for call in dag)


@dataclass(frozen=True, slots=True)
class ReadyRow:
    backend: str
    trajectories: int
    walls_s: list[float]
    chain: int
    calls_expected: int
    calls_seen: int

    @property
    def critical_s(self) -> float:
        return self.chain * LLM_LATENCY_S

    @property
    def wall_s(self) -> float:
        return median(self.walls_s)

    @property
    def vs_critical(self) -> float:
        return self.wall_s / self.critical_s


async def bench_ready(stores: Stores, backend: str, sizes: Sizes) -> list[ReadyRow]:
    """Appends at zero latency, then closes at `LLM_LATENCY_S` per call."""
    llm = TopicLLM(facts=2, instructions=2)
    arrivals = Arrivals()
    rows: list[ReadyRow] = []
    async with mnemo.Memory(await stores.fresh(backend, "ready"), llm=llm,
                            embedder=TopicEmbedder(), on_event=arrivals) as mem:
        # 64 slots: a 16-trajectory close has 1 + 2 x 16 calls in flight at once, so the
        # limiter (default 16) is not what is measured.
        await mem.open_repo("ready", config=mnemo.Config(llm_concurrency=64))
        for trajectories in sizes.ready_trajectories:
            console.log(f"close-to-ready ({backend}): {trajectories} trajectories x "
                        f"{sizes.ready_repeats}")
            walls: list[float] = []
            calls = 0
            for _ in range(sizes.ready_repeats):
                llm.latency = 0.0
                session_id = await mem.start_session("ship the release", repo="ready")
                seen: set[str] = set()
                for k in range(trajectories):
                    for j in range(2):
                        info = await mem.append(session_id, f"topic{k} step {j}", f"act {k}.{j}")
                        seen.add(info.trajectory_id)
                if len(seen) != trajectories:
                    raise RuntimeError(f"expected {trajectories} trajectories, got {len(seen)}")
                llm.latency = LLM_LATENCY_S
                llm.calls.clear()
                walls.append(await close_until_ready(mem, arrivals, session_id))
                calls = sum(llm.calls.values())
                await mem.discard(session_id)
                await mem.end_session(session_id)
            dag = extraction_dag(trajectories)
            rows.append(ReadyRow(backend, trajectories, walls, longest_chain(dag), len(dag),
                                 calls))
    return rows


def ready_table(rows: list[ReadyRow]) -> Table:
    table = Table(title=f"2. Close-to-ready ({LLM_LATENCY_S * 1000:.0f} ms per LLM call)")
    for name in ("backend", "trajectories", "LLM calls (seen/expected)",
                 "calls on critical path", "critical path ms", "median ms", "min-max ms",
                 "overhead ms", "x critical", "goal"):
        table.add_column(name, justify="left" if name == "backend" else "right")
    for row in rows:
        table.add_row(
            row.backend, str(row.trajectories), f"{row.calls_seen}/{row.calls_expected}",
            str(row.chain),
            ms(row.critical_s), ms(row.wall_s),
            f"{ms(min(row.walls_s))}-{ms(max(row.walls_s))}",
            ms(row.wall_s - row.critical_s), ratio(row.vs_critical),
            verdict(row.vs_critical <= READY_GOAL),
        )
    table.caption = (
        "critical path = the last step's reward ∥ semantic ∥ procedural, then the return "
        "scoring of each trajectory's instructions, x latency; goal ≤ "
        f"{READY_GOAL}x. Config(llm_concurrency=64) so the limiter is not the bottleneck; "
        "trajectories of 2 steps, 2 facts and 2 instructions each."
    )
    return table


# ---- 3. commit throughput ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GraphRows:
    nodes: list[tuple[Any, ...]]
    vectors: list[tuple[Any, ...]]
    links: list[tuple[Any, ...]]


def graph_rows(path: Path, repo: str) -> GraphRows:
    """The rows mnemo wrote for `repo`, in insertion order."""
    with sqlite3.connect(path) as conn:
        return GraphRows(
            nodes=conn.execute(
                "SELECT id, repo, type, text, data, key, source_id, created_at FROM nodes"
                " WHERE repo = ? ORDER BY rowid", (repo,),
            ).fetchall(),
            # mnemo's vectors are keyed by the node's rowid (float16): written back by id.
            vectors=conn.execute(
                "SELECT v.vec, n.id FROM vectors v JOIN nodes n ON n.rowid = v.node"
                " WHERE n.repo = ? ORDER BY n.rowid", (repo,),
            ).fetchall(),
            links=conn.execute(
                "SELECT repo, src, dst, type FROM links WHERE repo = ?", (repo,)
            ).fetchall(),
        )


def raw_commit(path: Path, ddl: Sequence[str], rows: GraphRows, runs: int = 3) -> float:
    """Median seconds to executemany `rows` into a fresh file in one transaction."""
    return median(
        _raw_commit_once(path.with_name(f"{path.stem}-{run}.db"), ddl, rows)
        for run in range(runs)
    )


def _raw_commit_once(path: Path, ddl: Sequence[str], rows: GraphRows) -> float:
    conn = open_plain(path, ddl)
    gc.collect()
    start = time.perf_counter()
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO nodes(id, repo, type, text, data, key, source_id, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows.nodes,
    )
    conn.executemany("INSERT INTO vectors(node, vec) SELECT rowid, ? FROM nodes WHERE id = ?",
                     rows.vectors)
    conn.executemany("INSERT INTO links(repo, src, dst, type) VALUES (?, ?, ?, ?)", rows.links)
    conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed


@dataclass(frozen=True, slots=True)
class CommitRow:
    backend: str
    trajectories: int
    intents: int
    nodes: int
    links: int
    mnemo_s: float
    raw_s: float  # executemany
    copy_s: float | None = None  # binary COPY (PostgreSQL)
    bare_copy_s: float | None = None  # binary COPY without the HNSW index (PostgreSQL)

    @property
    def mnemo_rate(self) -> float:
        return self.nodes / self.mnemo_s

    @property
    def raw_rate(self) -> float:
        return self.nodes / self.raw_s

    @property
    def share(self) -> float:
        """mnemo's nodes/s as a fraction of raw executemany's."""
        return self.mnemo_rate / self.raw_rate

    @property
    def copy_rate(self) -> float | None:
        return None if self.copy_s is None else self.nodes / self.copy_s


async def ready_changeset(mem: mnemo.Memory, arrivals: Arrivals, repo: str,
                          trajectories: int) -> str:
    """A session of `repo` in state ready, holding one changeset of `trajectories`."""
    session_id = await mem.start_session("ship the release", repo=repo)
    for k in range(trajectories):
        for j in range(2):
            await mem.append(session_id, f"{repo}-topic{k} step {j}", f"act {k}.{j}")
    await close_until_ready(mem, arrivals, session_id)
    return session_id


async def bench_commit(stores: Stores, backend: str, sizes: Sizes, graph_ddl: list[str],
                       profile: cProfile.Profile | None = None) -> list[CommitRow]:
    """Commits one large changeset per repo (a fresh repo each time, so every commit starts
    from an empty graph), then replays the same rows raw."""
    llm = TopicLLM(facts=sizes.commit_facts, instructions=sizes.commit_instructions)
    arrivals = Arrivals()
    timed: list[tuple[str, int, int, float]] = []
    store = await stores.fresh(backend, "commit")
    async with mnemo.Memory(store, llm=llm, embedder=TopicEmbedder(), on_event=arrivals) as mem:
        for trajectories in sizes.commit_trajectories:
            for r in range(sizes.commit_repeats):
                repo = f"commit{trajectories}_{r}"
                await mem.open_repo(repo)
                session_id = await ready_changeset(mem, arrivals, repo, trajectories)
                console.log(f"commit ({backend}): {trajectories} trajectories, run {r + 1}")
                gc.collect()
                if profile is not None:
                    profile.enable()
                start = time.perf_counter()
                receipt = await mem.commit(session_id)
                elapsed = time.perf_counter() - start
                if profile is not None:
                    profile.disable()
                if receipt is None:
                    raise RuntimeError("commit of a ready session returned no receipt")
                timed.append((repo, trajectories, len(receipt.node_ids), elapsed))
    rows: list[CommitRow] = []
    for repo, trajectories, nodes, elapsed in timed:
        intents = trajectories * sizes.commit_instructions
        if backend == SQLITE:
            assert isinstance(store, Path)
            written = graph_rows(store, repo)
            links = len(written.links)
            raw = raw_commit(store.with_name(f"{store.stem}-raw-{repo}.db"), graph_ddl, written)
            copied = bare_copied = None
        else:
            read = await _pg_rows.graph_rows(str(store), repo)
            written = GraphRows(read.nodes, read.vectors, read.links)
            links = len(read.links)
            raw = await _pg_rows.raw_commit(stores, read, repo, DIM, "executemany")
            copied = await _pg_rows.raw_commit(stores, read, repo, DIM, "copy")
            bare_copied = await _pg_rows.raw_commit(stores, read, repo, DIM, "copy", hnsw=False)
        if len(written.nodes) != nodes:
            raise RuntimeError(f"{repo}: receipt has {nodes} nodes, the store "
                               f"{len(written.nodes)}")
        rows.append(CommitRow(backend, trajectories, intents, nodes, links, elapsed, raw,
                              copied, bare_copied))
    return rows


def commit_table(rows: list[CommitRow], sizes: Sizes) -> Table:
    table = Table(title="3. Commit throughput (one ready changeset, fresh repo)")
    for name in ("backend", "trajectories", "intents", "nodes", "links", "mnemo ms",
                 "mnemo nodes/s", "raw executemany ms", "raw nodes/s", "raw COPY nodes/s",
                 "COPY without HNSW nodes/s", "mnemo / raw", "mnemo / COPY", "goal"):
        table.add_column(name, justify="left" if name == "backend" else "right")
    for row in rows:
        copy_rate = row.copy_rate
        table.add_row(
            row.backend, str(row.trajectories), f"{row.intents:,}", f"{row.nodes:,}",
            f"{row.links:,}", ms(row.mnemo_s), f"{row.mnemo_rate:,.0f}", ms(row.raw_s),
            f"{row.raw_rate:,.0f}", "n/a" if copy_rate is None else f"{copy_rate:,.0f}",
            "n/a" if row.bare_copy_s is None else f"{row.nodes / row.bare_copy_s:,.0f}",
            ratio(row.share), "n/a" if copy_rate is None else ratio(row.mnemo_rate / copy_rate),
            verdict(row.share >= COMMIT_GOAL),
        )
    table.caption = (
        f"Per trajectory: 2 steps, {sizes.commit_facts} facts (2 concepts each from "
        f"{len(CONCEPTS)} shared tags), {sizes.commit_instructions} instructions with distinct "
        "intents. raw = the same node, vector and link rows (read back from mnemo's store) "
        "written into a fresh store with mnemo's schema in one transaction, median of 3: "
        "SQLite by stdlib executemany (FTS5 trigger, foreign keys on); PostgreSQL by psycopg "
        "executemany and by binary COPY (generated tsvector with its GIN index, foreign keys, "
        f"the repo's HNSW index already created, as mnemo's; once more without it, to show "
        f"what maintaining it costs). Goal ≥ {COMMIT_GOAL}x raw executemany."
    )
    return table


def median_share(rows: list[CommitRow], trajectories: int) -> CommitRow:
    """The run of that size with the median mnemo / raw share."""
    runs = sorted((r for r in rows if r.trajectories == trajectories), key=lambda r: r.share)
    if not runs:
        raise ValueError(f"no commit of {trajectories} trajectories")
    return runs[(len(runs) - 1) // 2]


# ---- 4. RSS per idle session ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IdleRss:
    backend: str
    sessions: int
    before: int
    after: int

    @property
    def per_session_kb(self) -> float:
        return (self.after - self.before) / self.sessions / 1024


async def _idle_sessions(backend: str, store: str, count: int) -> IdleRss:
    async with mnemo.Memory(store, llm=FastLLM(), embedder=FastEmbedder()) as mem:
        await mem.open_repo("idle")
        warm = await mem.start_session("warm up", repo="idle")
        await _drive(mem, warm, 20, [])
        gc.collect()
        before = rss_bytes()
        for i in range(count):
            session_id = await mem.start_session(f"idle goal {i}", repo="idle")
            await mem.append(session_id, OBSERVATION.format(j=i), ACTION.format(j=i))
        gc.collect()
        after = rss_bytes()
    return IdleRss(backend, count, before, after)


def idle_rss_in_child(backend: str, store: str, count: int) -> IdleRss:
    """Runs in a fresh process, so memory freed by the other sections cannot be reused."""
    return anyio.run(_idle_sessions, backend, store, count)


def bench_idle_rss(backend: str, store: str, sizes: Sizes) -> IdleRss:
    console.log(f"rss ({backend}): {sizes.idle_sessions:,} idle sessions, in a fresh process")
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(idle_rss_in_child, backend, store, sizes.idle_sessions).result()


def rss_table(results: list[IdleRss]) -> Table:
    table = Table(title="4. RSS per idle session")
    for name in ("backend", "sessions", "RSS before MiB", "RSS after MiB", "KB / session"):
        table.add_column(name, justify="left" if name == "backend" else "right")
    for result in results:
        table.add_row(
            result.backend, f"{result.sessions:,}", f"{result.before / 2**20:,.1f}",
            f"{result.after / 2**20:,.1f}", f"{result.per_session_kb:,.1f}",
        )
    table.caption = (
        "each session started, one step appended, left collecting; gc.collect() before each "
        "reading. Includes SQLite's page cache growth (at most about 2 MiB by default)."
    )
    return table


# ---- 5. connections under 100 concurrent sessions ------------------------------------------

CONNECTION_SESSIONS = 100


async def bench_connections(stores: Stores, backend: str, sizes: Sizes) -> AppendLevel:
    steps_each = max(sizes.appends_per_level // CONNECTION_SESSIONS, 1)
    console.log(f"connections ({backend}): {CONNECTION_SESSIONS} sessions x {steps_each} steps")
    return await append_level(await stores.fresh(backend, "connections"), CONNECTION_SESSIONS,
                              steps_each, sizes.warmup_appends, watch=backend == POSTGRES)


def _gone(seen: _pg_rows.Connections) -> str:
    return "not within 5 s" if seen.gone_after_s is None else f"{ms(seen.gone_after_s)} ms"


def connections_table(rows: list[tuple[str, AppendLevel]]) -> Table:
    table = Table(title=f"5. Connections under {CONNECTION_SESSIONS} concurrent sessions")
    for name in ("backend", "appends/s", "p50 µs", "p99 µs", "samples", "peak connections",
                 "at the end (open)", "right after close", "all gone after"):
        table.add_column(name, justify="left" if name == "backend" else "right")
    for backend, level in rows:
        lat, seen = level.latency, level.connections
        counts = ["n/a"] * 5 if seen is None else [
            f"{seen.samples:,}", str(seen.peak), str(seen.at_end), str(seen.after_close),
            _gone(seen)]
        table.add_row(backend, f"{level.per_second:,.0f}", us(lat.p50_us), us(lat.p99_us),
                      *counts)
    table.caption = (
        "one Memory, its sessions appending in one anyio task group; another connection "
        "counts the database's others in pg_stat_activity every 10 ms. SQLite: n/a (one file, "
        "no server connections)."
    )
    return table


# ---- profiles -------------------------------------------------------------------------------


def profile_listing(profile: cProfile.Profile, title: str, limit: int = 20) -> str:
    """The top functions by own time, then mnemo's own functions by cumulative time."""
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(r"/mnemo/", limit)
    by_mnemo = out.getvalue()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).strip_dirs().sort_stats("tottime").print_stats(limit)
    return f"{title}, by own time\n{out.getvalue()}\n{title}, mnemo by cumulative time\n{by_mnemo}"


async def profile_appends(path: Path, steps: int) -> cProfile.Profile:
    profile = cProfile.Profile()
    async with mnemo.Memory(path, llm=FastLLM(), embedder=FastEmbedder()) as mem:
        await mem.open_repo("bench")
        session_id = await mem.start_session("profile", repo="bench")
        await _drive(mem, session_id, 50, [])
        profile.enable()
        await _drive(mem, session_id, steps, [])
        profile.disable()
    return profile


# ---- the run ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BackendResults:
    """Every section's results for one backend."""

    backend: str
    append: AppendReport
    ready: list[ReadyRow]
    commit: list[CommitRow]
    idle: IdleRss
    connections: AppendLevel


def summary(results: list[BackendResults]) -> str:
    rows: list[list[str]] = []
    for result in results:
        rows += _summary_rows(result)
    return markdown_table(["backend", "measure", "result", "goal", "met"], rows)


def _summary_rows(result: BackendResults) -> list[list[str]]:
    b, append = result.backend, result.append
    single = append.single.latency
    rows = [
        [b, "append p50 / p99, 1 session", f"{us(single.p50_us)} / {us(single.p99_us)} µs",
         f"p50 ≤ {APPEND_GOAL_US:.0f} µs", verdict(single.p50_us <= APPEND_GOAL_US)],
    ]
    rows += [
        [b, f"append, {level.label}",
         f"{level.per_second:,.0f} appends/s; p50 {us(level.latency.p50_us)} µs, "
         f"p99 {us(level.latency.p99_us)} µs", "", ""]
        for level in append.levels
    ]
    rows.append([b, "bare durable insert of the steps row p50 / p99",
                 f"{us(append.bare.p50_us)} / {us(append.bare.p99_us)} µs; append p50 is "
                 f"{ratio(append.vs_bare)} it", "", ""])
    rows += [
        [b, f"close → ready, {row.trajectories} trajectories",
         f"{ms(row.wall_s)} ms (critical path {ms(row.critical_s)} ms, "
         f"{ratio(row.vs_critical)})", f"≤ {READY_GOAL}x", verdict(row.vs_critical <= READY_GOAL)]
        for row in result.ready
    ]
    for trajectories in dict.fromkeys(row.trajectories for row in result.commit):
        row = median_share(result.commit, trajectories)
        copy_rate = row.copy_rate
        versus_copy = "" if copy_rate is None or row.bare_copy_s is None else (
            f"; raw COPY {copy_rate:,.0f} ({ratio(row.mnemo_rate / copy_rate)}); raw COPY "
            f"without the HNSW index {row.nodes / row.bare_copy_s:,.0f}")
        rows.append([
            b, f"commit, {row.nodes:,} nodes + {row.links:,} links ({row.intents} intents)",
            f"{row.mnemo_rate:,.0f} nodes/s vs raw executemany {row.raw_rate:,.0f} "
            f"({ratio(row.share)}){versus_copy}",
            f"≥ {COMMIT_GOAL}x raw", verdict(row.share >= COMMIT_GOAL),
        ])
    idle = result.idle
    rows.append([b, f"RSS per idle session ({idle.sessions:,})",
                 f"{idle.per_session_kb:,.1f} KB", "", ""])
    level, seen = result.connections, result.connections.connections
    rows.append([
        b, f"connections, {CONNECTION_SESSIONS} sessions appending",
        "n/a" if seen is None else
        f"peak {seen.peak}, {seen.at_end} when the appends ended, {seen.after_close} right "
        f"after close, all gone after {_gone(seen)} ({level.per_second:,.0f} appends/s)", "", "",
    ])
    return rows


def parse_args() -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (about 10-20 s)")
    parser.add_argument("--profile", action="store_true",
                        help="also print cProfile listings of append and commit (SQLite)")
    parser.add_argument("--store", type=store_argument, default=None,
                        help="also run every case on PostgreSQL: a postgresql:// URL of a "
                             "server whose role may CREATE DATABASE, or 'embedded'")
    parser.add_argument("--processes", type=_procs.parse_processes, default=None,
                        metavar="N[,N...]",
                        help="instead of sections 1-5: N worker processes on one store, "
                             "for each N given (e.g. 1,2,4)")
    return parser.parse_args()


async def run_backend(stores: Stores, backend: str, sizes: Sizes, steps_ddl: list[str],
                      graph_ddl: list[str]) -> BackendResults:
    append = await bench_append(stores, backend, sizes, steps_ddl)
    console.print(append_table([append]))
    ready = await bench_ready(stores, backend, sizes)
    console.print(ready_table(ready))
    commit = await bench_commit(stores, backend, sizes, graph_ddl)
    console.print(commit_table(commit, sizes))
    idle = await anyio.to_thread.run_sync(
        bench_idle_rss, backend, str(await stores.fresh(backend, "idle")), sizes)
    console.print(rss_table([idle]))
    connections = await bench_connections(stores, backend, sizes)
    return BackendResults(backend, append, ready, commit, idle, connections)


async def run(sizes: Sizes, profile: bool, store: str | None) -> None:
    async with open_stores(store, "mnemo-bench-") as stores:
        tmp = stores.tmp
        facts = await stores.facts()
        if facts:
            console.print(facts_table(facts, title="PostgreSQL"))
        await make_mnemo_file(tmp / "schema.db")
        steps_ddl = table_ddl(tmp / "schema.db", ["repos", "sessions", "episodes", "steps"])
        graph_ddl = table_ddl(tmp / "schema.db", ["nodes", "links", "vectors", "nodes_fts",
                                                      "lexical_repos", "lexical_log"])

        results = [await run_backend(stores, backend, sizes, steps_ddl, graph_ddl)
                   for backend in stores.backends]
        console.rule("All backends")
        console.print(append_table([r.append for r in results]))
        console.print(ready_table([row for r in results for row in r.ready]))
        console.print(commit_table([row for r in results for row in r.commit], sizes))
        console.print(rss_table([r.idle for r in results]))
        console.print(connections_table([(r.backend, r.connections) for r in results]))

        if profile:
            appends = await profile_appends(tmp / "profile-append.db", 2_000)
            console.print(profile_listing(appends, "cProfile: append, 2,000 steps"),
                          markup=False, highlight=False)
            committed = cProfile.Profile()
            once = dataclasses.replace(
                sizes, commit_repeats=1, commit_trajectories=sizes.commit_trajectories[-1:]
            )
            await bench_commit(stores, SQLITE, once, graph_ddl, profile=committed)
            console.print(profile_listing(committed, "cProfile: commit"),
                          markup=False, highlight=False)

    console.rule("Summary (Markdown, for BENCHMARKS.md)")
    console.print(summary(results), markup=False, highlight=False, soft_wrap=True)


async def run_processes(counts: tuple[int, ...], sizes: _procs.ProcSizes,
                        store: str | None) -> None:
    async with open_stores(store, "mnemo-bench-procs-") as stores:
        facts = await stores.facts()
        if facts:
            console.print(facts_table(facts, title="PostgreSQL"))
        rows: list[_procs.ProcRow] = []
        for backend in stores.backends:
            found = await _procs.bench_processes(stores, backend, counts, sizes, FastLLM,
                                                 FastEmbedder, console.log)
            console.print(_procs.procs_table(found, sizes))
            rows += found
    console.rule("All backends")
    console.print(_procs.procs_table(rows, sizes))
    console.rule("Summary (Markdown, for BENCHMARKS.md)")
    console.print(_procs.procs_markdown(rows), markup=False, highlight=False, soft_wrap=True)


def main() -> None:
    args = parse_args()
    sizes = QUICK if args.quick else FULL
    console.print(facts_table({**machine_facts(), "anyio backend": "asyncio",
                               "sizes": "quick" if args.quick else "full"}))
    started = time.perf_counter()
    if args.processes is not None:
        procs = _procs.QUICK_PROCS if args.quick else _procs.FULL_PROCS
        anyio.run(run_processes, args.processes, procs, args.store)
    else:
        anyio.run(run, sizes, args.profile, args.store)
    console.print(f"[dim]total {time.perf_counter() - started:.1f} s[/]")


if __name__ == "__main__":
    main()
