"""Recall's own work at 100 memories, two code trees in turns: one long-lived process per tree
builds the same store (bench_mem0's sentences, offline pipeline, hashed vectors, no HTTP), then
the two run blocks of recalls alternately, so a change of the machine's load falls on both.

    .venv/bin/python scripts/bench_recall_ab.py OLD_TREE NEW_TREE [--blocks 120] [--size 25]

Prints each tree's stage medians, own work (the stages but the query's embedding), total p50,
main-thread CPU, and the median of the paired block ratios new/old with its quartiles."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics as st
import subprocess
import sys
import tempfile
import time
from pathlib import Path

Rows = list[tuple[float, float, dict[str, float]]]


async def serve(tree: str) -> None:
    """The worker: builds the store with `tree`'s mnemo, then answers each line N of stdin
    with N recalls' (total ms, main-thread CPU ms, stage ms) as one JSON line."""
    sys.path[:0] = [tree, f"{tree}/scripts"]
    from bench_mem0 import sentences  # type: ignore[import-not-found]

    import mnemo
    from mnemo.adapters.hashing import HashEmbedder

    texts, asks = sentences(100)
    with tempfile.TemporaryDirectory() as folder:
        async with mnemo.Memory(Path(folder) / "m.db", embedder=HashEmbedder(384)) as mem:
            await mem.open_repo("r")
            for i, text in enumerate(texts):
                await mem.ingest("r", mnemo.Trajectory(text, [mnemo.Step(text, "")]),
                                 source_id=f"s{i}")
            for query in asks[:20]:
                await mem.recall("r", query, k=10)
            print("READY", flush=True)
            at = 0
            loop = asyncio.get_running_loop()
            while line := await loop.run_in_executor(None, sys.stdin.readline):
                rows: Rows = []
                for _ in range(int(line)):
                    query, at = asks[at % len(asks)], at + 1
                    wall, cpu = time.perf_counter(), time.thread_time()
                    result = await mem.recall("r", query, k=10)
                    rows.append(((time.perf_counter() - wall) * 1000,
                                 (time.thread_time() - cpu) * 1000,
                                 {s: v * 1000 for s, v in result.trace.items()}))
                print(json.dumps(rows), flush=True)


def own(row: tuple[float, float, dict[str, float]]) -> float:
    return sum(v for stage, v in row[2].items() if stage != "embed")


def compare(old: str, new: str, blocks: int, size: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    workers = {tree: subprocess.Popen(
        [sys.executable, __file__, "--serve", tree], env=env, cwd=tempfile.gettempdir(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for tree in (old, new)}
    for worker in workers.values():
        assert worker.stdin is not None
        assert worker.stdout is not None
        if worker.stdout.readline().strip() != "READY":
            raise SystemExit("a worker did not start")
    rows: dict[str, Rows] = {old: [], new: []}
    medians: dict[str, list[float]] = {old: [], new: []}
    for block in range(blocks):
        for tree in (old, new) if block % 2 == 0 else (new, old):
            stdin, stdout = workers[tree].stdin, workers[tree].stdout
            assert stdin is not None
            assert stdout is not None
            stdin.write(f"{size}\n")
            stdin.flush()
            got: Rows = [tuple(r) for r in json.loads(stdout.readline())]  # type: ignore[misc]
            rows[tree] += got
            medians[tree].append(st.median(map(own, got)))
    for worker in workers.values():
        assert worker.stdin is not None
        worker.stdin.close()
        worker.wait()
    print(f"load average {os.getloadavg()[0]:.2f}; {blocks} blocks of {size} recalls a tree")
    print("| tree | own work ms (sum of stage medians) | total p50 ms | main-thread CPU ms |"
          " stage medians ms |")
    print("| --- | --- | --- | --- | --- |")
    for tree in (old, new):
        stages: dict[str, list[float]] = {}
        for row in rows[tree]:
            for stage, value in row[2].items():
                stages.setdefault(stage, []).append(value)
        middle = {s: st.median(v) for s, v in stages.items()}
        print(f"| {tree} | {sum(v for s, v in middle.items() if s != 'embed'):.3f}"
              f" | {st.median(r[0] for r in rows[tree]):.3f}"
              f" | {st.mean(r[1] for r in rows[tree]):.3f}"
              f" | {', '.join(f'{s} {v:.2f}' for s, v in middle.items() if v >= 0.01)} |")
    ratios = [b / a for a, b in zip(medians[old], medians[new], strict=True)]
    low, _, high = st.quantiles(ratios, n=4)
    print(f"paired block ratio new/old: median {st.median(ratios):.3f}"
          f" (quartiles {low:.3f}-{high:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("old", nargs="?")
    parser.add_argument("new", nargs="?")
    parser.add_argument("--blocks", type=int, default=120)
    parser.add_argument("--size", type=int, default=25)
    parser.add_argument("--serve", metavar="TREE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
    elif args.old and args.new:
        compare(args.old, args.new, args.blocks, args.size)
    else:
        parser.error("give the two trees")


if __name__ == "__main__":
    main()

