"""Recall's reads of the store, on both backends: what anyone writes reaches the next recall
(a recall sees every write that returned before it began), each recall's nodes are its own,
and a recall's nodes and a hop's links are built off the event loop past `ON_LOOP_NODES`."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

import mnemo
from mnemo.graph.model import NodeType
from mnemo.storage.postgres import graph as pg_reads
from mnemo.storage.sqlite import graph as sqlite_reads
from tests.backends import is_sqlite, sql
from tests.recall.test_engine import REPO

N = NodeType


@pytest.fixture
async def mem(store: str) -> AsyncIterator[mnemo.Memory]:
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as opened:
        await opened.open_repo(REPO)
        for text in ["The kettle is on the red shelf.", "The teapot is on the red shelf."]:
            trajectory = mnemo.Trajectory(goal=text, steps=[mnemo.Step(text, "note it")])
            await opened.ingest(REPO, trajectory, source_id=text)
        yield opened


QUERY = "where is the kettle"


@pytest.mark.parametrize("writer", ["another Memory", "this Memory"])
async def test_a_recall_sees_access_counts_written_since_the_last(
    mem: mnemo.Memory, store: str, writer: str
) -> None:
    """Accesses of a memory counted meanwhile, by another Memory (another connection: another
    process) or through this one's connection: the next recall values the memory with them
    (a cache of the counts would have kept the old ones)."""
    before = await mem.recall(REPO, QUERY, reinforce=False)
    first = before.memories[0]
    now = datetime.now(UTC).isoformat()
    update = "UPDATE nodes SET access_count = 40, last_access = ? WHERE id = ?"
    if writer == "this Memory":
        await sql(mem, update, now, first.node.id)
    else:
        async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as other:
            await sql(other, update, now, first.node.id)
    after = await mem.recall(REPO, QUERY, reinforce=False)
    score = {m.node.id: m.score for m in after.memories}[first.node.id]
    assert score > first.score


async def test_a_recall_after_a_forget_finds_nothing_of_it(mem: mnemo.Memory) -> None:
    """A recall after this Memory forgot a source reaches none of its nodes, by no route (a
    tag's links read before the forget, kept, would still lead to them)."""
    query = "what is on the red shelf"  # both memories, and their shared tag
    found = await mem.recall(REPO, query, reinforce=False)
    gone = {t.node_id for t in found.touched}
    assert await mem.forget(REPO, "The kettle is on the red shelf.") > 0
    left = {n.id for kind in N for n in await mem.get_nodes_by_type(REPO, [kind])}
    after = await mem.recall(REPO, query, reinforce=False)
    assert {t.node_id for t in after.touched} <= left
    assert gone - left


async def test_each_recall_returns_nodes_of_its_own(mem: mnemo.Memory) -> None:
    """A caller that changes a returned node's data changes nothing another recall returns."""
    first = await mem.recall(REPO, QUERY, reinforce=False)
    first.memories[0].node.data["changed"] = True
    again = await mem.recall(REPO, QUERY, reinforce=False)
    assert all("changed" not in m.node.data for m in again.memories)


async def test_a_recall_of_many_nodes_builds_them_off_the_loop(
    mem: mnemo.Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recall that reads more than `ON_LOOP_NODES` nodes builds them (their JSON), and a hop
    from as many sees their links, in a worker thread (SQLite's connection thread; on
    PostgreSQL, not the event loop that decoded their rows), and answers the same."""
    on_loop = await mem.recall(REPO, QUERY, reinforce=False)
    threads: dict[str, list[bool]] = {"nodes": [], "links": []}
    module: Any = sqlite_reads if is_sqlite(mem) else pg_reads
    links_name = "seen_from_asked" if is_sqlite(mem) else "hop_links"
    node, links = module.node, getattr(module, links_name)

    def recorded_node(*args: Any) -> Any:
        threads["nodes"].append(threading.current_thread() is threading.main_thread())
        return node(*args)

    def recorded_links(*args: Any) -> Any:
        threads["links"].append(threading.current_thread() is threading.main_thread())
        return links(*args)

    monkeypatch.setattr(module, "node", recorded_node)
    monkeypatch.setattr(module, links_name, recorded_links)
    if not is_sqlite(mem):
        monkeypatch.setattr(pg_reads, "ON_LOOP_NODES", 1)
    off_loop = await mem.recall(REPO, QUERY, reinforce=False)
    assert threads["nodes"]
    assert threads["links"]
    assert not any(threads["nodes"] + threads["links"])
    assert [(m.node, m.score) for m in off_loop.memories] == [
        (m.node, m.score) for m in on_loop.memories]
