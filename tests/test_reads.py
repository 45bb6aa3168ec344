"""The reads added for inspection (`mnemo ui`): threads, stored episodes, a plain
node search, and a recall that does not count as an access."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import anyio
import psycopg
import pytest

import mnemo
from tests.backends import sql
from tests.conftest import REPO
from tests.fakes import FakeEmbedder, FakeLLM, js


async def test_list_threads_lists_every_stored_thread_with_counts(mem: mnemo.Memory) -> None:
    """list_threads reports each saved thread's messages and boundary; a purged one is gone."""
    chat = mem.conversation()
    await chat.save("a", [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}])
    await chat.save("b/1", [{"role": "user", "content": "three"}])
    await chat.save("gone", [{"role": "user", "content": "four"}])
    await chat.purge("gone")
    threads = await mem.list_threads()
    assert [(t.id, t.messages, t.next_seq, t.boundary_seq) for t in threads] == [
        ("a", 2, 2, 0),
        ("b/1", 1, 1, 0),
    ]


async def test_episodes_keep_every_episode_of_a_session_even_after_it_ends(
    mem: mnemo.Memory,
) -> None:
    """episodes() lists committed and open episodes with their steps, also once ended."""
    sid = await mem.start_session("explore the house", repo=REPO)
    await mem.append(sid, "walk north", "go north")
    await mem.append(sid, "open door", "push it")
    await mem.close_and_commit(sid)
    await mem.start_episode(sid, "find the key")
    await mem.append(sid, "look under mat", "lift it")
    await mem.end_session(sid)
    episodes = await mem.episodes(sid)
    assert [(e.goal, e.status, e.session_id) for e in episodes] == [
        ("explore the house", "committed", sid),
        ("find the key", "open", sid),
    ]
    assert [s.observation for s in episodes[0].steps] == ["walk north", "open door"]
    assert all(s.committed_in for s in episodes[0].steps)
    assert [len(t) for t in episodes[0].trajectories()] == [1, 1]  # "walk" and "open" differ
    assert episodes[1].steps[0].committed_in is None
    found = await mem.episode(episodes[1].id)
    assert found is not None
    assert found.session_id == sid
    assert [s.action for s in found.steps] == ["lift it"]
    assert await mem.episode("no-such-episode") is None
    assert await mem.episodes("session_unknown") == []


async def test_episodic_nodes_lead_back_to_their_stored_episode(mem: mnemo.Memory) -> None:
    """An EPISODIC node's data["episode_id"] is what episode() takes: provenance to steps."""
    sid = await mem.start_session("explore the house", repo=REPO)
    await mem.append(sid, "walk north", "go north")
    receipt = await mem.close_and_commit(sid)
    nodes = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
    assert {n.id for n in nodes} <= set(receipt.node_ids)
    episode = await mem.episode(js(nodes[0].data)["episode_id"])
    assert episode is not None
    assert episode.session_id == sid
    assert episode.steps[0].id == nodes[0].data["step_id"]


async def test_search_nodes_finds_text_without_recall(mem: mnemo.Memory) -> None:
    """search_nodes is a full-text lookup over node text; bad input is refused."""
    sid = await mem.start_session("explore the house", repo=REPO)
    await mem.append(sid, "walk north through the garden", "go north")
    await mem.close_and_commit(sid)
    found = await mem.search_nodes(REPO, "garden")
    assert found
    assert all("garden" in n.text for n in found)
    assert await mem.search_nodes(REPO, "zeppelin") == []
    assert len(await mem.search_nodes(REPO, "garden", limit=1)) == 1
    with pytest.raises(mnemo.InvalidInputError):
        await mem.search_nodes(REPO, "   ")
    with pytest.raises(mnemo.InvalidInputError):
        await mem.search_nodes(REPO, "garden", limit=0)
    with pytest.raises(mnemo.NotFoundError):
        await mem.search_nodes("nope", "garden")


async def test_recall_without_reinforcement_changes_no_access_count(mem: mnemo.Memory) -> None:
    """recall(reinforce=False) returns the same memories and counts no access."""
    sid = await mem.start_session("explore the house", repo=REPO)
    await mem.append(sid, "walk north through the garden", "go north")
    await mem.close_and_commit(sid)
    graph = mem._graph

    looked = await mem.recall(REPO, "garden", reinforce=False)
    ids = [m.node.id for m in looked.memories]
    assert ids
    stats = await graph.access_stats(REPO, ids)
    assert all(count == 0 and last is None for count, last in stats.values())

    used = await mem.recall(REPO, "garden")
    assert [m.node.id for m in used.memories] == ids
    stats = await graph.access_stats(REPO, ids)
    assert all(count == 1 for count, _ in stats.values())


@contextmanager
def another_writer(store: str) -> Iterator[None]:
    """Another process's writer holding the store's write lock: SQLite's RESERVED lock, or
    PostgreSQL's row locks on every node and thread."""
    if store.startswith("postgresql"):
        with psycopg.connect(store) as server:
            server.execute("UPDATE nodes SET access_count = access_count")
            server.execute("UPDATE threads SET next_seq = next_seq")
            yield
            server.rollback()
    else:
        file = sqlite3.connect(store, isolation_level=None)
        try:
            file.execute("BEGIN IMMEDIATE")
            yield
            file.execute("ROLLBACK")
        finally:
            file.close()


