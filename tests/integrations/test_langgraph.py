"""`MnemoStore` under the real LangGraph: a compiled graph's nodes write and read memories
through it (async and sync), items kept exactly and replaced by key, namespaces as scopes; on
both backends."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any, TypedDict

import anyio
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore, Item, PutOp, SearchItem
from langgraph.store.memory import InMemoryStore

import mnemo
from mnemo.integrations.langgraph import MnemoStore
from tests.conftest import REPO
from tests.fakes import FakeEmbedder

# The real framework runs: an integration, beside the suite's unit tests (scripts/check).
pytestmark = pytest.mark.slow


class State(TypedDict):
    user: str
    said: str
    recalled: list[str]


def graph(store: BaseStore, *, sync: bool = False) -> Any:
    """remember (puts what the user said under ("memories", user)) -> recall (searches it)."""

    async def remember(state: State, *, store: BaseStore) -> dict[str, Any]:
        await store.aput(("memories", state["user"]), "said", {"text": state["said"]})
        return {}

    async def recall(state: State, *, store: BaseStore) -> dict[str, Any]:
        found = await store.asearch(("memories", state["user"]), query=state["said"])
        return {"recalled": [item.value["text"] for item in found]}

    def remember_sync(state: State, *, store: BaseStore) -> dict[str, Any]:
        store.put(("memories", state["user"]), "said", {"text": state["said"]})
        return {}

    def recall_sync(state: State, *, store: BaseStore) -> dict[str, Any]:
        found = store.search(("memories", state["user"]), query=state["said"])
        return {"recalled": [item.value["text"] for item in found]}

    builder = StateGraph(State)
    builder.add_node("remember", remember_sync if sync else remember)
    builder.add_node("recall", recall_sync if sync else recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    return builder.compile(store=store)


async def test_a_compiled_graph_writes_and_reads_memories(mem: mnemo.Memory) -> None:
    """ainvoke: the graph's nodes put and search through the store; each user sees only
    their own memories, and mnemo's recall sees them under the namespace's metadata."""
    store = MnemoStore(mem, REPO, keys=("kind", "user_id"))
    app = graph(store)
    out = await app.ainvoke({"user": "alice", "said": "I like green tea", "recalled": []})
    assert out["recalled"] == ["I like green tea"]
    out = await app.ainvoke({"user": "bob", "said": "I like black tea", "recalled": []})
    assert out["recalled"] == ["I like black tea"]
    hits = await mem.recall(REPO, "tea", where={"user_id": "alice"})
    assert [m.node.data["value"] for m in hits.memories] == [{"text": "I like green tea"}]
    assert hits.memories[0].node.metadata["kind"] == "memories"


async def test_sync_invoke_from_a_thread(mem: mnemo.Memory) -> None:
    """invoke in a worker thread: sync nodes' put and search run on the Memory's loop."""
    store = MnemoStore(mem, REPO)
    app = graph(store, sync=True)
    out = await anyio.to_thread.run_sync(
        app.invoke, {"user": "carol", "said": "my flat is on floor 4", "recalled": []})
    assert out["recalled"] == ["my flat is on floor 4"]
    with pytest.raises(RuntimeError, match="block"):
        store.put(("x",), "k", {"a": 1})  # on the loop's own thread


async def test_put_get_replace_delete(mem: mnemo.Memory) -> None:
    """A value comes back exactly; a put of the same namespace and key replaces it (one
    item, created_at kept); a put of None deletes it and erases its node."""
    store = MnemoStore(mem, REPO)
    value = {"food": "pizza", "n": 3, "tags": ["a", "b"], "nested": {"x": 1.5, "y": None}}
    await store.aput(("prefs", "alice"), "food", value)
    first = await store.aget(("prefs", "alice"), "food")
    assert isinstance(first, Item)
    assert (first.value, first.key, first.namespace) == (value, "food", ("prefs", "alice"))
    await store.aput(("prefs", "alice"), "food", {"food": "sushi"})
    second = await store.aget(("prefs", "alice"), "food")
    assert second is not None
    assert second.value == {"food": "sushi"}
    assert second.created_at == first.created_at
    assert len(await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])) == 1
    assert await store.aget(("prefs", "bob"), "food") is None
    await store.adelete(("prefs", "alice"), "food")
    assert await store.aget(("prefs", "alice"), "food") is None
    assert await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC]) == []


async def test_an_item_whose_fact_was_corrected_reads_as_its_new_wording(
    mem: mnemo.Memory,
) -> None:
    """An item whose fact `Memory.correct` rewrote reads back, by get and search, as its new
    wording: the correction keeps none of the old value."""
    store = MnemoStore(mem, REPO)
    await store.aput(("prefs", "alice"), "door", {"code": "1234"})
    [fact] = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
    await mem.correct(REPO, fact.id, "The door code is 9999.")
    item = await store.aget(("prefs", "alice"), "door")
    assert item is not None
    assert (item.key, item.value) == ("door", {"text": "The door code is 9999."})
    [found] = await store.asearch(("prefs",))
    assert found.value == item.value


async def test_an_item_whose_fact_was_corrected_is_replaced_and_deleted_whole(
    mem: mnemo.Memory,
) -> None:
    """An item of a long key whose fact was corrected reads as its new wording under its own
    key; a put replaces it (the correction goes with the version it corrected), and a delete
    leaves no node of the item."""
    store = MnemoStore(mem, REPO)
    key = "k" * 600
    await store.aput(("prefs",), key, {"code": "1234"})
    [fact] = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
    await mem.correct(REPO, fact.id, "The door code is 9999.")
    [found] = await store.asearch(("prefs",))
    assert (found.key, found.value) == (key, {"text": "The door code is 9999."})
    await store.aput(("prefs",), key, {"code": "4321"})
    assert [(i.key, i.value) for i in await store.asearch(("prefs",))] == [
        (key, {"code": "4321"})]
    await store.adelete(("prefs",), key)
    assert await store.aget(("prefs",), key) is None
    assert await _nodes(mem) == []


async def test_search_by_prefix_filter_and_namespaces(mem: mnemo.Memory) -> None:
    """search without a query (or a blank one) lists a prefix's items, a filter keeps equal
    fields, limit and offset cut; list_namespaces matches prefixes, suffixes and depths."""
    store = MnemoStore(mem, REPO)
    await store.aput(("docs", "a", "v1"), "1", {"kind": "note", "text": "first"})
    await store.aput(("docs", "a", "v2"), "2", {"kind": "todo", "text": "second"})
    await store.aput(("docs", "b", "v1"), "3", {"kind": "note", "text": "third"})
    await store.aput(("other",), "4", {"kind": "note", "text": "fourth"})
    docs = await store.asearch(("docs",))
    assert [i.key for i in docs] == ["1", "2", "3"]
    for blank in ("", " ", "\u200b"):  # no query, as InMemoryStore reads a blank one
        assert await store.asearch(("docs",), query=blank) == docs
    assert all(isinstance(i, SearchItem) for i in docs)
    assert [i.key for i in await store.asearch(("docs",), filter={"kind": "note"})] == ["1", "3"]
    assert [i.key for i in await store.asearch(("docs",), limit=1, offset=1)] == ["2"]
    assert next(i.key for i in await store.asearch(("docs", "a"), query="second")) == "2"
    assert await store.alist_namespaces() == [
        ("docs", "a", "v1"), ("docs", "a", "v2"), ("docs", "b", "v1"), ("other",)]
    assert await store.alist_namespaces(prefix=("docs",), max_depth=2) == [
        ("docs", "a"), ("docs", "b")]
    assert await store.alist_namespaces(suffix=("v1",)) == [
        ("docs", "a", "v1"), ("docs", "b", "v1")]
    assert await store.alist_namespaces(prefix=("docs", "*", "v2")) == [("docs", "a", "v2")]
    batch = await store.abatch([])
    assert batch == []


async def test_forget_where_erases_a_user_s_items(mem: mnemo.Memory) -> None:
    """The namespace is the scope: forget_where on it erases that user's items only."""
    store = MnemoStore(mem, REPO, keys=("user_id",))
    await store.aput(("alice",), "k", {"text": "alice's secret"})
    await store.aput(("bob",), "k", {"text": "bob's secret"})
    assert await mem.forget_where(REPO, {"user_id": "alice"}) == 1
    assert await store.aget(("alice",), "k") is None
    assert await store.aget(("bob",), "k") is not None


