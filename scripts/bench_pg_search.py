"""PostgreSQL message search: `search_messages` p50 / p90 on a fresh server, one code after
another (A/B), each in its own process on its own database.

    .venv/bin/python scripts/bench_pg_search.py [--threads 50] [--rounds 2] [CODE_DIR ...]

Each CODE_DIR is a directory holding a `mnemo` package (e.g. `git archive REV mnemo | tar -x
-C DIR`); none means this checkout. Each run fills THREADS threads of 100 messages of 3-30
words from a 23-word vocabulary (so the query words match a large share of the messages,
the search's worst case), then times 60 three-word searches (limit 5) after one warm-up, and
as many leaving out one thread's viewport (`exclude_viewport_of`, a viewport of 2,000 tokens
laid out first). Then the agent loop's writes: 20 new threads, each saved 20 times with two
more messages (a user's and an assistant's), p50 of those 400 saves.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]

CHILD = r'''
import asyncio, json, random, sys, time
sys.path.insert(0, sys.argv[1])
import mnemo
WORDS = ("nginx restart login deploy cache invoice total server kubernetes upgrade backup"
         " database lunch weather meeting budget report python error timeout").split()
async def main(url, threads):
    rng = random.Random(1)
    async with mnemo.Memory(url, embedder=mnemo.HashEmbedder(64)) as mem:
        conv = mem.conversation()
        for t in range(threads):
            await conv.save(f"t{t}", [{"role": "user", "content": " ".join(
                rng.choice(WORDS + ["the", "a", "is"]) for _ in range(rng.randint(3, 30)))}
                for _ in range(100)])
        queries = [" ".join(rng.sample(WORDS, 3)) for _ in range(60)]
        await mem.search_messages(queries[0])
        await mem.viewport("t0", token_budget=2000)
        ms, excluding, saves = [], [], []
        for query in queries:
            start = time.perf_counter()
            await mem.search_messages(query, limit=5)
            middle = time.perf_counter()
            await mem.search_messages(query, limit=5, exclude_viewport_of="t0")
            ms.append((middle - start) * 1e3)
            excluding.append((time.perf_counter() - middle) * 1e3)
        for t in range(20):
            history = []
            for turn in range(20):
                history += [{"role": "user", "content": f"question {turn} of thread {t}"},
                            {"role": "assistant", "content": f"answer {turn} of thread {t}"}]
                start = time.perf_counter()
                await conv.save(f"loop{t}", history)
                saves.append((time.perf_counter() - start) * 1e3)
        for times in (ms, excluding, saves):
            times.sort()
        print(json.dumps([ms[len(ms) // 2], ms[int(len(ms) * 0.9)],
                          excluding[len(excluding) // 2], saves[len(saves) // 2]]))
asyncio.run(main(sys.argv[2], int(sys.argv[3])))
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("codes", nargs="*", default=[str(ROOT)])
    parser.add_argument("--threads", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from psycopg import sql

    from tests.pg import start_server

    server = start_server(Path(tempfile.mkdtemp()) / "pg", fast=True)
    table = Table(title=f"search_messages on PostgreSQL, {args.threads * 100:,} messages")
    for column in ("round", "code", "search p50 ms", "search p90 ms",
                   "excluding a viewport p50 ms", "save p50 ms"):
        table.add_column(column)
    n = 0
    for round_ in range(1, args.rounds + 1):
        for code in args.codes:
            n += 1
            server.admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(f"b{n}")))
            try:
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, code, server.url(f"b{n}"), str(args.threads)],
                    capture_output=True, text=True, timeout=args.timeout, check=True,
                )
                times = json.loads(out.stdout.strip().splitlines()[-1])
                table.add_row(str(round_), code, *(f"{t:.2f}" for t in times))
            except subprocess.TimeoutExpired:
                table.add_row(str(round_), code, f"> {args.timeout / 61 * 1e3:.0f}", "-", "-",
                              "-")
    Console().print(table)


if __name__ == "__main__":
    main()
