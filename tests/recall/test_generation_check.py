"""A recall checks the generation of the repo's vectors once its look has ended, after its
words search has begun (`Recaller`), on both backends: another Memory's switch makes it run
again with the repo's new embedder, a second switch meanwhile is a ConflictError, and on every
way out of the check (a moved generation, a store fault, a cancellation) the words search
begun is let go (`PendingRead.discard`), never left with a result no one retrieves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

import mnemo
from mnemo.graph.ports import PendingRead

REPO = "r"


class Spied:
    """A begun words search that counts its `discard`s."""

    def __init__(self, inner: PendingRead[Any], discards: list[int]) -> None:
        self.inner, self.discards = inner, discards

    async def result(self) -> Any:
        return await self.inner.result()

    def discard(self) -> None:
        self.discards.append(1)
        self.inner.discard()


@asynccontextmanager
async def filled(store: str) -> AsyncIterator[mnemo.Memory]:
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(64)) as mem:
        await mem.open_repo(REPO)
        steps = [mnemo.Step("The kettle is on the stove.", "boil water for tea")]
        await mem.ingest(REPO, mnemo.Trajectory("kitchen", steps), source_id="s")
        yield mem


def spy(mem: mnemo.Memory, monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """(searches begun, discards) of the Memory's recalls from now on."""
    graph = mem._graph
    begun: list[int] = []
    discards: list[int] = []
    start = graph.start_search_text

    def started(*args: Any, **kwargs: Any) -> Spied:
        begun.append(1)
        return Spied(start(*args, **kwargs), discards)

    monkeypatch.setattr(graph, "start_search_text", started)
    return begun, discards


async def test_a_moved_generation_recalls_again_and_lets_the_search_go(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generation other than the Memory's makes the recall run again once (the record,
    read then, has not moved: the same embedder), each begun search let go; a generation that
    moves at each check is a ConflictError."""
    async with filled(store) as mem:
        begun, discards = spy(mem, monkeypatch)
        real = mem._graph.generation
        checks: list[int] = []

        async def moved_once(repo: str) -> int:
            checks.append(1)
            return 7 if len(checks) == 1 else await real(repo)

        monkeypatch.setattr(mem._graph, "generation", moved_once)
        result = await mem.recall(REPO, "kettle stove", reinforce=False)
        assert "The kettle is on the stove." in [m.node.text for m in result.memories]
        assert len(checks) == 2
        assert len(begun) == len(discards) == 2

        async def always_moved(repo: str) -> int:
            return 7

        monkeypatch.setattr(mem._graph, "generation", always_moved)
        with pytest.raises(mnemo.ConflictError, match="re-embedded twice"):
            await mem.recall(REPO, "kettle stove", reinforce=False)
        assert len(begun) == len(discards) == 4
        # A recall in a session's context runs again and refuses alike (it raised the
        # internal VectorsMoved).
        with pytest.raises(mnemo.ConflictError, match="re-embedded twice"):
            await mem.recall_in_context(REPO, "no such session", "kettle stove")
        assert len(begun) == len(discards) == 6


async def test_a_failed_or_cancelled_check_lets_the_search_go(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store fault in the check reaches the caller as itself, and a recall cancelled while
    it waits for the check ends: either way the begun search is let go."""
    async with filled(store) as mem:
        begun, discards = spy(mem, monkeypatch)

        async def fails(repo: str) -> int:
            raise mnemo.StorageError("unavailable", "the store is away")

        monkeypatch.setattr(mem._graph, "generation", fails)
        with pytest.raises(mnemo.StorageError, match="away"):
            await mem.recall(REPO, "kettle stove", reinforce=False)
        assert len(begun) == len(discards) == 1

        async def waits(repo: str) -> int:
            await anyio.sleep_forever()
            raise AssertionError

        monkeypatch.setattr(mem._graph, "generation", waits)
        with anyio.move_on_after(0.2) as scope:
            await mem.recall(REPO, "kettle stove", reinforce=False)
        assert scope.cancelled_caught
        assert len(begun) == len(discards) == 2
