"""Recall while writes keep coming: does a search's cost stay flat as changes pile up?

A store of `--base` one-sentence memories (`scripts/bench_mem0.py`'s generator; the offline
pipeline keeps each as about five nodes) is ingested and left to settle; then `--writes`
rounds each ingest one more sentence and recall once at once, so the lexical index never
sees the quiet it commits after. Printed: the ingest's seconds, recall p50 after the quiet,
and per block of 100 rounds recall p50 and max and the hop-0 stage's p50 (where the lexical
search is), with the instant `HashEmbedder` so that the store's side is what is timed.

Run: `.venv/bin/python scripts/bench_steady_writes.py [--base 2000] [--writes 400] [--store
URL]` (default: a new SQLite file; a `postgresql://` URL names an empty database); for a
before/after, run it with `PYTHONPATH=<a copy of mnemo/ at the other commit>` in turn.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from statistics import median

import anyio
from _bench import git_head, show_table
from bench_mem0 import DIM, sentences
from rich.console import Console

import mnemo

BLOCK = 100


def memory_of(text: str) -> mnemo.Trajectory:
    return mnemo.Trajectory(goal=text, steps=[mnemo.Step(observation=text, action="")])


async def run(base: int, writes: int, store: str | None) -> tuple[float, float, list[list[str]]]:
    texts, asks = sentences(base + writes)
    with tempfile.TemporaryDirectory() as folder:
        where = store or Path(folder) / "m.db"
        async with mnemo.Memory(where, embedder=mnemo.HashEmbedder(DIM)) as mem:
            await mem.open_repo("r")
            started = time.perf_counter()
            for i, text in enumerate(texts[:base]):
                await mem.ingest("r", memory_of(text), source_id=f"s{i}")
            ingest = time.perf_counter() - started
            await mem.recall("r", asks[0], k=10)
            await mem._graph.settle("r")  # the index committed: the quiet baseline
            quiet = []
            for query in asks[:BLOCK]:
                started = time.perf_counter()
                await mem.recall("r", query, k=10)
                quiet.append((time.perf_counter() - started) * 1000)
            blocks: dict[int, list[tuple[float, float]]] = {}
            for j in range(writes):
                await mem.ingest("r", memory_of(texts[base + j]), source_id=f"s{base + j}")
                started = time.perf_counter()
                result = await mem.recall("r", asks[j % base], k=10)
                took = (time.perf_counter() - started) * 1000
                blocks.setdefault(j // BLOCK, []).append((took, result.trace["hop0"] * 1000))
    rows = [
        [f"{b * BLOCK}-{b * BLOCK + len(v) - 1}", f"{median(t for t, _ in v):.2f}",
         f"{max(t for t, _ in v):.1f}", f"{median(h for _, h in v):.2f}"]
        for b, v in blocks.items()
    ]
    return ingest, median(quiet), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=int, default=2000, help="memories before (2000)")
    parser.add_argument("--writes", type=int, default=400, help="write+recall rounds (400)")
    parser.add_argument("--store", default=None, help="a postgresql:// URL (a SQLite file)")
    args = parser.parse_args()
    ingest, quiet, rows = anyio.run(run, args.base, args.writes, args.store)
    console = Console(width=120)
    backend = "postgresql" if args.store else "sqlite"
    console.print(f"code {git_head()}, {backend}, {args.base} memories ingested in {ingest:.1f} s; "
                  f"recall p50 after the quiet {quiet:.2f} ms")
    headers = ["rounds (ingest, then recall)", "recall p50 ms", "recall max ms", "hop0 p50 ms"]
    show_table(console, "recall while writes keep coming", headers, rows)


if __name__ == "__main__":
    main()
