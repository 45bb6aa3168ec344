"""Scopes: the metadata a session or an ingest gives every node it commits, and `where=`
selecting by it in recall, search and forget (mnemo/graph/scope.py, mnemo/storage/graph_base.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import mnemo
from mnemo.graph import scope as scopes
from mnemo.graph.model import Changeset, NodeDraft
from tests.backends import open_stores
from tests.conftest import REPO
from tests.fakes import FakeEmbedder, FakeLLM
from tests.graph._support import DIM, policy

N = mnemo.NodeType


def trajectory(*observations: str, goal: str = "explore") -> mnemo.Trajectory:
    return mnemo.Trajectory(goal, [mnemo.Step(o, f"do {o}") for o in observations])


async def _ingest(mem: mnemo.Memory, source: str, user: str, *observations: str) -> list[str]:
    receipt = await mem.ingest(REPO, trajectory(*observations), source_id=source,
                               metadata={"user_id": user, "turn": 1})
    return list(receipt.node_ids)


async def test_every_node_of_an_ingest_carries_its_metadata(mem: mnemo.Memory) -> None:
    """Each node an ingest commits has the ingest's metadata as `Node.metadata`; others {}."""
    scoped = await _ingest(mem, "a", "alice", "the kettle is blue")
    plain = await mem.ingest(REPO, trajectory("the kettle is red"), source_id="b")
    for node_id in scoped:
        node = await mem.get_node(REPO, node_id)
        assert node is not None
        assert node.metadata == {"user_id": "alice", "turn": 1}
    for node_id in plain.node_ids:
        node = await mem.get_node(REPO, node_id)
        assert node is not None
        assert node.metadata == {}


async def test_a_session_s_nodes_carry_its_metadata(mem: mnemo.Memory) -> None:
    """start_session(metadata=) reaches every node its commit adds."""
    sid = await mem.start_session("cook", repo=REPO, metadata={"user_id": "bob", "vip": True})
    await mem.append(sid, "the stove is hot", "turn it down")
    receipt = await mem.close_and_commit(sid)
    assert receipt.node_ids
    for node in await mem.get_nodes_by_type(REPO, list(N)):
        assert node.metadata == {"user_id": "bob", "vip": True}


async def test_recall_where_returns_only_the_scope(mem: mnemo.Memory) -> None:
    """A recall with where= returns and touches nothing outside the scope; a list of values
    means any of them; a scope with no node returns nothing."""
    alice = set(await _ingest(mem, "a", "alice", "the kettle is blue", "the door is open"))
    bob = set(await _ingest(mem, "b", "bob", "the kettle is red", "the door is shut"))
    everyone = await mem.recall(REPO, "kettle door", k=20)
    assert {m.node.id for m in everyone.memories} & bob  # unfiltered, bob's are found
    mine = await mem.recall(REPO, "kettle door", k=20, where={"user_id": "alice"})
    assert mine.memories
    assert {m.node.id for m in mine.memories} <= alice
    assert {t.node_id for t in mine.touched} <= alice
    both = await mem.recall(REPO, "kettle", k=20, where={"user_id": ["alice", "bob"]})
    assert {m.node.id for m in both.memories} & alice
    assert {m.node.id for m in both.memories} & bob
    none = await mem.recall(REPO, "kettle", where={"user_id": "carol"})
    assert none.memories == []
    assert none.touched == []
    typed = await mem.recall(REPO, "kettle", where={"turn": 1.0, "user_id": "bob"})
    assert typed.memories
    assert {m.node.id for m in typed.memories} <= bob
    assert (await mem.recall(REPO, "kettle", where={"turn": "1"})).memories == []


async def test_recall_in_context_and_search_nodes_take_where(mem: mnemo.Memory) -> None:
    """recall_in_context and search_nodes keep to the scope too."""
    alice = set(await _ingest(mem, "a", "alice", "the kettle is blue"))
    await _ingest(mem, "b", "bob", "the kettle is red")
    found = await mem.search_nodes(REPO, "kettle", where={"user_id": "alice"})
    assert found
    assert {n.id for n in found} <= alice
    sid = await mem.start_session("tea", repo=REPO)
    hits = await mem.recall_in_context(REPO, sid, "kettle", where={"user_id": "alice"})
    assert hits.memories
    assert {m.node.id for m in hits.memories} <= alice


