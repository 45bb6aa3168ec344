"""SQLite's recall cache (`mnemo/storage/sqlite/recall_cache.py`): it answers as the statements
do, a warm recall of a small repo asks the connection for nothing but its look at the log, and
what anyone writes reaches the next recall (these last on both backends: a recall sees every
write that returned before it began, whatever the store keeps)."""

from __future__ import annotations

import random
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

import mnemo
from mnemo.graph.model import LinkType, NodeType
from mnemo.storage.graph_base import seen_from_asked
from mnemo.storage.postgres import recall_reads as pg_reads
from mnemo.storage.postgres.rows import node
from mnemo.storage.sqlite import SqliteBackend, recall_graph, recall_reads
from mnemo.storage.sqlite import recall_cache as cache_module
from mnemo.storage.sqlite.database import Database
from mnemo.storage.sqlite.recall_cache import RecallCache
from tests.backends import is_sqlite, open_stores, sql
from tests.recall.test_engine import EMBEDDER, REPO, build
from tests.recall.test_hops import _graph

N = NodeType


@pytest.fixture
async def database(tmp_path: Path) -> AsyncIterator[Database]:
    async with open_stores(str(tmp_path / "s.db"), EMBEDDER.dim) as backend:
        nodes, links = _graph(seed=3)
        await build(backend.graph, nodes, links)
        yield cast(SqliteBackend, backend).database


async def filled(
    database: Database, ids: list[str], kinds: list[NodeType] | None = None,
    link: LinkType | None = None,
) -> RecallCache:
    """A cache that has read `ids` (and the links of type `link`, None: all, of those of the
    types `kinds`, None: of all), as a recall's view fills it."""
    cache = RecallCache()
    await database.run(cache.look)
    cache.valid()
    assert await kept(database, cache, ids, kinds, link)
    return cache


async def kept(
    database: Database, cache: RecallCache, ids: list[str], kinds: list[NodeType] | None = None,
    link: LinkType | None = None,
) -> bool:
    """Reads `ids` for the cache; whether it kept what was read."""
    view = cache.view()
    await database.run(lambda db: view.fill(db, REPO, ids, kinds, link))
    return all([cache.keep(filled) for filled in view.filled])


def cached(cache: RecallCache, ids: list[str]) -> bool:
    """Whether the cache holds `ids` (of `REPO`)."""
    return not cache.view().take(REPO, ids)


@pytest.mark.parametrize("chunk", [3, cache_module.CHUNK])
@pytest.mark.parametrize("seed", range(12))
async def test_the_cache_answers_as_the_statements_do(
    database: Database, monkeypatch: pytest.MonkeyPatch, chunk: int, seed: int
) -> None:
    """For any asked ids (some unknown, some twice, in any order), `node_context` and
    `typed_links` from the cache are the statements' answers, order included, chunk by
    chunk as they read."""
    monkeypatch.setattr(cache_module, "CHUNK", chunk)
    monkeypatch.setattr(recall_reads, "_CHUNK", chunk)
    rng = random.Random(seed)
    known = [f"{p}{i}" for p in "tseipg" for i in range(8)]
    ids = rng.sample([*known, "nobody", "nothing"], rng.randrange(1, 20))
    ids += rng.sample(ids, min(2, len(ids)))
    kinds = rng.sample(list(N), rng.randrange(1, 4))
    link = rng.choice(list(LinkType))
    cache = await filled(database, ids, *rng.choice([(None, None), (kinds, link)]))
    read = await database.run(lambda db: recall_reads.node_context(db, REPO, ids, kinds, link))
    view = cache.view()
    assert view.take(REPO, ids, kinds, link) == []
    answer = view.node_context(REPO, ids, kinds, link)
    assert (answer.nodes, answer.stats, answer.links) == (read.nodes, read.stats, read.links)
    unique = list(dict.fromkeys(ids))
    if view.take(REPO, unique):  # a hop reads the links of every node it asks for
        await database.run(lambda db: view.fill(db, REPO, unique))
    assert view.typed_links(REPO, unique) == await database.run(
        lambda db: recall_reads.typed_links(db, REPO, unique))


async def test_a_refused_access_count_write_empties_the_cache(database: Database) -> None:
    """Counts the cache took on when their write was posted are dropped once the write is
    refused: the next look finds another stamp."""
    cache = await filled(database, ["s1"])
    cache.posted(REPO, ["s1"], datetime.now(UTC).isoformat())
    await database.run(lambda db: cache.refused())
    await database.run(cache.look)
    cache.valid()
    assert not cached(cache, ["s1"])


async def test_a_fill_read_before_a_posted_write_ran_is_not_kept(database: Database) -> None:
    """Rows read before an access-count write ran lack its counts, which the cache took on
    when it was posted: they answer that read, and are not kept."""
    cache = await filled(database, ["s1"])
    cache.posted(REPO, ["s1"], datetime.now(UTC).isoformat())
    assert not await kept(database, cache, ["s2"])


    def write(db: Any) -> None:  # the posted write, as `SqliteGraph.reinforce` makes it
        before = db.conn.total_changes
        db.conn.execute("UPDATE nodes SET access_count = access_count + 1 WHERE id = 's1'")
        cache.written(db.conn.total_changes - before)

    await database.run(write)
    assert await kept(database, cache, ["s2"])
    assert cached(cache, ["s1", "s2"])


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