async def test_a_query_finds_every_item_of_equal_value(mem: mnemo.Memory) -> None:
    """Items of one value under two keys, or under several users' namespaces, are each an
    item a query finds (recall gave back one wording once, so the others vanished)."""
    store = MnemoStore(mem, REPO, keys=("kind", "user_id"))
    await store.aput(("memories", "bob"), "a", {"text": "I like green tea"})
    await store.aput(("memories", "bob"), "b", {"text": "I like green tea"})
    await store.aput(("memories", "alice"), "a", {"text": "i LIKE   green tea"})
    assert sorted(i.key for i in await store.asearch(("memories", "bob"), query="tea")) == [
        "a", "b"]
    assert sorted((tuple(i.namespace), i.key)
                  for i in await store.asearch(("memories",), query="green tea")) == [
        (("memories", "alice"), "a"), (("memories", "bob"), "a"), (("memories", "bob"), "b")]


async def test_search_filter_operators(mem: mnemo.Memory) -> None:
    """A filter's value may be LangGraph's operators ($eq, $ne, $gt, $gte, $lt, $lte), a dict
    matched key by key or a list matched element by element; an unknown operator raises
    ValueError, as InMemoryStore's do."""
    store = MnemoStore(mem, REPO)
    await store.aput(("prefs",), "a", {"level": 1, "who": {"name": "ann", "age": 30}})
    await store.aput(("prefs",), "b", {"level": 2, "tags": ["x", "y"]})

    async def keys(**wanted: Any) -> list[str]:
        return sorted(i.key for i in await store.asearch(("prefs",), filter=wanted))

    assert await keys(level={"$gt": 1}) == ["b"]
    assert await keys(level={"$gte": 1, "$lt": 2}) == ["a"]
    assert await keys(level={"$ne": 1}) == ["b"]
    assert await keys(level={"$eq": 2}, tags=["x", "y"]) == ["b"]
    assert await keys(who={"name": "ann"}) == ["a"]
    assert await keys(who={"age": {"$lte": 29}}) == []
    with pytest.raises(ValueError, match=r"\$like"):
        await keys(level={"$like": 1})


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, 2.5]),
                  st.sampled_from(["a", "b"]))
