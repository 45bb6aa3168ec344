"""A child process for the lexical index's kill test: on the store given, it commits nodes of
random words and episodes of steps, deletes some and searches (so that its index slot applies
and commits all the while), printing a line after each round, until it is killed.

    python -m tests.graph.lexical_child STORE SEED
"""

from __future__ import annotations

import random
import sys

import anyio

from mnemo.graph.model import NodeType
from mnemo.storage.ports import open_backend
from tests.graph._support import DIM, REPO
from tests.graph.test_lexical import WORDS, add, add_steps


async def run(store: str, seed: int) -> None:
    rng = random.Random(seed)
    backend = open_backend(store, dims=lambda repo: DIM, busy_timeout=30.0)
    await backend.open()
    graph = backend.graph
    for n in range(10**9):
        texts = {
            f"{seed}-{n}-{i}": " ".join(rng.choices(WORDS, k=rng.randint(1, 3)))
            for i in range(rng.randint(1, 20))
        }
        await add(backend, f"{seed}-{n}", texts)
        steps = {
            f"episodic_{seed}-{n}:{i}": " ".join(rng.choices(WORDS, k=rng.randint(1, 2)))
            for i in range(rng.randint(1, 6))
        }
        await add_steps(backend, f"{seed}-{n}-steps", steps)
        if n % 3 == 2:
            found = await graph.search_text(REPO, rng.choice(WORDS), 5)
            await graph.delete_nodes(REPO, [node_id for node_id, _ in found[:2]])
        await graph.search_text(REPO, rng.choice(WORDS), 10, [NodeType.SEMANTIC])
        print("round", flush=True)


if __name__ == "__main__":
    anyio.run(run, sys.argv[1], int(sys.argv[2]))
