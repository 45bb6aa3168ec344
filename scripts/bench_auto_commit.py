"""An auto-commit session's boundaries and close, timed (with step claims).

Each session appends three steps on each of three topics (two trajectory boundaries, so two
background commits of the finished trajectory), then `close_and_commit` until it is idle. The
offline LLM and the hashing embedder answer at once, so what is timed is mnemo's own work and
its store: the background commits' claims, the close's claim, its extraction and its commit.
One Memory on a fresh SQLite file (and, with `--store embedded` or a PostgreSQL URL, on a
fresh PostgreSQL database), sessions one after another.

Run: `.venv/bin/python scripts/bench_auto_commit.py [--sessions 40] [--store embedded]`, or with
`PYTHONPATH=<a copy of another commit>` to compare codes (the scripts honour it).
"""

from __future__ import annotations

import argparse
import sys
import time
from statistics import median, quantiles

import anyio
from _bench import facts_table, machine_facts, markdown_table
from _stores import open_stores, store_argument
from rich.console import Console

import mnemo

REPO = "bench"
TOPICS = (
    ("open the kitchen window", "lift the latch"),
    ("repair the garden fence", "hammer the post"),
    ("sort the library shelves", "move the atlas"),
)
console = Console(width=None if sys.stdout.isatty() else 120)


async def run_sessions(store: str, sessions: int) -> dict[str, list[float]]:
    config = mnemo.Config(auto_commit=True, flush_timeout=None, session_timeout=None)
    timings: dict[str, list[float]] = {"append": [], "boundary append": [], "close": [],
                                       "session": []}
    async with mnemo.Memory(store, llm=mnemo.OfflineLLM(),
                            embedder=mnemo.HashEmbedder(384)) as mem:
        await mem.open_repo(REPO, config=config)
        for n in range(sessions + 2):  # the first two warm up
            began = time.perf_counter()
            sid = await mem.start_session(f"tidy the house {n}", repo=REPO)
            for topic, (observation, action) in enumerate(TOPICS):
                for i in range(3):
                    # The offline LLM starts a new subgoal (a boundary) at a topic shift.
                    shift = "Now let's " if topic and not i else ""
                    started = time.perf_counter()
                    info = await mem.append(sid, f"{shift}{observation} {n} {i}",
                                            f"{action} {i}")
                    took = (time.perf_counter() - started) * 1000
                    if n >= 2:
                        key = "boundary append" if info.boundary_detected else "append"
                        timings[key].append(took)
            started = time.perf_counter()
            await mem.close_and_commit(sid)
            if n >= 2:
                timings["close"].append((time.perf_counter() - started) * 1000)
                timings["session"].append((time.perf_counter() - began) * 1000)
    return timings


async def run(sessions: int, store: str | None) -> None:
    rows: list[list[str]] = []
    facts = machine_facts()
    facts["argv"] = " ".join(sys.argv)
    async with open_stores(store, "mnemo-bench-auto-") as stores:
        facts.update(await stores.facts())
        for backend in stores.backends:
            timings = await run_sessions(str(await stores.fresh(backend, "auto")), sessions)
            for stage, samples in timings.items():
                p95 = quantiles(samples, n=20)[-1] if len(samples) > 1 else samples[0]
                rows.append([backend, stage, str(len(samples)), f"{median(samples):.2f}",
                             f"{p95:.2f}"])
    console.print(facts_table(facts))
    console.print(markdown_table(["backend", "stage", "n", "p50 ms", "p95 ms"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--store", type=store_argument, default=None,
                        help="also PostgreSQL: 'embedded' (started here) or a URL")
    args = parser.parse_args()
    anyio.run(run, args.sessions, args.store)


if __name__ == "__main__":
    main()