_values = st.recursive(_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=2), st.dictionaries(st.sampled_from(["p", "q"]), inner, max_size=2)),
    max_leaves=4)
_operators = st.dictionaries(st.sampled_from(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in"]),
                             st.integers(-3, 3), min_size=1, max_size=2)
_fields = st.sampled_from(["x", "y"])


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(st.dictionaries(_fields, _values, max_size=2), min_size=1, max_size=4),
       wanted=st.dictionaries(_fields, st.one_of(_values, _operators), max_size=2))
def test_search_filter_matches_in_memory_store(
    items: list[dict[str, Any]], wanted: dict[str, Any]
) -> None:
    """For any items and filter, a filtered search finds the keys LangGraph's InMemoryStore
    finds, or raises where it raises (an unknown operator, an order on a non-number)."""

    async def found(store: BaseStore) -> list[str] | type[Exception]:
        for key, value in enumerate(items):
            await store.aput(("ns", str(key % 2)), str(key), {**value, "key": key})
        try:
            return sorted(i.key for i in await store.asearch(("ns",), filter=wanted))
        except (TypeError, ValueError) as exc:
            return type(exc)

    async def both() -> None:  # filters read no vector: the hashed embedder loads at once
        async with mnemo.Memory(":memory:", embedder=mnemo.HashEmbedder()) as mem:
            await mem.open_repo(REPO)
            assert await found(MnemoStore(mem, REPO)) == await found(InMemoryStore())

    anyio.run(both)


async def _nodes(mem: mnemo.Memory, repo: str = REPO) -> list[mnemo.Node]:
    return await mem.get_nodes_by_type(repo, [mnemo.NodeType.SEMANTIC])