@asynccontextmanager
async def with_a_garden(store: str, *, busy_timeout: float) -> AsyncIterator[mnemo.Memory]:
    """A Memory on `store` whose repo holds one committed step about a garden."""
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder(),
                            config=mnemo.Config(busy_timeout=busy_timeout)) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("explore the house", repo=REPO)
        await mem.append(sid, "walk north through the garden", "go north")
        await mem.close_and_commit(sid)
        yield mem


async def test_a_recall_returns_while_another_writer_holds_the_store(store: str) -> None:
    """A recall's reads need no lock; only its access counts do. With another writer holding
    the lock past `busy_timeout`, the recall returns what it found (the counts of that one
    recall go unwritten, logged) where it used to raise the write's StorageError("busy")."""
    async with with_a_garden(store, busy_timeout=0.2) as mem:
        before = await mem.recall(REPO, "garden", reinforce=False)
        with another_writer(store):
            found = await mem.recall(REPO, "garden")
            # SQLite tries the counts after the recall returned, before this read (it gives
            # up after a tenth of a second); PostgreSQL skipped the nodes held.
            stats = await mem._graph.access_stats(REPO, [m.node.id for m in found.memories])
        assert [m.node.id for m in found.memories] == [m.node.id for m in before.memories]
        assert before.degraded == found.degraded == []
        assert found.memories
        assert all(count == 0 for count, _ in stats.values())
        assert [m.node.id for m in (await mem.recall(REPO, "garden")).memories]
        stats = await mem._graph.access_stats(REPO, [m.node.id for m in found.memories])
        assert all(count == 1 for count, _ in stats.values())


async def test_a_recall_whose_embedder_fails_answers_by_its_words(
    mem: mnemo.Memory, embedder: FakeEmbedder
) -> None:
    """A hosted embedder down: the recall answers from the words channel and the graph, and
    `degraded` names the embedding."""
    await mem.ingest(REPO, mnemo.Trajectory("Tend the garden", [
        mnemo.Step("The garden hose leaks at the tap.", "Replace the washer."),
        mnemo.Step("The tomatoes need water daily.", "Water them.")]), source_id="garden")
    embedder.fail = True
    found = await mem.recall(REPO, "garden hose tap", reinforce=False)
    assert found.memories
    assert "hose" in found.memories[0].node.text
    assert [note.split(":")[0] for note in found.degraded] == ["embedding"]
    assert "embed boom" in found.degraded[0]


async def test_a_recall_under_another_writers_lock_holds_up_nothing_for_long(
    store: str,
) -> None:
    """A recall's access counts waited out the busy timeout (30 s here) for another
    writer's lock, and on SQLite, where a Memory has one connection, held up every other
    call of the Memory as long. They now wait a tenth of a second at most (SQLite), or skip
    the nodes held (PostgreSQL), and the recall returns (the guard is a hundred times
    that)."""
    async with with_a_garden(store, busy_timeout=30.0) as mem:
        found: list[mnemo.RecallResult] = []
        done = anyio.Event()

        async def recall() -> None:
            found.append(await mem.recall(REPO, "garden"))
            done.set()

        with another_writer(store):
            async with anyio.create_task_group() as tg:
                tg.start_soon(recall)
                with anyio.fail_after(10):  # a guard: the wait in the store is not cancellable
                    await done.wait()
        assert found[0].memories


async def test_a_ttl_read_with_nothing_due_needs_no_lock(store: str) -> None:
    """A conversation with a ttl erases what is due before each read. With nothing due it
    takes no lock: its reads went on failing "busy" (SQLite: every time; PostgreSQL: behind
    a writer of the thread) while another writer held the store."""
    config = mnemo.Config(busy_timeout=0.2)
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder(),
                            config=config) as mem:
        chat = mem.conversation(ttl=3600)
        await chat.save("t", [{"role": "user", "content": "hello"}])
        with another_writer(store):
            assert [m["content"] for m in await chat.load("t")] == ["hello"]
            assert [m.content for m in await chat.raw("t")] == ["hello"]


async def test_a_semantic_read_whose_vectors_were_missing_goes_on_under_a_lock(
    store: str,
) -> None:
    """A Semantic load embeds the messages whose vectors are missing (their embedding failed
    when they were saved) and stores them for the next read. Under another writer's lock
    that write waited out `busy_timeout` (and on SQLite held up the whole Memory) and then
    failed the load; the load now answers from the vectors it just made."""
    async with with_a_garden(store, busy_timeout=0.2) as mem:
        chat = mem.conversation(retrieval=mnemo.Semantic(k=1))
        await chat.save("t", [{"role": "user", "content": "garden gate is red"},
                              {"role": "user", "content": "kitchen is warm"}])
        await sql(mem, "DELETE FROM message_vectors")
        with another_writer(store):
            loaded = await chat.load("t", "garden")
        assert [m["content"] for m in loaded] == ["garden gate is red"]
