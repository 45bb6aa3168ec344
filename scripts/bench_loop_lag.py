"""How long work at the input limits keeps the event loop from running.

A task ticks every 10 ms while one operation runs; a tick's lag is how much later than 10 ms
it came. Each operation runs at the ceilings of its bounds (`Config` raised to them):

- ingest: 1,000 steps (`max_steps_per_ingest`'s ceiling) of 32,000 characters each
  (`max_text_chars`' default) that open alike, so the offline model keeps them one trajectory
  and each of its prompts holds all 32 MB;
- recall: a 32,000-character query of distinct words, k = 10,000 (`max_results`' ceiling),
  on the ingested graph; and a short query every step matches (its ranking at its largest);
- linked: `get_linked_nodes` of 1,000 of the ingest's node ids;
- save: `save` of 1,000 messages of 32,000 characters (`Recent` retrieval: no vectors);
- semantic: `Semantic(k=1000)`'s `load` with a query on that thread, which embeds its 1,000
  messages first.

Printed: operation x backend -> worst lag and p99 lag (ms), and the operation's seconds.
Run: `.venv/bin/python scripts/bench_loop_lag.py [--store embedded|postgresql://...]
[--embedder hash|minilm] [--count N]` (SQLite always; PostgreSQL with `--store`; `--count`
steps and messages, 1,000 unless told); for a before/after, run it with
`PYTHONPATH=<a checkout at the other commit>` in turn.
"""

from __future__ import annotations

import argparse
import random
import string
import time
from collections.abc import Awaitable, Callable

import anyio
import numpy as np
from _bench import facts_table, machine_facts, show_table
from _stores import open_stores, store_argument
from rich.console import Console

import mnemo

TICK = 0.01
CHARS = 32_000
# The offline model's work on the ingest's 32 MB takes about a minute of calls on a 2-core
# machine, at `extraction_timeout`'s default: the bench measures the loop, not that budget.
CONFIG = mnemo.Config(max_steps_per_ingest=1_000, max_results=10_000, extraction_timeout=600)


def words(count: int, seed: int) -> str:
    draw = random.Random(seed)
    return " ".join("".join(draw.choices(string.ascii_lowercase, k=7)) for _ in range(count))


def text(seed: int, opening: str = "") -> str:
    return (opening + words(CHARS // 8, seed))[: CHARS - 8]


async def lag_of(operation: Callable[[], Awaitable[object]]) -> tuple[float, float, float]:
    """The worst and p99 lag of a 10 ms ticker while `operation` runs, and its seconds."""
    gaps: list[float] = []

    async def tick() -> None:
        last = time.perf_counter()
        while True:
            await anyio.sleep(TICK)
            now = time.perf_counter()
            gaps.append(now - last - TICK)
            last = now

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        await anyio.sleep(2 * TICK)
        gaps.clear()
        started = time.perf_counter()
        await operation()
        took = time.perf_counter() - started
        tg.cancel_scope.cancel()
    lags = np.maximum(np.asarray(gaps or [0.0]), 0.0)
    return float(lags.max()), float(np.percentile(lags, 99)), took


async def run(store: str | None, embedder: str, count: int) -> list[list[str]]:
    opening = "The payment service deploy failed on the staging cluster again. "
    steps = [mnemo.Step(text(i, opening), words(8, -i)) for i in range(count)]
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": text(10_000 + i)}
                for i in range(count)]
    rows = []
    async with open_stores(store, "mnemo-lag-") as stores:
        for backend in stores.backends:
            where = await stores.fresh(backend, "lag")
            async with mnemo.Memory(where, embedder=mnemo.embedder_from_uri(embedder),
                                    config=CONFIG) as mem:
                for name, worst, p99, took in await measure(mem, steps, messages):
                    rows.append([name, backend, f"{worst * 1e3:,.0f}", f"{p99 * 1e3:,.0f}",
                                 f"{took:,.1f}"])
    return rows


async def measure(
    mem: mnemo.Memory, steps: list[mnemo.Step], messages: list[dict[str, str]]
) -> list[tuple[str, float, float, float]]:
    """Each operation's name, worst and p99 lag and seconds, on an empty `mem`."""
    query = text(99_999)
    await mem.open_repo("r")
    trajectory = mnemo.Trajectory("long steps", steps)
    worst, p99, took = await lag_of(lambda: mem.ingest("r", trajectory, source_id="long"))
    out = [(f"ingest {len(steps):,} steps", worst, p99, took)]
    node_ids = [n.id for n in await mem.get_nodes_by_type("r", [mnemo.NodeType.EPISODIC])]
    cases: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("recall k=10,000", lambda: mem.recall("r", query, k=10_000)),
        ("recall k=10,000, every step matching",
         lambda: mem.recall("r", "payment service deploy failed on the staging cluster",
                            k=10_000)),
        (f"get_linked_nodes {len(node_ids[:1_000]):,} ids",
         lambda: mem.get_linked_nodes("r", node_ids[:1_000])),
        (f"save {len(messages):,} messages", lambda: mem.conversation().save("t", messages)),
        ("Semantic(k=1000) load",
         lambda: mem.conversation(retrieval=mnemo.Semantic(k=1_000)).load("t", query=query)),
    ]
    for name, operation in cases:
        out.append((name, *await lag_of(operation)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", type=store_argument, default=None,
                        help="also PostgreSQL: 'embedded' or a postgresql:// URL")
    parser.add_argument("--embedder", default="hash", help="an embedder URI (hash)")
    parser.add_argument("--count", type=int, default=1_000, help="steps and messages (1,000)")
    args = parser.parse_args()
    console = Console(width=120)
    console.print(facts_table(machine_facts()))
    rows = anyio.run(run, args.store, args.embedder, args.count)
    show_table(console, f"event-loop lag, {TICK * 1e3:.0f} ms ticker",
               ["operation", "backend", "worst lag ms", "p99 lag ms", "seconds"], rows)


if __name__ == "__main__":
    main()
