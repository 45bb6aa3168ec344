"""How long `Memory.reembed` takes: a repo of `--nodes` nodes of the hashed embedder's retired
features (as a store written before hash2 holds them) re-embedded with today's hashed
embedder, the Memory's default choice for it, on SQLite and, with `--store`, PostgreSQL.

The repo is filled through the graph's commit (changesets of 1,000 facts of a few words each,
their vectors the hashed embedder's), not through ingest: what is measured is the
re-embedding, whose cost is one embedding and one staging transaction a batch and one switch.
Each case reports the wall time of `reembed`, of its switch (from the "switching" report to
"indexing": the last catch-up and the switch's transaction, under the repo's lock), and of
what comes after (PostgreSQL builds the repo's HNSW index again, without holding up commits,
once the repo is past exact scans), nodes per second, and how many reads another Memory made
beside it (node lookups and word searches: the repo stays readable; recall needs hash2
vectors, which the repo only has after the switch) and the slowest of them.

Run: `.venv/bin/python scripts/bench_reembed.py [--nodes 10000] [--batch 256 1024]
[--store embedded|postgresql://...]`.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid

import anyio
from _bench import facts_table, machine_facts, markdown_table
from _stores import open_stores, store_argument
from rich.console import Console

import mnemo
from mnemo.graph.model import Changeset, NodeDraft, NodeType
from mnemo.graph.ports import IntentPolicy

WORDS = ("nginx port proxy kettle stove tomatoes sun backup night printer toner oven bread "
         "roses garden kitchen server deploy config cache queue worker tea coffee train "
         "station ticket meeting report budget invoice holiday flight hotel museum").split()
REPO = "bench"


def retired_hash() -> mnemo.HashEmbedder:
    embedder = mnemo.HashEmbedder()
    embedder.name = "hash"  # the earlier features' name: the repo's record says so
    return embedder


async def _no_merges(pairs: object) -> list[None]:
    return []


async def fill(store: str, nodes: int) -> None:
    rng = random.Random(7)
    embedder = retired_hash()
    async with mnemo.Memory(store, embedder=embedder) as mem:
        await mem.open_repo(REPO)
        policy = IntentPolicy(0.95, 0.8, merge=_no_merges)  # type: ignore[arg-type]
        for start in range(0, nodes, 1000):
            texts = [" ".join(rng.choices(WORDS, k=rng.randint(4, 12))) + "."
                     for _ in range(min(1000, nodes - start))]
            vectors = embedder.embed_sync(texts)
            drafts = [NodeDraft(id=f"semantic_{uuid.uuid4().hex}", type=NodeType.SEMANTIC,
                                text=text, data={}, vector=vector)
                      for text, vector in zip(texts, vectors, strict=True)]
            await mem._graph.apply(Changeset(f"changeset_{uuid.uuid4().hex}", REPO, drafts),
                                   intents=policy)


async def case(store: str, batch: int) -> dict[str, float]:
    stages: dict[str, float] = {}
    reads: list[float] = []

    async def report(update: mnemo.ReembedProgress) -> None:
        stages.setdefault(update.stage, time.perf_counter())

    async with mnemo.Memory(store) as mem, mnemo.Memory(store) as reader:
        await reader.open_repo(REPO)
        done = anyio.Event()

        async def read_beside() -> None:
            while not done.is_set():
                began = time.perf_counter()
                try:
                    await reader.get_nodes_by_type(REPO, [NodeType.SOURCE])
                    await reader.search_nodes(REPO, "kettle stove", limit=10)
                finally:
                    reads.append(time.perf_counter() - began)

        began = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_beside)
            count = await mem.reembed(REPO, batch_size=batch, progress=report)
            ended = time.perf_counter()
            done.set()
        found = await mem.recall(REPO, "kettle stove tomatoes", reinforce=False)
        assert found.memories, "the re-embedded repo recalls nothing"
    return {"nodes": count, "seconds": ended - began,
            "switch": stages["indexing"] - stages["switching"],
            "index": ended - stages["indexing"],
            "reads": len(reads), "read_max": max(reads, default=0.0)}


async def main(args: argparse.Namespace) -> None:
    console = Console()
    console.print(facts_table(machine_facts()))
    rows = []
    async with open_stores(args.store, "bench-reembed-") as stores:
        for backend in stores.backends:
            for batch in args.batch:
                store = str(await stores.fresh(backend, f"reembed-{batch}"))
                await fill(store, args.nodes)
                result = await case(store, batch)
                rows.append([
                    backend, f"{int(result['nodes']):,}", str(batch),
                    f"{result['seconds']:.2f}", f"{result['nodes'] / result['seconds']:,.0f}",
                    f"{result['switch'] * 1000:,.0f}", f"{result['index']:,.2f}",
                    f"{int(result['reads']):,}",
                    f"{result['read_max'] * 1000:,.1f}",
                ])
    print(markdown_table(
        ["backend", "nodes", "batch", "reembed s", "nodes/s", "switch ms", "index after s",
         "reads beside", "slowest read ms"], rows))
    print(machine_facts()["load average"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--batch", type=int, nargs="+", default=[256])
    parser.add_argument("--store", type=store_argument, default=None)
    anyio.run(main, parser.parse_args())
