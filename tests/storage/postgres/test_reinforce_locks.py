"""PostgreSQL's access counts under other transactions' row locks: a recall skips the nodes
another transaction writes (`test_reads.py`), and only those."""

from __future__ import annotations

import psycopg

import mnemo
from tests.fakes import FakeEmbedder, FakeLLM

REPO = "r"


async def test_a_recall_counts_the_nodes_a_commit_in_flight_only_links_to(pg_url: str) -> None:
    """A commit in flight holds KEY SHARE locks on the nodes its new links point to (the
    foreign keys' checks); those never made the counts' UPDATE wait, and their accesses are
    counted. The first skip-locked version (FOR UPDATE) dropped them."""
    async with mnemo.Memory(pg_url, llm=FakeLLM(), embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("explore the house", repo=REPO)
        await mem.append(sid, "walk north through the garden", "go north")
        await mem.close_and_commit(sid)
        with psycopg.connect(pg_url) as linking:
            linking.execute("SELECT 1 FROM nodes FOR KEY SHARE")
            found = await mem.recall(REPO, "garden")
            linking.rollback()
        ids = [m.node.id for m in found.memories]
        assert ids
        stats = await mem._graph.access_stats(REPO, ids)
        assert all(count == 1 for count, _ in stats.values())
