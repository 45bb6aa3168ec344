"""In-memory vectors follow the store, whoever wrote to it (mnemo/storage/vector_log.py).

SQLite keeps every repo's vectors in memory, PostgreSQL its tags' and intents'. Each Memory
kept them in step with its own writes only; these tests (regressions,
each failing before the fix) write through one Memory and read or commit through another
that had its vectors loaded already. Then the bookkeeping itself, against a reference.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import numpy as np
import pytest
from hypothesis import given, strategies as st

import mnemo
from mnemo.graph.model import NodeType
from mnemo.graph.vectors import VectorIndex
from mnemo.storage import vector_log
from mnemo.storage.vector_log import Change, Reload, RepoVectors, VectorCache
from tests.backends import sql
from tests.graph._support import pairwise

REPO = "r"
N = NodeType
TEA = ("The kettle is on the stove.", "boil water for tea")


def trajectory(goal: str, *steps: tuple[str, str]) -> mnemo.Trajectory:
    return mnemo.Trajectory(goal, [mnemo.Step(obs, act) for obs, act in steps])


def memory(store: str) -> mnemo.Memory:
    return mnemo.Memory(store, embedder=mnemo.HashEmbedder(64))


async def committed(mem: mnemo.Memory, goal: str, observation: str, action: str) -> str:
    """One step through a session, committed (no ingest source); the session's id."""
    session = await mem.start_session(goal, repo=REPO)
    await mem.append(session, observation, action)
    await mem.close_and_commit(session)
    return session


async def loaded(mem: mnemo.Memory) -> None:
    """Opens the repo, stores a first trajectory and recalls: the Memory's vectors are in
    memory from here on."""
    await mem.open_repo(REPO)
    await mem.ingest(REPO, trajectory("grow tomatoes", ("Tomatoes need six hours of sun.",
                                                        "water the tomatoes")), source_id="a0")
    await mem.recall(REPO, "tomatoes", reinforce=False)


async def test_a_commit_after_another_memory_forgot_its_intent(store: str) -> None:
    """Regression: B forgets the source whose intent A holds in memory; A's next commit of
    a step with that intent matched it, linked the deleted id and failed (a foreign-key
    `StorageError`) at every retry."""
    async with memory(store) as a, memory(store) as b:
        await loaded(a)
        await a.ingest(REPO, trajectory("make tea", TEA), source_id="s")
        await b.forget(REPO, "s")
        receipt = await a.ingest(REPO, trajectory("make tea", TEA), source_id="s2")
        assert receipt.created
        found = await a.recall(REPO, "kettle stove", reinforce=False)
        assert "The kettle is on the stove." in {m.node.text for m in found.memories}


async def test_an_intent_another_memory_committed_is_deduplicated(store: str) -> None:
    """Regression: an intent committed through B was not in A's vectors, so A's commit of
    the same intent added a second one (one Memory keeps one)."""
    async with memory(store) as a, memory(store) as b:
        await loaded(a)
        await b.ingest(REPO, trajectory("make tea", TEA), source_id="b1")
        await a.ingest(REPO, trajectory("make tea again", TEA), source_id="a1")
        intents = Counter(n.text for n in await a.get_nodes_by_type(REPO, [N.INTENT]))
        assert max(intents.values()) == 1, intents


BEES = ("Bees make their honey in the summer months.", "Bees make our honey in the summer months.")


async def test_recall_and_consolidate_see_what_another_memory_committed(store: str) -> None:
    """Regression (SQLite): recall through A missed B's nodes in its dense channel, and A's
    consolidate never compared B's new facts, duplicates of one source. Two wordings alike to
    the embedder (one vector) but not to a commit's dedup (each has a word the other lacks)."""
    fact, other = BEES
    async with memory(store) as a, memory(store) as b:
        await loaded(a)
        await a.consolidate(REPO)
        await b.ingest(REPO, trajectory("bees", (fact, "note it"), (other, "note it again")),
                       source_id="bees")
        vectors = await a._graph.search_vectors(
            REPO, mnemo.HashEmbedder(64).embed_sync([fact])[0], 50)
        facts = [n for n in await b.get_nodes_by_type(REPO, [N.SEMANTIC])
                 if n.text in (fact, other)]
        assert len(facts) == 2
        assert {n.id for n in facts} <= {node_id for node_id, _ in vectors}
        report = await a.consolidate(REPO)
        assert report.merged == 1
        left = [n for n in await b.get_nodes_by_type(REPO, [N.SEMANTIC])
                if n.text in (fact, other)]
        assert len(left) == 1


