"""What a commit, and the recall after it, cost with the `mnemo` on the path: for A/B runs of
two versions of mnemo (the lexical index's log is written by triggers in every
commit, and the recall after a commit finds the index behind).

    PYTHONPATH=DIR .venv/bin/python scripts/bench_commit_ab.py STORE ROUNDS

DIR holds a `mnemo` package (a link to another checkout's `mnemo/`, or nothing for this one);
STORE is a SQLite path or a PostgreSQL URL of an empty database. Each round ingests one
trajectory of 5 steps (a commit of its steps, facts, tags and intents, with bench_sessions.py's
instant fake LLM and embedder), then recalls once. Prints the median ingest and the median
recall right after it, in milliseconds, and the nodes a round commits. Run the two versions in
turns, on fresh stores, and compare medians.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import anyio

import mnemo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sessions import FastEmbedder, FastLLM

WORDS = "kettle lantern harbour meadow copper violet quarry saddle timber orchard".split()


async def main(store: str, rounds: int) -> None:
    """Ingests and recalls in turns, then prints the medians."""
    ingest_ms, recall_ms = [], []
    async with mnemo.Memory(store, llm=FastLLM(), embedder=FastEmbedder()) as mem:
        await mem.open_repo("r")
        nodes = 0
        for n in range(rounds + 5):
            steps = [
                mnemo.Step(f"the {WORDS[(n + i) % 10]} near the {WORDS[(n * i) % 10]} {n}", "ok")
                for i in range(5)
            ]
            started = time.perf_counter()
            receipt = await mem.ingest("r", mnemo.Trajectory(f"goal {n}", steps),
                                       source_id=f"s{n}")
            ingested = time.perf_counter()
            await mem.recall("r", f"where is the {WORDS[n % 10]}", reinforce=False)
            done = time.perf_counter()
            nodes = len(receipt.node_ids)
            if n >= 5:  # the first rounds warm up
                ingest_ms.append((ingested - started) * 1000)
                recall_ms.append((done - ingested) * 1000)
    print(f"{mnemo.__file__} ingest p50={statistics.median(ingest_ms):.2f} ms"
          f" recall-after p50={statistics.median(recall_ms):.2f} ms nodes/round={nodes}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]))
