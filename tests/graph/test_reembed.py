"""`Memory.reembed`: every node's vector of a repo made again with another embedder, on both
backends. A repo of the hashed embedder's retired features recalls again; a repo moves to
another dimension; the repo is read and written while it runs and never holds two embedders'
vectors; a re-embedding cut short leaves the repo as it was and carries on when run again; other
Memories (open before, or opened after) run the new embedder; sessions open across it commit
vectors of the new one. The store's mechanics: tests/graph/test_reembed_store.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import numpy as np
import psycopg
import pytest

import mnemo
from mnemo.extraction.entities import vector_text
from mnemo.graph.vectors import unit
from tests.backends import sql

REPO = "r"
FACTS = [
    ("Nginx listens on port 8080 behind the proxy.", "edit nginx.conf"),
    ("The kettle is on the stove in the kitchen.", "boil water for tea"),
    ("Tomatoes need six hours of sun every day.", "water the tomatoes"),
    ("The backup runs every night at two o'clock.", "check the backup log"),
]


def earlier_hash(dim: int = 512) -> mnemo.HashEmbedder:
    """A hashed embedder recorded under the name of the earlier features (`hash[:DIM]`), as a
    store written before today's tokenizer holds it."""
    embedder = mnemo.HashEmbedder(dim)
    embedder.name = "hash" if dim == 512 else f"hash:{dim}"
    return embedder


async def fill(mem: mnemo.Memory, start: int = 0, count: int = len(FACTS)) -> None:
    for i in range(start, start + count):
        observation, action = FACTS[i % len(FACTS)]
        await mem.ingest(REPO, mnemo.Trajectory(f"goal {i}", [mnemo.Step(observation, action)]),
                         source_id=f"s{i}")


async def record(owner: mnemo.Memory) -> tuple[str, int, int]:
    """The repo's (embedder, dim, generation) as the store holds them."""
    rows = await sql(owner, "SELECT embedder, dim, vectors_generation FROM repos WHERE name = ?",
                     REPO)
    return rows[0][0], rows[0][1], rows[0][2]


async def all_of(mem: mnemo.Memory, embedder: mnemo.HashEmbedder) -> None:
    """Every node of the repo has a vector, and it is `embedder`'s vector of the node's text
    (float16 on SQLite: a cosine within 1e-3): none of another embedder is left."""
    nodes = await mem.get_nodes_by_type(REPO, list(mnemo.NodeType))
    assert nodes
    stored = await mem._graph.vectors(REPO, [n.id for n in nodes])
    assert set(stored) == {n.id for n in nodes}
    expected = unit(embedder.embed_sync([vector_text(n.type, n.text) for n in nodes]))
    for node, vector in zip(nodes, expected, strict=True):
        assert len(stored[node.id]) == embedder.dim, node.id
        assert float(np.dot(unit(stored[node.id])[0], vector)) > 0.999, (node.type, node.text)


def texts(result: mnemo.RecallResult) -> list[str]:
    return [m.node.text for m in result.memories]


async def test_a_repo_of_the_retired_hashed_features_recalls_again(store: str) -> None:
    """A repo recorded with the hashed embedder's earlier features: its stand-in's refusal
    says to run `mnemo reembed`; after `reembed` (no embedder given: today's hash2 of the
    same dimension), its facts are recalled again, every vector is hash2's, and the record
    names hash2 for a Memory opened later without an embedder."""
    async with mnemo.Memory(store, embedder=earlier_hash()) as mem:
        await mem.open_repo(REPO)
        await fill(mem)
    async with mnemo.Memory(store) as mem:
        with pytest.raises(mnemo.EmbeddingError, match="earlier features") as refused:
            await mem.recall(REPO, "nginx port")
        assert "mnemo reembed r" in str(refused.value)
        assert "mem.reembed('r')" in str(refused.value)
        nodes = await mem.get_nodes_by_type(REPO, list(mnemo.NodeType))
        assert await mem.reembed(REPO) == len(nodes)
        assert "Nginx listens on port 8080 behind the proxy." in texts(
            await mem.recall(REPO, "which port does nginx listen on"))
        await all_of(mem, mnemo.HashEmbedder())
        assert await record(mem) == ("hash2", 512, 1)
    async with mnemo.Memory(store) as mem:
        assert "The kettle is on the stove in the kitchen." in texts(
            await mem.recall(REPO, "where is the kettle"))
        await mem.open_repo(REPO, embedder=mnemo.HashEmbedder())  # no refusal any more


