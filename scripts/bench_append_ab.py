"""Append latency of the `mnemo` on the path, for A/B runs of two versions of mnemo.

    PYTHONPATH=DIR .venv/bin/python scripts/bench_append_ab.py STORE N [async]

DIR holds a `mnemo` package (a link to another checkout's `mnemo/`, or nothing for this one);
STORE is a SQLite path or a PostgreSQL URL of an empty database. Prints the p50 and p99 in
microseconds of N appends to one session (after 50 to warm up), with bench_sessions.py's
instant fake LLM and embedder: mnemo's own cost per append. Run the two versions in turns, on
fresh stores, and compare medians (BENCHMARKS.md). With `async`, each append is an
`append_async` timed from the call to its callback (the async operation path).
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


async def main(store: str, n: int, mode: str = "sync") -> None:
    """Appends and prints the percentiles."""
    async with mnemo.Memory(store, llm=FastLLM(), embedder=FastEmbedder()) as mem:
        await mem.open_repo("r")
        sid = await mem.start_session("bench", repo="r")
        for i in range(50):
            await mem.append(sid, f"warm {i}", "a")
        samples = []
        for i in range(n):
            t = time.perf_counter()
            if mode == "async":
                called = anyio.Event()
                await mem.append_async(sid, f"obs {i}", "act", lambda _, done=called: done.set())
                await called.wait()
            else:
                await mem.append(sid, f"obs {i}", "act")
            samples.append((time.perf_counter() - t) * 1e6)
    samples.sort()
    p99 = samples[int(len(samples) * 0.99)]
    print(f"{mnemo.__file__} {mode} p50={statistics.median(samples):.0f} p99={p99:.0f}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), *sys.argv[3:4])
