"""PostgreSQL message search: `search_messages` p50 / p90 on a fresh server, one code after
another (A/B), each in its own process on its own database.

    .venv/bin/python scripts/bench_pg_search.py [--threads 50] [--rounds 2] [CODE_DIR ...]

Each CODE_DIR is a directory holding a `mnemo` package (e.g. `git archive REV mnemo | tar -x
-C DIR`); none means this checkout. Each run fills THREADS threads of 100 messages of 3-30
words from a 23-word vocabulary (so the query words match a large share of the messages,
the search's worst case), then times 60 three-word searches (limit 5) after one warm-up.
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
        ms = []
        for query in queries:
            start = time.perf_counter()
            await mem.search_messages(query, limit=5)
            ms.append((time.perf_counter() - start) * 1e3)
        ms.sort()
        print(json.dumps([ms[len(ms) // 2], ms[int(len(ms) * 0.9)]]))
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
    for column in ("round", "code", "p50 ms", "p90 ms"):
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
                p50, p90 = json.loads(out.stdout.strip().splitlines()[-1])
                table.add_row(str(round_), code, f"{p50:.2f}", f"{p90:.2f}")
            except subprocess.TimeoutExpired:
                table.add_row(str(round_), code, f"> {args.timeout / 61 * 1e3:.0f}", "-")
    Console().print(table)


if __name__ == "__main__":
    main()
