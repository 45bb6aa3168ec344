"""A query at the size limit against long stored texts: recall's scans of candidate texts are
bounded by k and the query's capped words, and keep off the event loop."""

from __future__ import annotations

import random
import string
from collections.abc import AsyncIterator

import anyio
import pytest

import mnemo
from mnemo.graph.model import NodeType
from mnemo.graph.ports import GraphStore
from tests.backends import open_stores
from tests.loop import ticking
from tests.recall.test_engine import EMBEDDER, build, run

LIMIT = mnemo.Config().max_text_chars


def distinct_words(count: int, seed: int) -> list[str]:
    draw = random.Random(seed)
    return ["".join(draw.choices(string.ascii_lowercase, k=7)) for _ in range(count)]


def query_at_the_limit() -> str:
    """32,000 characters of distinct words."""
    text = " ".join(distinct_words(LIMIT // 8, seed=1))
    return text[: LIMIT - 1].rsplit(" ", 1)[0]


@pytest.fixture
async def long_steps(store: str) -> AsyncIterator[GraphStore]:
    """60 steps of about 24,000 characters, each holding 1,000 of the query's words."""
    words = query_at_the_limit().split()
    draw = random.Random(2)
    nodes = [(f"e{i}", NodeType.EPISODIC, " ".join(draw.sample(words, 1000) +
                                                     distinct_words(2000, seed=10 + i)))
             for i in range(60)]
    async with open_stores(store, EMBEDDER.dim) as backend:
        await build(backend.graph, nodes, [])
        yield backend.graph


async def test_a_query_at_the_limit_never_stalls_the_loop(long_steps: GraphStore) -> None:
    """A recall of a 32,000-character query of distinct words against 60 long steps keeps the
    event loop running (no gap of 0.25 s) and returns its k results."""
    query = query_at_the_limit()
    assert len(query) <= LIMIT
    async with ticking() as ticker:
        with anyio.fail_after(60):
            result = await run(long_steps, query, k=10)
    assert len(result.memories) == 10
    assert ticker.longest < 0.25, ticker.longest