async def test_a_repo_moves_to_an_embedder_of_another_dimension(store: str) -> None:
    """`reembed(embedder=...)` of another dimension: the repo takes it (vectors, record,
    dimension); the Memory's recall, appends and commits use it at once, and a Memory opened
    later without an embedder builds it from the record."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as mem:
        await mem.open_repo(REPO)
        await fill(mem)
        await mem.reembed(REPO, embedder=mnemo.HashEmbedder(32))
        assert await record(mem) == ("hash2:32", 32, 1)
        assert "Tomatoes need six hours of sun every day." in texts(
            await mem.recall(REPO, "how much sun for tomatoes"))
        sid = await mem.start_session("bake", repo=REPO)
        await mem.append(sid, "The oven heats to 220 degrees.", "preheat the oven")
        await mem.close_and_commit(sid)
        await all_of(mem, mnemo.HashEmbedder(32))
        with pytest.raises(mnemo.EmbeddingError, match="dimension 32"):
            await mem.open_repo(REPO, embedder=mnemo.HashEmbedder(64))
    async with mnemo.Memory(store) as mem:
        assert "The oven heats to 220 degrees." in texts(await mem.recall(REPO, "oven"))


async def test_the_repo_is_read_and_written_while_it_is_reembedded(store: str) -> None:
    """Between batches, another Memory recalls the repo (with its old vectors: found) and
    ingests into it, and a node already embedded is reworded (as an intent merge does); what
    was committed or changed meanwhile is embedded too before the switch, so the repo ends
    with every vector the new embedder's of its node's text now, none left of the old."""
    recalled: list[list[str]] = []
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as a, \
            mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as b:
        await a.open_repo(REPO)
        await fill(a)
        (first,), = await sql(a, "SELECT id FROM nodes WHERE repo = ? ORDER BY rowid LIMIT 1",
                              REPO)

        async def meanwhile(update: mnemo.ReembedProgress) -> None:
            if update.stage == "embedding" and update.done and not recalled:
                recalled.append(texts(await b.recall(REPO, "kettle stove", reinforce=False)))
                await b.ingest(REPO, mnemo.Trajectory("later", [mnemo.Step(
                    "The printer on the second floor is out of toner.", "order toner")]),
                    source_id="later")
                async with b._graph.lock(REPO):
                    await sql(b, "UPDATE nodes SET text = 'Bread rises overnight.' WHERE id = ?",
                              first)

        await a.reembed(REPO, embedder=mnemo.HashEmbedder(32), batch_size=2,
                        progress=meanwhile)
        assert "The kettle is on the stove in the kitchen." in recalled[0]
        await all_of(a, mnemo.HashEmbedder(32))
        assert "The printer on the second floor is out of toner." in texts(
            await a.recall(REPO, "printer toner"))


async def test_a_repo_written_to_faster_than_it_is_embedded_still_switches(store: str) -> None:
    """Another Memory commits between every two batches, more nodes each time than a batch
    holds: each pass stages the nodes the repo held when it began and leaves the newer ones to
    the next, so the re-embedding switches while the writer still writes (before, its first
    pass went on as long as the writer did) and ends with every vector the new embedder's."""
    written, at_switch = 0, []
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as a, \
            mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as b:
        await a.open_repo(REPO)
        await fill(a)

        async def writer(update: mnemo.ReembedProgress) -> None:
            nonlocal written
            if update.stage == "switching":
                at_switch.append(written)
            elif update.stage == "embedding" and update.done and written < WRITER_STOPS:
                written += 1
                await fill(b, start=written, count=1)

        await a.reembed(REPO, embedder=mnemo.HashEmbedder(32), batch_size=3, progress=writer)
        await all_of(a, mnemo.HashEmbedder(32))
    assert at_switch, written
    assert 0 < at_switch[0] < WRITER_STOPS, (at_switch[0], written)