async def test_forget_where_erases_the_scope_only(mem: mnemo.Memory) -> None:
    """forget_where erases every node of the scope (and the sources' ids are free again);
    the other scopes keep theirs."""
    await _ingest(mem, "a", "alice", "the kettle is blue")
    await _ingest(mem, "a2", "alice", "the toaster is green")
    bob = set(await _ingest(mem, "b", "bob", "the kettle is red"))
    gone = await mem.forget_where(REPO, {"user_id": "alice"})
    assert gone > 0
    left = {n.id for n in await mem.get_nodes_by_type(REPO, list(N))}
    assert bob <= left
    assert all(n.metadata.get("user_id") != "alice"
               for n in await mem.get_nodes_by_type(REPO, list(N)))
    assert (await mem.recall(REPO, "kettle toaster", where={"user_id": "alice"})).memories == []
    again = await mem.ingest(REPO, trajectory("the kettle is blue"), source_id="a",
                             metadata={"user_id": "alice", "turn": 1})
    assert again.created


async def test_values_and_names_at_their_bounds_are_scoped_on_every_backend(
    mem: mnemo.Memory
) -> None:
    """Metadata at its bounds in the widest encodings (512 astral, control or BMP characters, 64
    CJK keys) in a repo of the longest name is stored, selected and erased by `where`; a
    value one character off is another scope."""
    repo = "仓" * 333
    await mem.open_repo(repo)
    rng = random.Random(7)
    ranges = [(0x1F300, 0x1FAFF), (1, 32), (0x100, 0xD7FF)]
    wide: dict[str, str | int | float | bool] = {
        "键" * 63 + str(i): "".join(chr(rng.randrange(low, high)) for _ in range(512))
        for i, (low, high) in enumerate(ranges)} | {"n": 2**63 - 1, "m": -(2**63)}
    for source, metadata in (("a", wide), ("b", {**wide, "键" * 63 + "0": "😀"})):
        step = mnemo.Step(f"the kettle of {source} is blue", "look")
        await mem.ingest(repo, mnemo.Trajectory("look", [step]), source_id=source,
                         metadata=metadata)
    found = await mem.recall(repo, "kettle", k=20, where=wide)
    assert found.memories
    assert all(m.node.metadata == wide for m in found.memories)
    assert await mem.search_nodes(repo, "kettle", where={"键" * 63 + "1": wide["键" * 63 + "1"]})
    assert await mem.forget_where(repo, wide) > 0
    left = await mem.get_nodes_by_type(repo, list(N))
    assert left
    assert all(n.metadata["键" * 63 + "0"] == "😀" for n in left)


async def test_tags_are_not_shared_across_scopes(mem: mnemo.Memory, llm: FakeLLM) -> None:
    """A tag of one label in two scopes is two nodes, each of its own scope."""
    await _ingest(mem, "a", "alice", "the kettle is blue")
    await _ingest(mem, "b", "bob", "the kettle is blue")
    tags = await mem.get_nodes_by_type(REPO, [N.TAG])
    by_label: dict[str, list[dict[str, object]]] = {}
    for tag in tags:
        by_label.setdefault(tag.text.lower(), []).append(dict(tag.metadata))
    for owners in by_label.values():
        assert len({str(sorted(o.items())) for o in owners}) == len(owners)


@pytest.mark.parametrize("bad", [
    "alice", {"": 1}, {"k": None}, {"k": [1]}, {"k": float("nan")}, {"k": "x" * 600},
    {f"k{i}": 1 for i in range(40)}, {"k" * 100: 1}, {"k": 2**63}, {"k": -(2**63) - 1},
])
async def test_bad_metadata_is_refused_before_anything_is_stored(
    mem: mnemo.Memory, bad: object
) -> None:
    """A metadata that is not a bounded flat dict of scalars is InvalidInputError, nothing
    stored."""
    with pytest.raises(mnemo.InvalidInputError):
        await mem.ingest(REPO, trajectory("x"), source_id="s", metadata=bad)  # type: ignore[arg-type]
    with pytest.raises(mnemo.InvalidInputError):
        await mem.start_session("g", repo=REPO, metadata=bad)  # type: ignore[arg-type]
    assert await mem.get_nodes_by_type(REPO, list(N)) == []
    assert await mem.list_sessions() == []


