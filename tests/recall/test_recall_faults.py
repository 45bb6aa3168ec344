"""A storage fault in the middle of a recall reaches the caller as `mnemo.StorageError`, on
both backends: recall runs several reads side by side, in task groups, and their
`ExceptionGroup` of one error had reached the caller (the contract says StorageError). The
first three reads run in those groups (they failed before); the last two run alone and
are checked as well."""

from __future__ import annotations

from typing import Any

import pytest

import mnemo
from mnemo.cpu import DeferredRead
from tests.fakes import FakeEmbedder, FakeLLM

REPO = "r"
# Each read recall makes, from hop 0 (side by side) to the ranking; the words search is begun
# before the query's embedding and its answer awaited in hop 0.
READS = ["start_search_text", "search_vectors", "nearest_of_type", "typed_links_near",
         "node_context"]


@pytest.mark.parametrize("read", READS)
async def test_a_storage_fault_in_any_read_is_a_storage_error(
    store: str, monkeypatch: pytest.MonkeyPatch, read: str
) -> None:
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        for text in ["the kettle is in the kitchen", "the kettle boils water"]:
            trajectory = mnemo.Trajectory(goal=text, steps=[mnemo.Step(observation=text,
                                                                       action="boil")])
            await mem.ingest(REPO, trajectory, source_id=text)
        assert (await mem.recall(REPO, "kettle kitchen", k=3)).memories
        graph = mem._backend.graph

        async def fails(*args: Any, **kwargs: Any) -> Any:
            raise mnemo.StorageError("unavailable", "the store is away")

        def begun(*args: Any, **kwargs: Any) -> DeferredRead[Any]:
            return DeferredRead(fails)

        monkeypatch.setattr(graph, read, begun if read.startswith("start_") else fails)
        with pytest.raises(mnemo.StorageError, match="away"):
            await mem.recall(REPO, "kettle kitchen", k=3)


async def test_a_scoped_recall_finds_an_item_replaced_while_it_read(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put replaces an item (the new version, then the old forgotten) after a scoped recall
    listed the scope's members and before it read their nodes: the recall lists the scope
    again and finds the new version (it found nothing)."""
    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        alice: dict[str, str | int | float | bool] = {"user_id": "alice"}
        await mem.remember(REPO, "kettle version one", source_id="v1", metadata=alice)
        graph = mem._backend.graph
        read = graph.node_context
        replaced: list[bool] = []

        async def replacing(*args: Any, **kwargs: Any) -> Any:
            if not replaced:
                replaced.append(True)
                await mem.remember(REPO, "kettle version two", source_id="v2", metadata=alice)
                await mem.forget(REPO, "v1")
            return await read(*args, **kwargs)

        monkeypatch.setattr(graph, "node_context", replacing)
        result = await mem.recall(REPO, "kettle version", k=3, where=alice)
    assert replaced
    assert [m.node.text for m in result.memories] == ["kettle version two"]