# The writer above stops after this many commits (before, the re-embedding switched only then).
WRITER_STOPS = 300


async def test_the_progress_callback_never_runs_under_the_repos_lock(store: str) -> None:
    """A progress callback that ingests into the repo at every report succeeds each time, the
    switch's report among them: nothing is reported while the repo's lock is held (before, the
    "switching" report and every batch under the lock called it there: its ingest met the
    held lock, and a slow callback held every commit of the repo, in every process)."""
    stages: list[str] = []
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as mem:
        await mem.open_repo(REPO)
        await fill(mem)

        async def ingest_now(update: mnemo.ReembedProgress) -> None:
            await fill(mem, start=100 + len(stages), count=1)
            stages.append(update.stage)

        await mem.reembed(REPO, embedder=mnemo.HashEmbedder(32), batch_size=8,
                          progress=ingest_now)
        assert "switching" in stages
        assert stages[-1] == "done"
        await all_of(mem, mnemo.HashEmbedder(32))


class Paused:
    """A hashed embedder whose next call, once `armed`, waits for `go` (after setting
    `paused`)."""

    def __init__(self, dim: int) -> None:
        self.inner = mnemo.HashEmbedder(dim)
        self.name, self.dim = self.inner.name, dim
        self.armed, self.paused, self.go = False, anyio.Event(), anyio.Event()

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.armed:
            self.armed = False
            self.paused.set()
            await self.go.wait()
        return await self.inner.embed(texts)


async def test_a_forget_whose_wording_was_embedded_before_a_switch_writes_nothing_of_it(
    store: str,
) -> None:
    """B forgets a source whose shared intent takes another source's wording; B embeds the
    wording with the repo's embedder, then A switches the repo to another dimension before B
    takes the lock. B's forget deletes nothing and says why (B was given the old embedder;
    a Memory given none would run again with the new one); the repo stays whole, and A's
    forget then succeeds. Before, B wrote the old dimension's vector into the repo, and every
    recall and ingest after it failed with a reshape error, in every Memory."""
    deploy = [("The deploy script is in ops/deploy.sh.", "run the deploy script", "a"),
              ("The deploy script is in ops/deploy.sh.", "run the deploy script now", "b")]
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as mem:
        await mem.open_repo(REPO)
        for observation, action, source in deploy:
            await mem.ingest(REPO, mnemo.Trajectory("deploy the web service", [
                mnemo.Step(observation, action)]), source_id=source)
        await fill(mem)
    paused = Paused(64)
    async with mnemo.Memory(store, embedder=paused) as b, mnemo.Memory(store) as a:
        refused: list[BaseException] = []
        paused.armed = True
        async with anyio.create_task_group() as tg:
            async def forget() -> None:
                with pytest.raises(mnemo.EmbeddingError, match="re-embedded") as caught:
                    await b.forget(REPO, "a")
                refused.append(caught.value)

            tg.start_soon(forget)
            await paused.paused.wait()  # B embedded the heir's wording: not yet written
            await a.reembed(REPO, embedder=mnemo.HashEmbedder(32))
            paused.go.set()
        assert refused
        await all_of(a, mnemo.HashEmbedder(32))
        assert await a.forget(REPO, "a") > 0
        await all_of(a, mnemo.HashEmbedder(32))
        await a.ingest(REPO, mnemo.Trajectory("fuses", [mnemo.Step(
            "The fuse box is in the cellar.", "check the fuses")]), source_id="z")
        assert "The fuse box is in the cellar." in texts(await a.recall(REPO, "fuse box"))