async def test_consolidate_leaves_the_facts_of_two_sessions_apart(store: str) -> None:
    """The same fact in two sessions' words stays two facts (each session is a source), so
    forgetting one session leaves the other's."""
    fact, other = BEES
    async with memory(store) as mem:
        await loaded(mem)
        first = await committed(mem, "bees", fact, "note it")
        await committed(mem, "bees again", other, "note it again")
        assert (await mem.consolidate(REPO)).merged == 0
        await mem.forget(REPO, first)
        assert [n.text for n in await mem.get_nodes_by_type(REPO, [N.SEMANTIC])
                if n.text in BEES] == [other]


async def test_a_recall_looks_at_the_log_once_and_sees_what_was_written_before(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recall brings the vectors up once, at its start (not at each of its five to seven
    uses), and its dense channel finds a node another Memory committed before it began."""
    looks: list[int] = []
    moved = vector_log.moved

    def counted(since: int, seq: int, horizon: int) -> bool:
        looks.append(seq)
        return moved(since, seq, horizon)

    fact = "Bees make honey in the summer months."
    async with memory(store) as a, memory(store) as b:
        await loaded(a)
        receipt = await b.ingest(REPO, trajectory("bees", (fact, "note it")), source_id="b1")
        monkeypatch.setattr(vector_log, "moved", counted)
        found = await a.recall(REPO, fact, reinforce=False)
        assert len(looks) == 1
        phases = {t.node_id: t.phase for t in found.touched}
        facts = [n for n in await a.get_nodes_by_type(REPO, [N.SEMANTIC]) if n.text == fact]
        assert [f.id for f in facts] == [i for i in receipt.node_ids if i == facts[0].id]
        assert phases[facts[0].id] in {"dense", "hybrid"}


async def test_a_memory_behind_the_logs_horizon_loads_its_vectors_again(store: str) -> None:
    """A Memory whose vectors are older than what the node log keeps loads them again."""
    async with memory(store) as a, memory(store) as b:
        await loaded(a)
        await b.ingest(REPO, trajectory("make tea", TEA), source_id="b1")
        # As if B had written more than the log keeps since A last looked.
        await sql(b, "UPDATE lexical_repos SET horizon = seq + 1, seq = seq + 1")
        await a.ingest(REPO, trajectory("make tea again", TEA), source_id="a1")
        intents = Counter(n.text for n in await a.get_nodes_by_type(REPO, [N.INTENT]))
        assert max(intents.values()) == 1, intents


# ---- the bookkeeping, against a reference -------------------------------------------------

DIM = 4
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(1, 6), st.sampled_from("abcdefgh"),
                  st.sampled_from([N.TAG, N.INTENT, N.SEMANTIC])),
        st.tuples(st.just("delete"), st.integers(1, 6)),
        st.just(("look",)),
    ),
    max_size=40,
)


def _vector(node_id: str) -> np.ndarray:
    out = np.zeros(DIM, dtype=np.float32)
    out["abcdefgh".index(node_id) % DIM] = 1.0
    return out


@given(_ops, st.booleans())
def test_followed_vectors_are_the_stores_at_every_look(script: list[Any], routes: bool) -> None:
    """A store's nodes (rowid -> id, type) change by puts (a new node, or a rowid taken by
    another node after a delete) and deletes; at each look the changed rowids are applied as
    the store holds them then. The index then holds exactly the store's nodes (of the kept
    types), each with its own vector."""
    kinds = (N.TAG, N.INTENT) if routes else None
    store: dict[int, tuple[str, NodeType]] = {}
    changed: set[int] = set()
    followed = RepoVectors(VectorIndex(DIM), 0, kinds)
    seq = 0
    for op in [*script, ("look",)]:
        if op[0] == "put":
            _, rowid, node_id, kind = op
            for other, (held, _) in list(store.items()):
                if held == node_id:  # an id lives at one rowid
                    del store[other]
                    changed.add(other)
            store[rowid] = (node_id, kind)
            changed.add(rowid)
            seq += 1
        elif op[0] == "delete":
            if store.pop(op[1], None) is not None:
                changed.add(op[1])
                seq += 1
        else:
            if followed.behind(seq, 0):
                changes: list[Change] = [
                    (r, *((store[r][0], store[r][1].value, _vector(store[r][0]))
                          if r in store else (None, None, None)))
                    for r in changed
                ]
                followed.apply(seq, changes)
            changed.clear()
            wanted = {i: k for i, k in store.values() if kinds is None or k in kinds}
            assert set(followed.index._rows) == set(wanted)
            for node_id in wanted:
                np.testing.assert_array_equal(followed.index.get(node_id), _vector(node_id))


def test_a_log_that_no_longer_reaches_back_asks_for_a_reload() -> None:
    followed = RepoVectors(VectorIndex(DIM), 5)
    assert not followed.behind(5, 3)
    assert followed.behind(7, 5)
    with pytest.raises(Reload):
        followed.behind(9, 6)  # entries 6.. only: the cache's 5 is gone
    with pytest.raises(Reload):
        followed.behind(3, 0)  # the store went back (restored): not this cache's past


async def test_one_look_holds_inside_its_block_and_its_tasks_only() -> None:
    """A `reading` block looks at the log once, at its start: inside it (a nested block and
    tasks started there too) the uses skip the log; after it, even in a task started inside
    that outlives it, a use looks again; another cache or repo always does."""
    looks: list[str] = []
    ended = anyio.Event()

    async def changes(repo: str, followed: RepoVectors) -> tuple[int, list[Change]] | None:
        looks.append(repo)
        return None

    async def load(repo: str) -> RepoVectors:
        return RepoVectors(VectorIndex(4), 0)

    owner, other = VectorCache(changes, load), VectorCache(changes, load)
    for repo in (REPO, "another"):
        await owner.index(repo)  # loaded: each later use looks at the log
        await other.index(repo)
    looks.clear()

    async def outliving() -> None:
        await owner.index(REPO)
        await ended.wait()
        await owner.index(REPO)

    async with anyio.create_task_group() as tg:
        async with owner.reading(REPO):
            assert looks == [REPO]
            async with owner.reading(REPO):  # nested: no second look
                await owner.index(REPO)
            await other.index(REPO)
            await owner.index("another")
            assert looks == [REPO, REPO, "another"]
            tg.start_soon(outliving)
            await anyio.wait_all_tasks_blocked()
        assert looks == [REPO, REPO, "another"]
        ended.set()
    assert looks == [REPO, REPO, "another", REPO]


def _unit(*pairs: tuple[int, float], dim: int = 64) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    for i, w in pairs:
        v[i] += w
    return v / np.linalg.norm(v)


async def test_a_rewording_caught_up_in_place_is_not_overwritten_by_a_stale_merge(
    store: str,
) -> None:
    """Regression: A resolves its intents before its
    lock; meanwhile B rewords intent X. Under the lock A caught B's rewording up, in place,
    and the index kept its snapshot, so A reused the merge it had decided against X's old
    text and overwrote B's wording. A replaced row is a new snapshot: A decides again."""
    from mnemo.graph.model import Changeset, NodeDraft
    from mnemo.graph.ports import IntentPolicy

    def intent(node_id: str, text: str, vector: np.ndarray) -> NodeDraft:
        return NodeDraft(id=node_id, type=N.INTENT, text=text, data={}, vector=vector)

    async def keep(existing: str, new: str) -> None:
        return None

    async def b_merge(existing: str, new: str) -> tuple[str, np.ndarray]:
        return "boil water (B's wording)", _unit((0, 1.0), (2, 0.3))

    async with memory(store) as a, memory(store) as b:
        await a.open_repo(REPO)
        await b.open_repo(REPO)
        ga, gb = a._graph, b._graph
        await gb.apply(Changeset("c0", REPO, [intent("X", "boil water", _unit((0, 1.0)))]),
                       intents=IntentPolicy(0.95, 0.8, merge=pairwise(keep)))
        await a.recall(REPO, "boil water", reinforce=False)  # A's vectors are loaded
        asked: list[tuple[str, str]] = []

        async def a_merge(existing: str, new: str) -> tuple[str, np.ndarray]:
            asked.append((existing, new))
            if len(asked) == 1:  # while A decides, before its lock: B rewords X
                await gb.apply(
                    Changeset("cb", REPO, [intent("E", "boil some water",
                                                  _unit((0, 1.0), (2, 0.6)))]),
                    intents=IntentPolicy(0.95, 0.8, merge=pairwise(b_merge)))
            return f"merged[{existing} + {new}]", _unit((0, 1.0), (1, 0.3))

        await ga.apply(Changeset("ca", REPO, [intent("D", "boil cold water",
                                                     _unit((0, 1.0), (1, 0.6)))]),
                       intents=IntentPolicy(0.95, 0.8, merge=pairwise(a_merge)))
        x = await a.get_node(REPO, "X")
        assert x is not None
        assert "B's wording" in x.text, (x.text, asked)


def test_rows_replaced_in_place_are_a_new_snapshot() -> None:
    index = VectorIndex(DIM)
    index.add(["a"], [N.INTENT], np.eye(DIM, dtype=np.float32)[:1])
    before = index.snapshot()
    index.add(["a"], [N.INTENT], np.eye(DIM, dtype=np.float32)[1:2])
    assert index.snapshot() is not before