async def test_a_metadata_value_past_its_bound_names_that_bound(mem: mnemo.Memory) -> None:
    """A metadata value past 512 characters is refused naming that bound, not `Config`'s
    text bound (which does not govern it, and which it named)."""
    with pytest.raises(mnemo.InvalidInputError) as refused:
        await mem.start_session("g", repo=REPO, metadata={"k": "x" * 600})
    assert "more than the 512 allowed" in str(refused.value)
    assert "max_text_chars" not in str(refused.value)


@pytest.mark.parametrize("bad", [
    "alice", {"k": []}, {"k": {"a": 1}}, {1: "a"}, {"k": None}, {"k": [1, 2**64]}])
async def test_bad_where_is_refused(mem: mnemo.Memory, bad: object) -> None:
    """A malformed where is InvalidInputError for recall, search_nodes and forget_where."""
    with pytest.raises(mnemo.InvalidInputError):
        await mem.recall(REPO, "q", where=bad)  # type: ignore[arg-type]
    with pytest.raises(mnemo.InvalidInputError):
        await mem.search_nodes(REPO, "q", where=bad)  # type: ignore[arg-type]
    with pytest.raises(mnemo.InvalidInputError):
        await mem.forget_where(REPO, bad)  # type: ignore[arg-type]


def test_values_keep_their_json_type() -> None:
    """1, True and "1" are three values; an integral float is its integer."""
    where = scopes.check_where({"k": [1, True, "1", 2.0]})
    assert where == {"k": tuple(sorted(['1', 'true', '"1"', '2']))}
    assert scopes.matches({"k": 2}, where)
    assert not scopes.matches({"k": "2"}, where)
    assert scopes.check_where({}) is None
    assert scopes.check_where({"k": [2**63 - 1, 2.0**63]}) == {
        "k": ("9223372036854775807", "9223372036854775808")}


@pytest.mark.parametrize(
    "big", [2**63, -(2**63) - 1, 10**5000], ids=["2**63", "-2**63-1", "10**5000"])
def test_an_int_past_64_bits_is_refused_naming_the_range(big: int) -> None:
    """An int past 64 bits, in a metadata or a where, is refused naming the range an int must
    be in, never the int (it may be millions of digits long) nor its bit length."""
    for check in (scopes.check_metadata, scopes.check_where):
        with pytest.raises(mnemo.InvalidInputError) as refused:
            check({"k": big})
        assert str(refused.value).endswith("must be an int between -2**63 and 2**63 - 1")


