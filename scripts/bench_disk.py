"""Disk used per 1,000 remembered messages (issue 9, item 12).

Each message is remembered with one `mem.ingest` (a one-step trajectory), as an app that
remembers every chat message would, on the embedded defaults' storage (a SQLite file, WAL,
`synchronous=NORMAL`) with the offline LLM and the hashed embedder (no model to load; the
vectors are as large as MiniLM's, 384 floats). While ingesting, the WAL's size is sampled after
every message; at the end the database file, the WAL, and the bytes of the messages themselves
are reported per 1,000 messages.

Run: `.venv/bin/python scripts/bench_disk.py [--messages N]` (default 3,000).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import anyio
from _bench import show_table
from rich.console import Console

import mnemo

TOPICS = ["deploy", "database", "billing", "the garden", "travel plans", "the new laptop"]


def message(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    return f"Message {i}: we talked about {topic} again; item {i * 7 % 101} is due on day {i % 28}."


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


async def run(count: int, directory: Path) -> dict[str, float]:
    path = directory / "memory.db"
    wal = Path(f"{path}-wal")
    biggest_wal = 0
    text_bytes = 0
    started = time.perf_counter()
    async with mnemo.Memory(path, embedder=mnemo.HashEmbedder(dim=384)) as mem:
        await mem.open_repo("chat")
        for i in range(count):
            text = message(i)
            text_bytes += len(text.encode())
            step = mnemo.Step(observation=text, action="remember it")
            await mem.ingest("chat", mnemo.Trajectory("remember the chat", [step]),
                             source_id=f"m{i}")
            biggest_wal = max(biggest_wal, size(wal))
        open_db, open_wal = size(path), size(wal)
    elapsed = time.perf_counter() - started
    return {
        "messages": count,
        "seconds": elapsed,
        "db": open_db,
        "wal": open_wal,
        "biggest_wal": biggest_wal,
        "text": text_bytes,
        "closed_db": size(path),
        "closed_wal": size(wal),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        r = anyio.run(run, args.messages, Path(tmp))
    per_k = 1000 / r["messages"]
    mb = 2**20
    rows = [
        ["messages ingested", f"{r['messages']:,.0f} in {r['seconds']:.1f} s"],
        ["message text", f"{r['text'] / mb:.2f} MB ({r['text'] * per_k / 1024:.0f} KB per 1,000)"],
        ["database file (open)",
         f"{r['db'] / mb:.1f} MB ({r['db'] * per_k / mb:.2f} MB per 1,000)"],
        ["WAL (open) / largest seen", f"{r['wal'] / mb:.1f} MB / {r['biggest_wal'] / mb:.1f} MB"],
        ["database + WAL per 1,000 messages", f"{(r['db'] + r['wal']) * per_k / mb:.2f} MB"],
        ["after close: database / WAL",
         f"{r['closed_db'] / mb:.1f} MB / {r['closed_wal'] / mb:.1f} MB"],
    ]
    show_table(Console(), "Disk per remembered message (ingest, offline LLM, hashed 384-d vectors)",
               ["measure", "result"], rows)


if __name__ == "__main__":
    main()
