"""Checks the embedded default embedder on this machine and prints what it measured.

    python scripts/check_embedder.py [--turns locomo.json] [--queries 100]

With every outgoing connection and name lookup made to fail (and counted), it: picks
`default_embedder()`, loads the model (time to load), embeds the paraphrase/unrelated pairs below
(cosines), embeds single queries (p50/p95) and chat turns in the embedder's batches (turns/s).
Turns come from a LoCoMo-format JSON file when given (every turn with 15-25 words, formatted
"Speaker: text", as the embedder was measured), else from a fixed synthetic set. Exits 1 if
the default is not MiniLM, a network attempt was made, or paraphrases do not beat unrelated pairs.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from mnemo.adapters.minilm import MiniLMEmbedder, bundled_model_path, default_embedder

PAIRS = [
    ("How do I restart the nginx server?", "What's the command to reload nginx?"),
    ("A man is eating food.", "A man is eating a piece of bread."),
    ("I adopted a puppy from the shelter.", "We took home a rescue dog last week."),
    (
        "The deployment failed because the disk was full.",
        "No space left on the drive broke the release.",
    ),
    ("I went hiking with my kids last weekend.", "Last Saturday my children and I took a trek."),
    ("Can you recommend a good book?", "What novel should I read next?"),
]


def block_network() -> list[str]:
    attempts: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(repr(args[1:] if args and isinstance(args[0], socket.socket) else args))
        raise OSError("network disabled by check_embedder")

    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.socket.connect_ex = refuse  # type: ignore[method-assign]
    socket.getaddrinfo = refuse
    socket.create_connection = refuse
    return attempts


def load_turns(path: Path | None, limit: int) -> list[str]:
    if path is None:
        subjects = ["Caroline", "Melanie", "Jon", "Gina"]
        topics = [
            "went camping by the lake with the kids and saw a bear near the tents at dawn",
            "is thinking about going back to school to study counseling and psychology next year",
            "painted a sunrise over the ocean last week and wants to show it at the local gallery",
            "lost his job at the bank and is now planning to open a small dance studio downtown",
            "adopted a puppy from the shelter and has been training it to sit and fetch every day",
        ]
        return [f"{subjects[i % 4]}: I {topics[i % 5]} ({i})" for i in range(limit)]
    turns: list[str] = []
    for sample in json.loads(path.read_text()):
        conversation = sample["conversation"]
        for key, session in conversation.items():
            if not key.startswith("session_") or not isinstance(session, list):
                continue
            for turn in session:
                if 15 <= len(turn["text"].split()) <= 25:
                    turns.append(f"{turn['speaker']}: {turn['text']}")
    return turns[:limit]


async def main(turns_path: Path | None, n_queries: int, n_turns: int) -> int:
    attempts = block_network()
    embedder = default_embedder()
    if not isinstance(embedder, MiniLMEmbedder):
        print(f"default_embedder() is {type(embedder).__name__}, not MiniLMEmbedder")
        return 1
    model = bundled_model_path()
    print(f"model      {model} ({model.stat().st_size:,} bytes)")
    print(f"threads    {embedder.threads}, batch size {embedder.batch_size}")

    start = time.perf_counter()
    await embedder.load()
    print(f"load       {time.perf_counter() - start:.3f} s")

    flat = [text for pair in PAIRS for text in pair]
    vectors = await embedder.embed(flat)
    anchors, paraphrases = vectors[0::2], vectors[1::2]
    para = (anchors * paraphrases).sum(axis=1)
    unrelated = (anchors * np.roll(paraphrases, 1, axis=0)).sum(axis=1)
    print(
        f"cosines    paraphrase mean {para.mean():.3f} (min {para.min():.3f}); "
        f"unrelated mean {unrelated.mean():.3f} (max {unrelated.max():.3f})"
    )

    queries = load_turns(turns_path, n_queries)
    await embedder.embed(queries[:4])
    latencies = []
    for query in queries:
        start = time.perf_counter()
        await embedder.embed([query])
        latencies.append(time.perf_counter() - start)
    p95 = statistics.quantiles(latencies, n=20)[-1]
    print(f"single     p50 {statistics.median(latencies) * 1e3:.2f} ms, p95 {p95 * 1e3:.2f} ms")

    turns = load_turns(turns_path, n_turns)
    await embedder.embed(turns[:32])
    start = time.perf_counter()
    await embedder.embed(turns)
    elapsed = time.perf_counter() - start
    print(f"batch      {len(turns)} turns in {elapsed:.2f} s: {len(turns) / elapsed:.0f} turns/s")

    print(f"network    {len(attempts)} attempts")
    ok = not attempts and float(para.min()) > float(unrelated.max())
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=Path, help="a LoCoMo-format JSON file of conversations")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1024, help="turns in the throughput run")
    args = parser.parse_args()
    sys.exit(anyio.run(main, args.turns, args.queries, args.batch))
