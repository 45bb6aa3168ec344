"""A child process for the re-embedding kill test: it re-embeds repo "r" of the store given
with the hashed embedder of 32 dimensions, two nodes a batch, printing a line after each batch
("batch N"), at the switch ("switching"), after it ("indexing") and at the end ("done"). With
PAUSE_AT above 0 it stops after that batch's line, waiting for a line on stdin that never
comes, to be killed there: between two batches.

    python -m tests.graph.reembed_child STORE PAUSE_AT
"""

from __future__ import annotations

import sys

import anyio

import mnemo


async def run(store: str, pause_at: int) -> None:
    batches = 0

    async def report(update: mnemo.ReembedProgress) -> None:
        nonlocal batches
        if update.stage == "embedding" and update.done:
            batches += 1
            print(f"batch {update.done}", flush=True)
            if batches == pause_at:
                await anyio.to_thread.run_sync(sys.stdin.readline)
        elif update.stage != "embedding":
            print(update.stage, flush=True)

    async with mnemo.Memory(store) as mem:
        await mem.reembed("r", embedder=mnemo.HashEmbedder(32), batch_size=2, progress=report)


if __name__ == "__main__":
    anyio.run(run, sys.argv[1], int(sys.argv[2]))