def queued_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The calls queued to a connection's thread from now on (appended as they come)."""
    queued: list[Any] = []
    queue = Database._queue

    def counted(self: Database, fn: Any) -> Any:
        queued.append(fn)
        return queue(self, fn)

    monkeypatch.setattr(Database, "_queue", counted)
    return queued


async def test_a_warm_recall_of_a_small_sqlite_repo_reads_nothing_but_the_log(
    mem: mnemo.Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a query's nodes are cached, its recall asks the connection's thread for its look
    at the node log only (and posts its access counts): the hops and the best candidates'
    read come from memory."""
    if not is_sqlite(mem):
        pytest.skip("the recall cache is SQLite's")
    await mem.recall(REPO, QUERY)
    await mem.recall(REPO, QUERY)
    database = cast(SqliteBackend, mem._backend).database
    queued = queued_calls(monkeypatch)
    result = await mem.recall(REPO, QUERY)
    assert result.memories
    assert len(queued) == 1
    assert database is not None


async def test_a_warm_recall_of_many_nodes_builds_them_on_the_connections_thread(
    mem: mnemo.Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm recall whose best candidates are more than `ON_LOOP_NODES` builds their nodes on
    the connection's thread although the cache holds them (a thousand nodes of long steps
    would hold the event loop tens of milliseconds), and answers the same."""
    if not is_sqlite(mem):
        pytest.skip("the recall cache is SQLite's")
    await mem.recall(REPO, QUERY, reinforce=False)
    on_loop = await mem.recall(REPO, QUERY, reinforce=False)
    queued = queued_calls(monkeypatch)
    again = await mem.recall(REPO, QUERY, reinforce=False)
    looks = len(queued)
    monkeypatch.setattr(recall_graph, "ON_LOOP_NODES", 1)
    off_loop = await mem.recall(REPO, QUERY, reinforce=False)
    assert len(queued) == 2 * looks + 2  # the nodes' build, and the one hop's links
    assert [(m.node, m.score) for m in off_loop.memories] == [
        (m.node, m.score) for m in on_loop.memories] == [(m.node, m.score) for m in again.memories]


async def test_a_recall_of_many_nodes_on_postgresql_builds_them_off_the_loop(
    mem: mnemo.Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's twin of the tests around: a recall that reads more than `ON_LOOP_NODES`
    nodes builds them (their JSON), and a hop from as many sees their links, in a worker
    thread, not on the event loop that decoded their rows, and answers the same."""
    if is_sqlite(mem):
        pytest.skip("SQLite's: the tests around")
    on_loop = await mem.recall(REPO, QUERY, reinforce=False)
    threads: dict[str, list[bool]] = {"nodes": [], "links": []}
    links = pg_reads.hop_links

    def recorded_node(row: Any) -> Any:
        threads["nodes"].append(threading.current_thread() is threading.main_thread())
        return node(row)

    def recorded_links(rows: Any) -> Any:
        threads["links"].append(threading.current_thread() is threading.main_thread())
        return links(rows)

    monkeypatch.setattr(pg_reads, "node", recorded_node)
    monkeypatch.setattr(pg_reads, "hop_links", recorded_links)
    monkeypatch.setattr(pg_reads, "ON_LOOP_NODES", 1)
    off_loop = await mem.recall(REPO, QUERY, reinforce=False)
    assert threads["nodes"]
    assert threads["links"]
    assert not any(threads["nodes"] + threads["links"])
    assert [(m.node, m.score) for m in off_loop.memories] == [
        (m.node, m.score) for m in on_loop.memories]


async def test_a_warm_hop_from_many_nodes_sees_their_links_on_the_connections_thread(
    mem: mnemo.Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hop from more than `ON_LOOP_NODES` nodes sees their links on the connection's thread
    although the cache holds them (thousands of links would hold the event loop), and the
    recall answers the same."""
    if not is_sqlite(mem):
        pytest.skip("the recall cache is SQLite's")
    await mem.recall(REPO, QUERY, reinforce=False)
    on_loop = await mem.recall(REPO, QUERY, reinforce=False)
    threads: list[bool] = []

    def recorded(rows: Any, asked: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return seen_from_asked(rows, asked)

    monkeypatch.setattr(cache_module, "seen_from_asked", recorded)
    monkeypatch.setattr(recall_graph, "ON_LOOP_NODES", 1)
    off_loop = await mem.recall(REPO, QUERY, reinforce=False)
    assert threads
    assert not any(threads)
    assert [(m.node, m.score) for m in off_loop.memories] == [
        (m.node, m.score) for m in on_loop.memories]