async def test_concurrent_puts_of_one_key_leave_the_last(mem: mnemo.Memory) -> None:
    """Puts of one namespace and key at once (tasks, and sync puts from threads) never raise
    and leave one item, the last put's: LangGraph's parallel branches may write one key."""
    store = MnemoStore(mem, REPO)
    for _ in range(2):  # a new key, then a replaced one
        await asyncio.gather(*(store.aput(("ns",), "k", {"text": f"value {i}"})
                               for i in range(3)))
        item = await store.aget(("ns",), "k")
        assert item is not None
        assert item.value == {"text": "value 2"}
        assert len(await _nodes(mem)) == 1

    def put(text: str) -> None:
        store.put(("ns",), "t", {"text": text})

    async with anyio.create_task_group() as group:
        for text in ("x", "y", "z"):
            group.start_soon(anyio.to_thread.run_sync, put, text)
    assert [i.key for i in await store.asearch(("ns",))] == ["k", "t"]
    assert len(await _nodes(mem)) == 2


async def test_puts_of_one_key_through_two_memories(store: str, embedder: FakeEmbedder) -> None:
    """Two Memory objects (as two processes) on one store putting one key at once: none
    raises, and both read one item, the one put last, held by one node."""
    async with mnemo.Memory(store, embedder=embedder) as one, \
            mnemo.Memory(store, embedder=embedder) as two:
        await one.open_repo(REPO)
        stores = [MnemoStore(one, REPO), MnemoStore(two, REPO)]
        for round_ in range(3):
            async with anyio.create_task_group() as group:
                for n, each in enumerate(stores):
                    group.start_soon(each.aput, ("ns",), "k", {"text": f"{round_}-{n}"})
            first, second = [await each.aget(("ns",), "k") for each in stores]
            assert first is not None
            assert second is not None
            assert first.value == second.value
            assert first.value["text"].startswith(f"{round_}-")
            assert len(await _nodes(one)) == 1