class Failing:
    """A hashed embedder that fails from its `after`-th call on (a fault between batches)."""

    def __init__(self, dim: int, after: int) -> None:
        self.inner = mnemo.HashEmbedder(dim)
        self.name, self.dim = self.inner.name, dim
        self.after, self.calls = after, 0

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        if self.calls >= self.after:
            raise RuntimeError("the embedding server went away")
        return await self.inner.embed(texts)


async def test_a_reembedding_cut_short_leaves_the_repo_as_it_was_and_carries_on(
    store: str,
) -> None:
    """An embedder that fails after some batches: `reembed` raises EmbeddingError, the repo
    keeps its old vectors and record (recall finds with them); run again with the same
    embedder, it carries on from what it staged (embedding only the rest) and switches."""
    events: list[mnemo.Event] = []
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64),
                            on_event=events.append) as mem:
        await mem.open_repo(REPO)
        await fill(mem)
        total = len(await mem.get_nodes_by_type(REPO, list(mnemo.NodeType)))
        failing = Failing(32, after=3)
        with pytest.raises(mnemo.EmbeddingError, match="went away"):
            await mem.reembed(REPO, embedder=failing, batch_size=2)
        assert await record(mem) == ("hash2:64", 64, 0)
        await all_of(mem, mnemo.HashEmbedder(64))
        assert "Nginx listens on port 8080 behind the proxy." in texts(
            await mem.recall(REPO, "nginx port"))
        staged = len(await sql(mem, "SELECT * FROM staged_vectors"))
        assert staged == 4
        counting = Failing(32, after=10**6)
        assert await mem.reembed(REPO, embedder=counting, batch_size=2) == total
        assert counting.calls == -(-(total - staged) // 2)
        assert [e.data["resumed"] for e in events if e.kind == "repo_reembedded"] == [True]
        await all_of(mem, mnemo.HashEmbedder(32))


async def test_a_memory_open_before_runs_the_new_embedder_after(store: str) -> None:
    """B, open on the store before A re-embeds the repo (B holds the old vectors in memory
    and a session with steps embedded the old way): after the switch, B's recall runs the
    new embedder, its session's commit embeds its changeset again, its ingest embeds with
    the new one: every vector in the store is the new embedder's."""
    async with mnemo.Memory(store) as b:
        async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as a:
            await a.open_repo(REPO)
            await fill(a)
            await b.recall(REPO, "nginx", reinforce=False)
            sid = await b.start_session("garden", repo=REPO)
            await b.append(sid, "The roses need pruning in March.", "prune the roses")
            await a.reembed(REPO, embedder=mnemo.HashEmbedder(32))
        assert "The kettle is on the stove in the kitchen." in texts(
            await b.recall(REPO, "kettle stove"))
        await b.append(sid, "The roses bloom in June.", "photograph the roses")
        await b.close_and_commit(sid)
        await fill(b, start=len(FACTS), count=1)
        await all_of(b, mnemo.HashEmbedder(32))
        assert "The roses need pruning in March." in texts(await b.recall(REPO, "roses"))


async def ready_session(mem: mnemo.Memory) -> str:
    """A session of the repo closed and extracted: its changeset embedded and stored, ready
    to commit."""
    sid = await mem.start_session("tea", repo=REPO)
    await mem.append(sid, "The teapot is in the cupboard.", "fetch the teapot")
    await mem.close(sid)
    while await mem.session_state(sid) is mnemo.State.EXTRACTING:
        await anyio.wait_all_tasks_blocked()
    assert await mem.session_state(sid) is mnemo.State.READY
    return sid


async def test_a_ready_changeset_made_before_the_switch_is_embedded_again(store: str) -> None:
    """A session ready to commit (its changeset embedded with the old embedder and stored)
    when the repo is re-embedded commits vectors of the new one."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as mem:
        await mem.open_repo(REPO)
        await fill(mem, count=2)
        sid = await ready_session(mem)
        await mem.reembed(REPO, embedder=mnemo.HashEmbedder(32))
        receipt = await mem.commit(sid)
        assert receipt is not None
        await all_of(mem, mnemo.HashEmbedder(32))


async def test_a_ready_changeset_stored_before_the_switch_commits_new_vectors_later(
    store: str,
) -> None:
    """A ready changeset is stored with the generation it was embedded for; the Memory
    closes, another re-embeds the repo, and the next Memory's commit of it (read back from
    the store) writes vectors of the new embedder."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as mem:
        await mem.open_repo(REPO)
        await fill(mem, count=1)
        sid = await ready_session(mem)
    async with mnemo.Memory(store) as other:
        await other.reembed(REPO, embedder=mnemo.HashEmbedder(32))
    async with mnemo.Memory(store) as mem:
        await mem.open_repo(REPO)
        assert await mem.commit(sid) is not None
        await all_of(mem, mnemo.HashEmbedder(32))
        assert "The teapot is in the cupboard." in texts(await mem.recall(REPO, "teapot"))


