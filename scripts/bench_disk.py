"""Disk used per remembered message, everything mnemo keeps counted.

Each message is remembered with one `mem.ingest` (a one-step trajectory), as an app that
remembers every chat message would, on the embedded defaults' storage (a SQLite file, WAL,
`synchronous=NORMAL`) with the offline LLM and the hashed embedder (no model to load; the
vectors are as large as MiniLM's, 384 floats). While ingesting, the WAL's size is sampled after
every message. After the Memory is closed (its HNSW graphs saved, its lexical index committed)
everything the store keeps is counted: the file, its WAL, and the folders beside it (the
saved HNSW graphs "<file>.hnsw", the lexical index "<file>.lexical"), per message, beside
mem0's bytes per message. With `--tables`, where the file's bytes go, per table and index
(SQLite's `dbstat`, what `sqlite3_analyzer` reads).

mem0's figure is the measurement of mem0 2.2.1's default local stores (Qdrant on disk
and its SQLite history) after 10,000 `add(..., infer=False)`: about 5 KB a message (one
1,536-byte vector, the payload and the history row). The goal: at most twice that.

Run: `.venv/bin/python scripts/bench_disk.py [--messages N] [--tables]` (default 3,000; the
issue's size is 10,000, where a repo passes the HNSW threshold and its graphs are saved).
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

import anyio
from _bench import show_table
from rich.console import Console

import mnemo

TOPICS = ["deploy", "database", "billing", "the garden", "travel plans", "the new laptop"]
# mem0 2.2.1's bytes per message, and the goal's factor.
MEM0_BYTES = 5 * 1024
GOAL = 2.0


def message(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    return f"Message {i}: we talked about {topic} again; item {i * 7 % 101} is due on day {i % 28}."


def size(path: Path) -> int:
    """The bytes of a file, or of every file under a folder (0 if absent)."""
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(child.stat().st_size for child in path.rglob("*") if child.is_file())


def tables(path: Path) -> list[tuple[str, int, int]]:
    """(table or index, bytes of its pages, bytes used) of the file, largest first."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT name, sum(pgsize), sum(pgsize - unused) FROM dbstat GROUP BY name"
            " ORDER BY 2 DESC"
        ).fetchall()
    conn.close()
    return [(str(name), int(pages), int(used)) for name, pages, used in rows]


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
        "hnsw": size(Path(f"{path}.hnsw")),
        "lexical": size(Path(f"{path}.lexical")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--tables", action="store_true", help="bytes per table and index")
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        r = anyio.run(run, args.messages, Path(tmp))
        where = tables(Path(tmp) / "memory.db") if args.tables else []
    n = r["messages"]
    mb = 2**20
    kept = r["closed_db"] + r["closed_wal"] + r["hnsw"] + r["lexical"]
    per = kept / n
    rows = [
        ["messages ingested", f"{n:,.0f} in {r['seconds']:.1f} s"],
        ["message text", f"{r['text'] / mb:.2f} MB ({r['text'] / n:.0f} bytes a message)"],
        ["WAL (open) / largest seen", f"{r['wal'] / mb:.1f} MB / {r['biggest_wal'] / mb:.1f} MB"],
        ["after close: database / WAL",
         f"{r['closed_db'] / mb:.1f} MB / {r['closed_wal'] / mb:.1f} MB"],
        ["after close: saved HNSW graphs / lexical index",
         f"{r['hnsw'] / mb:.1f} MB / {r['lexical'] / mb:.1f} MB"],
        ["after close: everything, per message", f"{per / 1024:.2f} KB"],
        ["mem0 2.2.1 per message (issue 42)", f"{MEM0_BYTES / 1024:.2f} KB"],
        ["ratio (goal: at most 2.0)", f"{per / MEM0_BYTES:.2f}"],
    ]
    show_table(console, "Disk per remembered message (ingest, offline LLM, hashed 384-d vectors)",
               ["measure", "result"], rows)
    if where:
        show_table(console, "Where the database file's bytes go (dbstat), per message",
                   ["table or index", "bytes", "used"],
                   [[name, f"{pages / n:,.0f}", f"{used / n:,.0f}"]
                    for name, pages, used in where if pages / n >= 16])


if __name__ == "__main__":
    main()
