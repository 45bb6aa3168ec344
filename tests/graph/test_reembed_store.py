"""A repo's re-embedding in the store, on both backends (`GraphStore`'s re-embedding methods):
new vectors staged beside the old ones, put in place by one switch, and every process's
vectors in memory loading the new ones once the generation moved. `Memory.reembed` drives
these; tests/graph/test_reembed.py tests it."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest

import mnemo
from mnemo.graph.commit import CommitTarget
from mnemo.graph.model import Vector
from mnemo.graph.ports import GraphStore
from mnemo.graph.reembed import Unstaged
from mnemo.graph.vectors import VectorIndex
from tests.backends import sql

REPO = "r"


def memory(store: str) -> mnemo.Memory:
    return mnemo.Memory(store, embedder=mnemo.HashEmbedder(64))


async def filled(mem: mnemo.Memory) -> None:
    await mem.open_repo(REPO)
    steps = [mnemo.Step("Tomatoes need six hours of sun.", "water the tomatoes"),
             mnemo.Step("The kettle is on the stove.", "boil water for tea")]
    await mem.ingest(REPO, mnemo.Trajectory("garden and kitchen", steps), source_id="s")


def new_vectors(nodes: list[Unstaged], dim: int = 32) -> Vector:
    """A vector along the first axis for every node: nothing the old ones could be."""
    vectors = np.zeros((len(nodes), dim), dtype=np.float32)
    vectors[:, 0] = 1.0
    return vectors


async def stage_all(graph: GraphStore, batch: int = 3) -> int:
    staged, after = 0, 0
    while nodes := await graph.unstaged(REPO, after, batch):
        await graph.stage(REPO, nodes, new_vectors(nodes))
        after = nodes[-1].rowid
        staged += len(nodes)
    return staged


async def vectors_of(mem: mnemo.Memory) -> VectorIndex:
    """The repo's vectors as the Memory holds them in memory (a commit's view of them)."""
    return await cast(CommitTarget, mem._graph).vector_index(REPO)


async def record(mem: mnemo.Memory) -> tuple[str, int, int]:
    rows = await sql(mem, "SELECT embedder, dim, vectors_generation FROM repos WHERE name = ?",
                     REPO)
    return rows[0][0], rows[0][1], rows[0][2]


async def test_staged_vectors_take_the_old_ones_place_in_one_switch(store: str) -> None:
    """Until the switch the repo holds its old vectors and record (searches find them); the
    switch puts every staged vector in place, records the embedder, its dimension and the
    next generation, and leaves nothing staged."""
    async with memory(store) as mem:
        await filled(mem)
        graph = mem._graph
        total = len(await sql(mem, "SELECT id FROM nodes WHERE repo = ?", REPO))
        staging = await graph.begin_reembed(REPO, "hash2:32", 32)
        assert (staging.staged, staging.total, staging.resumed) == (0, total, False)
        assert await stage_all(graph) == total
        assert await record(mem) == ("hash2:64", 64, 0)
        old = await graph.search_vectors(REPO, np.ones(64, dtype=np.float32), 50)
        assert len(old) == total
        async with graph.lock(REPO):
            assert await graph.switch_vectors(REPO) == (1, total)
        assert await record(mem) == ("hash2:32", 32, 1)
        assert not await sql(mem, "SELECT * FROM staged_vectors")
        assert not await sql(mem, "SELECT * FROM reembeds")
        index = await vectors_of(mem)
        assert (index.generation, index.dim) == (1, 32)
        found = await graph.search_vectors(REPO, np.eye(32, dtype=np.float32)[0], 50)
        assert len(found) == total
        assert all(score == pytest.approx(1.0) for _, score in found)


async def test_a_switch_with_a_node_left_unstaged_writes_nothing(store: str) -> None:
    """A node without a staged vector (committed after the catch-up) refuses the switch:
    the repo keeps its old vectors and record, and the re-embedding its staged vectors."""
    async with memory(store) as mem:
        await filled(mem)
        graph = mem._graph
        await graph.begin_reembed(REPO, "hash2:32", 32)
        nodes = await graph.unstaged(REPO, 0, 1000)
        await graph.stage(REPO, nodes[1:], new_vectors(nodes[1:]))
        async with graph.lock(REPO):
            with pytest.raises(mnemo.StorageError, match="1 nodes of repo 'r' have no new"):
                await graph.switch_vectors(REPO)
        assert await record(mem) == ("hash2:64", 64, 0)
        assert len(await sql(mem, "SELECT * FROM staged_vectors")) == len(nodes) - 1
        assert [n.id for n in await graph.unstaged(REPO, 0, 1000)] == [nodes[0].id]


async def test_a_node_changed_or_deleted_after_it_was_staged_is_not_switched_stale(
    store: str,
) -> None:
    """A node whose text changed after its vector was staged loses it at the next look at
    the node log (`unstage_changed`) and is embedded again; one deleted takes its staged
    vector with it, and staging a node deleted meanwhile stages nothing."""
    async with memory(store) as mem:
        await filled(mem)
        graph = mem._graph
        await graph.begin_reembed(REPO, "hash2:32", 32)
        nodes = await graph.unstaged(REPO, 0, 1000)
        kept, reworded, gone = nodes[0], nodes[1], nodes[2]
        await graph.stage(REPO, [kept, reworded], new_vectors([kept, reworded]))
        await sql(mem, "UPDATE nodes SET text = 'reworded' WHERE id = ?", reworded.id)
        await sql(mem, "DELETE FROM nodes WHERE id = ?", gone.id)
        await graph.stage(REPO, [gone], new_vectors([gone]))
        await graph.unstage_changed(REPO)
        left = {n.id: n.text for n in await graph.unstaged(REPO, 0, 1000)}
        assert left.get(reworded.id) == "reworded"
        assert not {kept.id, gone.id} & set(left)
        assert len(await sql(mem, "SELECT * FROM staged_vectors")) == 1


async def test_a_reembedding_with_the_same_embedder_carries_on_another_starts_over(
    store: str,
) -> None:
    """A re-embedding begun again with the embedder and dimension of the one under way
    keeps what it staged; with another, the staged vectors go."""
    async with memory(store) as mem:
        await filled(mem)
        graph = mem._graph
        await graph.begin_reembed(REPO, "hash2:32", 32)
        nodes = await graph.unstaged(REPO, 0, 2)
        await graph.stage(REPO, nodes, new_vectors(nodes))
        again = await graph.begin_reembed(REPO, "hash2:32", 32)
        assert (again.staged, again.resumed) == (2, True)
        other = await graph.begin_reembed(REPO, "hash2:16", 16)
        assert (other.staged, other.resumed) == (0, False)
        assert not await sql(mem, "SELECT * FROM staged_vectors")


async def test_one_reembedding_of_a_repo_at_a_time_across_memories(store: str) -> None:
    """A second re-embedding of the repo, through another Memory (another connection, as
    another process would have), is refused at once; once the first ends, it may begin."""
    async with memory(store) as a, memory(store) as b:
        await filled(a)
        async with a._graph.reembedding(REPO):
            with pytest.raises(mnemo.ConflictError, match="being re-embedded"):
                async with b._graph.reembedding(REPO):
                    pass
            with pytest.raises(mnemo.ConflictError):
                async with a._graph.reembedding(REPO):
                    pass
        async with b._graph.reembedding(REPO):
            pass


async def test_vectors_loaded_elsewhere_load_again_after_a_switch(store: str) -> None:
    """Another Memory's vectors in memory (all of them on SQLite, the routes on PostgreSQL),
    loaded before the switch, are of the old generation and dimension; its next look loads
    the new ones (the node log alone says nothing: no text changed)."""
    async with memory(store) as a, memory(store) as b:
        await filled(a)
        await b.open_repo(REPO)
        before = await vectors_of(b)
        assert (before.generation, before.dim) == (0, 64)
        await a._graph.begin_reembed(REPO, "hash2:32", 32)
        await stage_all(a._graph)
        async with a._graph.lock(REPO):
            await a._graph.switch_vectors(REPO)
        after = await vectors_of(b)
        assert after is not before
        assert (after.generation, after.dim) == (1, 32)
        assert await b._graph.generation(REPO) == 1


def switch_at_next_state_read(
    store: str, a: mnemo.Memory, monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """Makes the next read of a repo's state (the node log's, with the vectors' generation)
    by any Memory switch the repo's staged vectors in right after it (as `a`, or, on SQLite,
    another connection, as another process would); the list gets the new generation."""
    switched: list[int] = []
    if store.startswith("postgresql"):
        from mnemo.storage.postgres.vectors import PgVectors

        read_pg_state = PgVectors._state

        async def pg_state_then_switch(self: PgVectors, repo: str) -> object:
            state = await read_pg_state(self, repo)
            if not switched:
                async with a._graph.lock(REPO):
                    switched.append((await a._graph.switch_vectors(REPO))[0])
            return state

        monkeypatch.setattr(PgVectors, "_state", pg_state_then_switch)
        return switched
    import sqlite_utils

    from mnemo.storage.sql import drive
    from mnemo.storage.sqlite import vectors as sqlite_vectors
    from mnemo.storage.sqlite.database import SqliteStatements
    from mnemo.storage.sqlite.graph import SqliteReembeds

    read_sqlite_state = sqlite_vectors._state

    def sqlite_state_then_switch(db: sqlite_utils.Database, repo: str) -> object:
        state = read_sqlite_state(db, repo)
        if not switched:
            other = sqlite_utils.Database(store)
            try:
                with other.atomic():
                    switched.append(drive(SqliteReembeds().switch(
                        SqliteStatements(other.conn), REPO))[0])
            finally:
                other.close()
        return state

    monkeypatch.setattr(sqlite_vectors, "_state", sqlite_state_then_switch)
    return switched


async def test_vectors_loaded_across_a_switch_are_of_one_generation(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A switch (to another dimension) that commits while another Memory loads the repo's
    vectors, right after it read their generation: what it loads is all of one generation,
    labelled with it, the old or the new, never the old label on the new vectors."""
    async with memory(store) as a, memory(store) as b:
        await filled(a)
        await b.open_repo(REPO)
        await a._graph.begin_reembed(REPO, "hash2:32", 32)
        await stage_all(a._graph)
        switched = switch_at_next_state_read(store, a, monkeypatch)
        loaded = await vectors_of(b)
        assert switched == [1]
        assert (loaded.generation, loaded.dim) in {(0, 64), (1, 32)}
        monkeypatch.undo()
        again = await vectors_of(b)
        assert (again.generation, again.dim) == (1, 32)
        assert await b._graph.generation(REPO) == 1


async def test_a_look_across_a_switch_applies_no_vector_of_the_new_generation(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A switch (to another dimension) that commits while another Memory, holding the repo's
    vectors, looks at the nodes committed since, right after it read the log's state: the
    changed nodes' new vectors are not put among the old ones (the repo is loaded again)."""
    async with memory(store) as a, memory(store) as b:
        await filled(a)
        await b.open_repo(REPO)
        before = await vectors_of(b)
        assert (before.generation, before.dim) == (0, 64)
        await a.ingest(REPO, mnemo.Trajectory("office", [mnemo.Step(
            "The printer on the second floor is out of toner.", "order toner")]),
            source_id="later")
        await a._graph.begin_reembed(REPO, "hash2:32", 32)
        await stage_all(a._graph)
        switched = switch_at_next_state_read(store, a, monkeypatch)
        looked = await vectors_of(b)
        assert switched == [1]
        assert (looked.generation, looked.dim) in {(0, 64), (1, 32)}
        monkeypatch.undo()
        again = await vectors_of(b)
        assert (again.generation, again.dim) == (1, 32)