async def test_reembed_refusals(store: str, tmp_path: Path) -> None:
    """An unknown repo (NotFoundError), an inspecting Memory (StorageError "read_only": it
    records no model), an embedder that is none, one whose `dim` is missing or no whole number
    from 1 to 16,000 (also refused by open_repo), or a batch size out of bounds
    (InvalidInputError), and a repo whose own embedder cannot be built here (EmbeddingError
    naming the variable) are refused before anything is staged."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as mem:
        await mem.open_repo(REPO)
        await fill(mem, count=1)
        with pytest.raises(mnemo.NotFoundError):
            await mem.reembed("nowhere")
        with pytest.raises(mnemo.InvalidInputError):
            await mem.reembed(REPO, embedder="hash2:32")  # type: ignore[arg-type]
        for size in (0, 10**6, True):
            with pytest.raises(mnemo.InvalidInputError, match="batch_size"):
                await mem.reembed(REPO, batch_size=size)
        for dim in (None, 0, -1, "16", True, 16.0, 10**6, "missing"):
            odd = Renamed(16, "odd")
            if dim == "missing":
                del odd.dim
            else:
                odd.dim = dim  # type: ignore[assignment]
            with pytest.raises(mnemo.InvalidInputError, match="dim"):
                await mem.reembed(REPO, embedder=odd)
            with pytest.raises(mnemo.InvalidInputError, match="dim"):
                await mem.open_repo("another", embedder=odd)
        assert not await sql(mem, "SELECT * FROM reembeds")
        assert await sql(mem, "SELECT name FROM repos") == [(REPO,)]
    async with mnemo.Memory(store, inspect=True) as mem:
        with pytest.raises(mnemo.StorageError, match="inspect=True") as read_only:
            await mem.reembed(REPO, embedder=mnemo.HashEmbedder(32))
        assert read_only.value.reason == "read_only"
    await sql_set_embedder(store, "openai:text-embedding-3-small")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("OPENAI_API_KEY", raising=False)
        async with mnemo.Memory(store) as mem:
            with pytest.raises(mnemo.EmbeddingError, match="OPENAI_API_KEY"):
                await mem.reembed(REPO)
            assert not await sql(mem, "SELECT * FROM reembeds")
    async with mnemo.Memory(store) as mem:
        assert (await record(mem))[1:] == (64, 0)


async def sql_set_embedder(store: str, uri: str) -> None:
    async with mnemo.Memory(store, inspect=True) as mem:
        await sql(mem, "UPDATE repos SET embedder = ? WHERE name = ?", uri, REPO)


ROOT = Path(__file__).resolve().parents[2]


async def sessions_of_the_dead_ended(store: str) -> None:
    """PostgreSQL: ends the server's sessions of the killed process, and returns once they
    are gone (a session whose client died holds its locks, the re-embedding's among them,
    until the server notices: at its next read of the socket, so, mid-statement, at the
    statement's end). SQLite's lock files are let go with the process."""
    if not store.startswith("postgresql"):
        return
    async with await psycopg.AsyncConnection.connect(store, autocommit=True) as conn:
        await conn.execute(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()")


def spawn(store: str, pause_at: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.graph.reembed_child", store, str(pause_at)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )


@pytest.mark.slow
async def test_a_process_killed_while_it_reembeds_leaves_the_repo_whole(store: str) -> None:
    """A process re-embedding the repo is SIGKILLed, first between two batches, then at
    random moments (the switch among them): each time the repo is whole, all its vectors
    of one embedder under that embedder's record; the next re-embedding (once the server
    has ended the dead process's sessions, on PostgreSQL) carries on and ends with every
    vector the new embedder's."""
    async with mnemo.Memory(store, embedder=earlier_hash(64)) as mem:
        await mem.open_repo(REPO)
        await fill(mem, count=12)
    # Paused after its third batch, then running free, killed once it has said it went on.
    for pause_at, lines in ((3, 3), (0, 1), (0, 4)):
        child = spawn(store, pause_at)
        try:
            assert child.stdout is not None
            for _ in range(lines):
                line = await anyio.to_thread.run_sync(child.stdout.readline)
                assert line.startswith((b"batch", b"switching", b"indexing", b"done")), (
                    "the child died")
        finally:
            child.kill()
            child.wait()
            for pipe in (child.stdin, child.stdout):
                if pipe is not None:
                    pipe.close()
        await sessions_of_the_dead_ended(store)
        async with mnemo.Memory(store, inspect=True) as mem:
            embedder, dim, _ = await record(mem)
            assert (embedder, dim) in {("hash:64", 64), ("hash2:32", 32)}
            if dim == 64:
                await all_of(mem, earlier_hash(64))
            else:
                await all_of(mem, mnemo.HashEmbedder(32))
    async with mnemo.Memory(store) as mem:
        # Carries on with what the last child staged (or, if that one switched first, makes
        # the vectors once more with the same embedder).
        await mem.reembed(REPO, embedder=mnemo.HashEmbedder(32))
        await all_of(mem, mnemo.HashEmbedder(32))
        assert (await record(mem))[:2] == ("hash2:32", 32)
        assert not await sql(mem, "SELECT * FROM staged_vectors")


class Renamed:
    """The hashed embedder under another name: another embedder, as far as a record says."""

    def __init__(self, dim: int, name: str) -> None:
        self.inner = mnemo.HashEmbedder(dim)
        self.name, self.dim = name, dim

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return await self.inner.embed(texts)


async def test_reembed_without_an_embedder_takes_the_one_the_memory_was_given(
    store: str,
) -> None:
    """A Memory given an embedder re-embeds with it when `reembed` names none (not with the
    repo's own): the record then names it."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as mem:
        await mem.open_repo(REPO)
        await fill(mem, count=1)
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(32)) as mem:
        await mem.reembed(REPO)
        assert await record(mem) == ("hash2:32", 32, 1)
        await all_of(mem, mnemo.HashEmbedder(32))


async def test_a_memory_given_another_embedder_does_not_write_a_repo_reembedded_since(
    store: str,
) -> None:
    """B was given the hashed embedder; A re-embeds the repo with another embedder of the
    same dimension. B's recall, ingest and open_repo with its embedder then refuse, saying
    so (its vectors would not compare with the repo's), and the record stays A's."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as b:
        await b.open_repo(REPO)
        await fill(b, count=1)
        async with mnemo.Memory(store) as a:
            await a.reembed(REPO, embedder=Renamed(64, "other-64"))
        with pytest.raises(mnemo.EmbeddingError, match="re-embedded with other-64 since"):
            await b.recall(REPO, "nginx")
        with pytest.raises(mnemo.EmbeddingError, match="re-embedded with other-64 since"):
            await fill(b, start=1, count=1)
        await b.open_repo(REPO)
        assert await record(b) == ("other-64", 64, 1)
