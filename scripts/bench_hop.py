"""What it costs to run a durable one-row insert off the event loop.

The same INSERT (WAL, `synchronous=NORMAL`, autocommit) is timed four ways from an asyncio task:
inline on the loop thread (what appends once did, and what blocked the loop while
another writer held the lock), through mnemo's own connection thread
(`cpu.Worker`), through
`anyio.to_thread.run_sync` with a limiter of one, and through a one-thread
`ThreadPoolExecutor`. Each is the median of `--rounds` rounds of `--count`
inserts; the hop is the difference from inline.

Run: `.venv/bin/python scripts/bench_hop.py [--count N] [--rounds R]`.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median

import anyio
import anyio.to_thread
from _bench import markdown_table

from mnemo.cpu import Worker


def connect(directory: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(directory / "hop.db", check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE steps(id INTEGER PRIMARY KEY, observation TEXT)")
    return conn


async def timed(count: int, hop: Callable[[Callable[[], None]], Awaitable[None]],
                insert: Callable[[], None]) -> float:
    started = time.perf_counter()
    for _ in range(count):
        await hop(insert)
    return (time.perf_counter() - started) / count * 1e6


async def main(count: int, rounds: int) -> list[list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        conn = connect(Path(tmp))

        def insert() -> None:
            conn.execute("INSERT INTO steps(observation) VALUES (?)", ("walk north " * 10,))

        async def inline(fn: Callable[[], None]) -> None:
            fn()

        worker = Worker("bench")

        async def own_thread(fn: Callable[[], None]) -> None:
            await worker.call(fn)

        limiter = anyio.CapacityLimiter(1)

        async def anyio_thread(fn: Callable[[], None]) -> None:
            await anyio.to_thread.run_sync(fn, limiter=limiter)

        pool = ThreadPoolExecutor(1)

        async def executor(fn: Callable[[], None]) -> None:
            await asyncio.get_running_loop().run_in_executor(pool, fn)

        ways = {"inline on the loop": inline, "mnemo's connection thread": own_thread,
                "anyio.to_thread.run_sync": anyio_thread, "ThreadPoolExecutor(1)": executor}
        results: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(rounds):
            for name, hop in ways.items():
                results[name].append(await timed(count, hop, insert))
        worker.stop()
        pool.shutdown()
        conn.close()
    base = median(results["inline on the loop"])
    return [
        [name, f"{median(values):.1f}", f"{median(values) - base:+.1f}"]
        for name, values in results.items()
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = asyncio.run(main(args.count, args.rounds))
    print(markdown_table(["way", "µs per insert (median)", "hop vs inline µs"], rows))