@pytest.mark.parametrize("path", ["store's own search", "scope too large to list"])
async def test_every_search_path_keeps_to_the_scope(
    store: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the lexical index (the store's full-text search with the scope's condition),
    and for a scope past SCOPE_LIMIT (the repo's search widened, then cut to the scope),
    recall and search_nodes return only the scope's nodes."""
    config = mnemo.Config(lexical_dir="") if path == "store's own search" else None
    if path == "scope too large to list":
        monkeypatch.setattr("mnemo.storage.graph_base.SCOPE_LIMIT", 0)
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder(),
                            config=config) as mem:
        await mem.open_repo(REPO)
        alice = set(await _ingest(mem, "a", "alice", "the kettle is blue"))
        await _ingest(mem, "b", "bob", "the kettle is red", "a kettle boils")
        hits = await mem.recall(REPO, "kettle", where={"user_id": "alice"})
        assert hits.memories
        assert {m.node.id for m in hits.memories} <= alice
        found = await mem.search_nodes(REPO, "kettle", where={"user_id": "alice"})
        assert found
        assert {n.id for n in found} <= alice


async def test_a_session_committed_through_another_memory_keeps_its_metadata(
    store: str,
) -> None:
    """The metadata is stored with the session: a second Memory on the store that closes and
    commits it gives its nodes that metadata."""
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as first:
        await first.open_repo(REPO)
        sid = await first.start_session("cook", repo=REPO, metadata={"user_id": "erin"})
        await first.append(sid, "the oven is hot", "open the window")
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as second:
        receipt = await second.close_and_commit(sid)
        assert receipt.node_ids
        for node in await second.get_nodes_by_type(REPO, list(N)):
            assert node.metadata == {"user_id": "erin"}
        assert (await second.recall(REPO, "oven", where={"user_id": "erin"})).memories


@pytest.mark.parametrize("types", [None, [N.SEMANTIC]])
async def test_the_scoped_dense_channel_ranks_as_the_exact_scan(
    store: str, types: list[mnemo.NodeType] | None
) -> None:
    """Inside a scope, `search_vectors` gives the scope's nodes (of `types`) nearest by
    cosine, best first, as an exact scan ranks them: equal vectors tie, and a tie, at the
    cut too, goes to the node added first."""
    pool = np.random.default_rng(5).normal(size=(4, DIM)).astype(np.float32)
    query = pool[2] + 0.3 * pool[1]
    cosines = pool @ query / np.linalg.norm(pool, axis=1) / np.linalg.norm(query)
    kinds = [N.SEMANTIC, N.EPISODIC]
    # alice's nodes, the order they are added: (id, type, which of `pool` is its vector)
    alice = [(f"alice{i}", kinds[i % 2], i * 3 % 4) for i in range(24)]
    bob = [(f"bob{i}", kinds[i % 2], i % 4) for i in range(24)]
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        for n, (user, nodes) in enumerate([("alice", alice[:12]), ("bob", bob),
                                           ("alice", alice[12:])]):
            drafts = [NodeDraft(i, kind, f"{i} fact", {}, pool[v]) for i, kind, v in nodes]
            await graph.apply(Changeset(f"cs{n}", REPO, drafts, metadata={"user_id": user}),
                              intents=policy())
        scope = await graph.scope(REPO, scopes.check_where({"user_id": "alice"}) or {})
        wanted = [(i, v) for i, kind, v in alice if types is None or kind in types]
        # Stable: a tie keeps the order the nodes were added.
        exact = [i for i, v in sorted(wanted, key=lambda node: -cosines[node[1]])]
        for k in (1, 5, 9, 40):
            hits = await graph.search_vectors(REPO, query, k, types, scope)
            assert [i for i, _ in hits] == exact[:k]


# A trajectory the extraction without an LLM makes facts, tags, procedures and intents of.
TRIP = mnemo.Trajectory("Plan the Lisbon trip", [
    mnemo.Step("Dana is vegetarian and prefers quiet restaurants.", "Note it."),
    mnemo.Step("The flight lands at 10:40 on Friday.", "Book a taxi for 11:15.")])


async def _intents_of_procedures(mem: mnemo.Memory) -> list[tuple[dict[str, object],
                                                                   list[dict[str, object]]]]:
    """Each procedure's metadata, with the metadata of the intents it hangs on."""
    found: list[tuple[dict[str, object], list[dict[str, object]]]] = []
    for procedure in await mem.get_nodes_by_type(REPO, [N.PROCEDURAL]):
        linked = await mem.get_linked_nodes(REPO, [procedure.id],
                                            link_type=mnemo.LinkType.HIERARCHICAL)
        found.append((dict(procedure.metadata),
                      [dict(n.metadata) for n in linked if n.type is N.INTENT]))
    return found


async def test_intents_are_not_shared_across_scopes(store: str) -> None:
    """One intent in two scopes is two nodes: each scope's procedures hang on an intent of
    their own scope, and each scope holds its intent."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder()) as mem:
        await mem.open_repo(REPO)
        for user in ("alice", "bob"):
            await mem.ingest(REPO, TRIP, source_id=f"chat-{user}", metadata={"user_id": user})
        hung = await _intents_of_procedures(mem)
        assert {str(p) for p, _ in hung} == {str({"user_id": u}) for u in ("alice", "bob")}
        for procedure, intents in hung:
            assert intents == [procedure]
        for user in ("alice", "bob"):
            kinds = {n.type for n in await mem.nodes_where(REPO, {"user_id": user})}
            assert N.INTENT in kinds


async def test_forget_where_leaves_the_other_scopes_intents(store: str) -> None:
    """Erasing one scope deletes or changes nothing of another scope's intents."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder()) as mem:
        await mem.open_repo(REPO)
        for user in ("alice", "bob"):
            await mem.ingest(REPO, TRIP, source_id=f"chat-{user}", metadata={"user_id": user})
        bobs = {(n.id, n.text) for n in await mem.nodes_where(REPO, {"user_id": "bob"})
                if n.type is N.INTENT}
        assert bobs
        assert await mem.forget_where(REPO, {"user_id": "alice"}) > 0
        left = await mem.get_nodes_by_type(REPO, [N.INTENT])
        assert {(n.id, n.text) for n in left} == bobs
        hung = await _intents_of_procedures(mem)
        assert hung
        assert all(intents == [{"user_id": "bob"}] for _, intents in hung)


async def test_forget_erases_a_scope_s_intent_an_unscoped_source_has_too(store: str) -> None:
    """A scope's only source forgotten, nothing of the scope is left nor recalled, when an
    unscoped source has the same intent."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder()) as mem:
        await mem.open_repo(REPO)
        await mem.ingest(REPO, TRIP, source_id="chat-1", metadata={"user_id": "alice"})
        await mem.ingest(REPO, TRIP, source_id="chat-2")
        assert await mem.forget(REPO, "chat-1") > 0
        assert await mem.nodes_where(REPO, {"user_id": "alice"}) == []
        hits = await mem.recall(REPO, "Dana vegetarian restaurants flight",
                                where={"user_id": "alice"})
        assert hits.memories == []
        assert all(intents == [{}] for _, intents in await _intents_of_procedures(mem))


async def test_an_intent_joins_its_scope_s_among_other_scopes_equal_ones(store: str) -> None:
    """A scope's second ingest of an intent joins the scope's own intent node, however many
    other scopes hold an equal one."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder()) as mem:
        await mem.open_repo(REPO)
        for user in ("u0", "u1", "u2", "u3", "alice"):
            await mem.ingest(REPO, TRIP, source_id=f"chat-{user}", metadata={"user_id": user})

        async def alices() -> list[str]:
            return sorted(n.id for n in await mem.nodes_where(REPO, {"user_id": "alice"})
                          if n.type is N.INTENT)

        before = await alices()
        await mem.ingest(REPO, TRIP, source_id="chat-alice-2", metadata={"user_id": "alice"})
        assert await alices() == before


@pytest.mark.parametrize("listed", [True, False])
async def test_each_scope_s_recall_is_routed_by_its_own_tags_and_intents(
    store: str, listed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scoped recall's routes are its scope's own tags and intents, as many for the last of
    six users as for the first, though every user's tags have the same labels (and vectors):
    for a scope that lists its members and one past SCOPE_LIMIT."""
    if not listed:
        monkeypatch.setattr("mnemo.storage.graph_base.SCOPE_LIMIT", 0)
    users = [f"u{i}" for i in range(6)]
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder()) as mem:
        await mem.open_repo(REPO)
        for user in users:
            await mem.ingest(REPO, TRIP, source_id=f"chat-{user}", metadata={"user_id": user})
        routed: dict[str, int] = {}
        for user in users:
            where = {"user_id": user}
            own = {n.id for n in await mem.nodes_where(REPO, where, limit=1000)}
            result = await mem.recall(REPO, "the Lisbon trip's flight and taxi", where=where)
            routes = {t.node_id for t in result.touched if t.phase == "route"}
            assert routes <= own
            routed[user] = len(routes)
        assert routed["u0"] > 0
        assert len(set(routed.values())) == 1, routed


async def test_nodes_where_pages_by_offset(mem: mnemo.Memory) -> None:
    """`nodes_where(limit=, offset=)` reads a scope page by page in the order added, empty past
    its end; an offset below 0 or past what SQL's integers hold is InvalidInputError."""
    ids = [(await mem.remember(REPO, f"fact number {i}", source_id=f"s{i}",
                               metadata={"user_id": "alice"})).node_ids[0] for i in range(5)]
    where = {"user_id": "alice"}
    pages = [[n.id for n in await mem.nodes_where(REPO, where, limit=2, offset=at)]
             for at in (0, 2, 4, 5)]
    assert pages == [ids[:2], ids[2:4], ids[4:], []]
    for bad in (-1, 2**63, 1.0):
        with pytest.raises(mnemo.InvalidInputError, match="offset"):
            await mem.nodes_where(REPO, where, offset=bad)  # type: ignore[arg-type]