async def test_a_reader_sees_the_item_while_a_put_replaces_it(
    mem: mnemo.Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put writes the new version before it forgets the old: a get, a search and a listing
    made before or after that forget see one item, the new one (never none, never two)."""
    store = MnemoStore(mem, REPO)
    await store.aput(("ns",), "k", {"text": "old"})
    seen: list[Any] = []
    forget = mnemo.Memory.forget

    async def read() -> list[Any]:
        item = await store.aget(("ns",), "k")
        return [None if item is None else item.value["text"],
                [i.value["text"] for i in await store.asearch(("ns",))],
                [i.value["text"] for i in await store.asearch(("ns",), query="new")],
                await store.alist_namespaces()]

    async def reading_forget(self: mnemo.Memory, repo: str, source_id: str) -> int:
        seen.append(await read())
        gone = await forget(self, repo, source_id)
        seen.append(await read())
        return gone

    monkeypatch.setattr(mnemo.Memory, "forget", reading_forget)
    await store.aput(("ns",), "k", {"text": "new"})
    assert seen == [["new", ["new"], ["new"], [("ns",)]]] * 2


async def test_a_put_killed_before_its_forget_leaves_the_newest(
    mem: mnemo.Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put stopped between its write and its forget (a killed process) leaves two versions:
    every read shows one item, the newer, with the first put's created_at, and the next put
    of the key forgets both older versions; a delete forgets every version."""
    store = MnemoStore(mem, REPO)
    await store.aput(("ns",), "k", {"text": "old"})
    first = await store.aget(("ns",), "k")
    assert first is not None

    async def killed(self: mnemo.Memory, repo: str, source_id: str) -> int:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(mnemo.Memory, "forget", killed)
        with pytest.raises(KeyboardInterrupt):
            await store.aput(("ns",), "k", {"text": "new"})
    assert len(await _nodes(mem)) == 2
    item = await store.aget(("ns",), "k")
    assert item is not None
    assert (item.value, item.created_at) == ({"text": "new"}, first.created_at)
    assert [i.value for i in await store.asearch(("ns",))] == [{"text": "new"}]
    assert [i.value for i in await store.asearch(("ns",), query="new")] == [{"text": "new"}]
    await store.aput(("ns",), "k", {"text": "newest"})
    assert [n.data["value"] for n in await _nodes(mem)] == [{"text": "newest"}]
    with monkeypatch.context() as patch:
        patch.setattr(mnemo.Memory, "forget", killed)
        with pytest.raises(KeyboardInterrupt):
            await store.aput(("ns",), "k", {"text": "again"})
    await store.adelete(("ns",), "k")
    assert await store.aget(("ns",), "k") is None
    assert await _nodes(mem) == []


async def test_a_value_that_is_not_json_is_refused(mem: mnemo.Memory) -> None:
    """A value holding what JSON cannot (a datetime, NaN, a key that is not a string, which
    would come back as one) raises InvalidInputError and stores nothing; the item it would have
    replaced stays."""
    store = MnemoStore(mem, REPO)
    refused: list[Any] = [{"when": datetime(2026, 1, 1)}, {"x": float("nan")},
                          {"x": {"y": {1, 2}}}, {1: "x"}, {"x": {None: 2}}]
    for bad in refused:
        with pytest.raises(mnemo.InvalidInputError):
            await store.aput(("ns",), "k", bad)
    assert await _nodes(mem) == []
    await store.aput(("ns",), "k", {"text": "kept"})
    with pytest.raises(mnemo.InvalidInputError):
        await store.aput(("ns",), "k", {"when": datetime(2026, 1, 1)})
    item = await store.aget(("ns",), "k")
    assert item is not None
    assert item.value == {"text": "kept"}
    limit = (await mem.repo_config(REPO)).max_text_chars
    with pytest.raises(mnemo.InvalidInputError,
                       match=r"the value of item 'big' is [\d,]+ characters long"):
        await store.aput(("ns",), "big", {"text": "x" * limit})
    with pytest.raises(mnemo.InvalidInputError, match=r"the value of item 'nul' must not"):
        await store.aput(("ns",), "nul", {"text": "a\x00b"})


async def test_a_batch_with_a_bad_put_runs_none_of_its_operations(mem: mnemo.Memory) -> None:
    """A batch of a good put and one mnemo refuses (NaN, a value past the text bound or too
    deep, a key past the data bound or holding NUL, a namespace past the scope's keys) is
    InvalidInputError and stores neither; one with an operation of another kind is TypeError
    and runs none."""
    store = MnemoStore(mem, REPO)
    good = PutOp(("ns",), "good", {"v": 1})
    nested: Any = 1
    for _ in range(63):  # the value's depth within the bound, the item's data one past it
        nested = [nested]
    for bad in (PutOp(("ns",), "bad", {"v": float("nan")}),
                PutOp(("ns",), "bad", {"v": "x" * 200_000}),
                PutOp(("ns",), "bad", {"v": nested}),
                PutOp(("ns",), "k" * 20_000, {"v": "x" * 15_000}),
                PutOp(("ns",), "a\x00b", {"v": 1}),
                PutOp(tuple(f"l{i}" for i in range(40)), "k", {"v": 1})):
        with pytest.raises(mnemo.InvalidInputError):
            await store.abatch([good, bad])
    with pytest.raises(TypeError):
        await store.abatch([good, object()])  # type: ignore[list-item]
    assert await _nodes(mem) == []


async def test_listings_page_past_max_results(mem: mnemo.Memory) -> None:
    """A search without a query (with or without a filter) and list_namespaces read every item
    of the namespace, past `Config.max_results`; a search with a query ranks at most that many
    and says so when offset + limit passes it."""
    await mem.open_repo("small", config=mnemo.Config(max_results=4))
    store = MnemoStore(mem, "small")
    for i in range(11):
        await store.aput(("bulk", f"n{i % 6}"), f"k{i:02}", {"i": i})
    every = [f"k{i:02}" for i in range(11)]
    assert [i.key for i in await store.asearch(("bulk",), limit=50)] == every
    assert [i.key for i in await store.asearch(("bulk",), offset=9, limit=5)] == every[9:]
    assert [i.key for i in await store.asearch(("bulk",), filter={"i": 10})] == ["k10"]
    assert [i.key for i in await store.asearch(
        ("bulk",), filter={"i": {"$gte": 5}}, offset=4, limit=3)] == ["k09", "k10"]
    assert await store.alist_namespaces(limit=50) == [("bulk", f"n{i}") for i in range(6)]
    assert len(await store.asearch(("bulk",), query="i", offset=2, limit=2)) == 2
    with pytest.raises(mnemo.InvalidInputError, match=r"offset \+ limit is 5, more than the 4"):
        await store.asearch(("bulk",), query="i", offset=2, limit=3)


async def test_a_listing_while_another_worker_replaces_an_item_misses_none(
    mem: mnemo.Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker replaces an item right after the listing's first read of the store: the
    listing still has every item, none skipped as the replace moves the rows (the listing
    reads the store at one moment)."""
    await mem.open_repo("small", config=mnemo.Config(max_results=3))
    ours, other = MnemoStore(mem, "small"), MnemoStore(mem, "small")
    for i in range(7):
        await ours.aput(("docs",), f"k{i}", {"n": i})
    read = mem.nodes_where
    reads = 0

    async def then_a_put(*args: Any, **kwargs: Any) -> list[mnemo.Node]:
        nonlocal reads
        nodes = await read(*args, **kwargs)
        reads += 1
        if reads == 1:
            await other.aput(("docs",), "k0", {"n": 100})
        return nodes

    monkeypatch.setattr(mem, "nodes_where", then_a_put)
    listed = await ours.asearch(("docs",), limit=100)
    assert sorted(i.key for i in listed) == [f"k{i}" for i in range(7)]


async def test_long_keys_and_namespaces_round_trip(mem: mnemo.Memory) -> None:
    """Keys, labels and joined namespaces past a metadata value's 512 characters are kept
    exactly (a digest stands in for them in the metadata): put, get, search, list and
    delete; two keys that differ past the 512th character are two items."""
    store = MnemoStore(mem, REPO, keys=("user_id",))
    long_key, label = "k" * 600, "u" * 600
    deep = tuple(f"{i}" * 120 for i in range(5))
    for namespace in ((label,), deep, ("a", "b")):
        await store.aput(namespace, long_key, {"ns": list(namespace)})
        await store.aput(namespace, long_key + "x", {"x": 1})
    for namespace in ((label,), deep, ("a", "b")):
        item = await store.aget(namespace, long_key)
        assert item is not None
        assert (item.namespace, item.key, item.value) == (
            namespace, long_key, {"ns": list(namespace)})
        found = await store.asearch(namespace)
        assert [(i.namespace, i.key) for i in found] == [
            (namespace, long_key), (namespace, long_key + "x")]
    assert sorted(await store.alist_namespaces()) == sorted(
        [(label,), deep, ("a", "b")])
    assert await store.alist_namespaces(prefix=deep[:2], max_depth=3) == [deep[:3]]
    await store.adelete(deep, long_key)
    assert await store.aget(deep, long_key) is None
    assert await store.aget(deep, long_key + "x") is not None


async def test_an_item_put_under_other_keys_is_read_replaced_and_deleted(
    mem: mnemo.Memory,
) -> None:
    """A store whose `keys` changed (an app that scopes by user later, or two graphs set up
    differently on one repo) reads, replaces and deletes the items put before, as BaseStore
    promises; its search finds what it put."""
    before, after = MnemoStore(mem, REPO), MnemoStore(mem, REPO, keys=("user_id",))
    await before.aput(("alice",), "diet", {"text": "alice is vegetarian"})
    got = await after.aget(("alice",), "diet")
    assert got is not None
    assert got.value == {"text": "alice is vegetarian"}
    await after.aput(("alice",), "diet", {"text": "alice eats fish now"})
    assert [i.value for i in await before.asearch(())] == [{"text": "alice eats fish now"}]
    assert [i.value for i in await after.asearch(("alice",))] == [{"text": "alice eats fish now"}]
    await after.adelete(("alice",), "diet")
    assert await before.aget(("alice",), "diet") is None
    assert await _nodes(mem) == []
