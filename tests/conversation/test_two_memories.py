"""Two Memory objects on one store writing one thread: a conflict with the other writer is
resolved from the store's state, never raised (the API contract: the store is the one truth).

Each race is staged without sleeps: a fake model or embedder of Memory A does Memory B's
write while A is between its read of the thread and its write.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

import mnemo
from mnemo.adapters.offline import OfflineLLM
from tests.conversation._support import hidden, tagged
from tests.fakes import FakeEmbedder

Hook = Callable[[], Awaitable[Any]]


class Interleaving:
    """Runs `hook` (the other Memory's write) once, the first time A reaches its model or
    embedder, then answers as the offline LLM / the fake embedder."""

    def __init__(self) -> None:
        self.hook: Hook | None = None
        self.ran: list[Any] = []
        self._llm = OfflineLLM()
        self._embedder = FakeEmbedder()
        self.dim = self._embedder.dim
        self.embedded: list[str] = []

    async def _once(self) -> None:
        hook, self.hook = self.hook, None
        if hook is not None:
            self.ran.append(await hook())

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        if request.task == "eviction":
            await self._once()
        return await self._llm.generate(request)

    async def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        await self._once()
        self.embedded += texts
        return await self._embedder.embed(texts)


def history(n: int) -> list[dict[str, Any]]:
    return [tagged(i, "user" if i % 2 == 0 else "assistant", 40) for i in range(n)]


async def test_evict_counts_another_memorys_eviction(store: str) -> None:
    """When B evicts the thread while A's eviction model works, A's evict returns the
    boundary B advanced (no ConflictError); B's snapshot is the only one."""
    a_side = Interleaving()
    async with (
        mnemo.Memory(store, llm=a_side, embedder=a_side) as a,
        mnemo.Memory(store, embedder=FakeEmbedder()) as b,
    ):
        await a.conversation().save("t", history(10))
        a_side.hook = lambda: b.evict("t", token_budget=300)
        result = await a.evict("t", token_budget=300)
        [by_b] = a_side.ran
        assert by_b.boundary_after > 0
        assert (result.boundary_before, result.boundary_after) == (0, by_b.boundary_after)
        assert result.snapshot is None
        assert result.evicted == 0
        view = await a.viewport("t", token_budget=300)
        assert view.boundary_seq == by_b.boundary_after
        snapshots = await a._conversations.store.snapshots("t")
        spans = [(s.start_seq, s.end_seq) for s in snapshots]
        assert spans == [(0, by_b.boundary_after - 1)], "one eviction's snapshot, B's"


async def test_auto_evicting_save_survives_another_memorys_eviction(store: str) -> None:
    """A save with auto_evict_budget whose eviction races B's evict returns its messages and
    leaves the viewport caught up, rather than raising after storing them."""
    a_side = Interleaving()
    async with (
        mnemo.Memory(store, llm=a_side, embedder=a_side) as a,
        mnemo.Memory(store, embedder=FakeEmbedder()) as b,
    ):
        await a.conversation().save("u", history(1))
        a_side.hook = lambda: b.evict("u", token_budget=200)
        saved = await a.conversation(auto_evict_budget=200).save("u", history(8))
        assert [m.seq for m in saved] == list(range(1, 8))
        assert len(a_side.ran) == 1
        assert [m.seq for m in await a.conversation().raw("u")] == list(range(8))
        assert await hidden(a, "u", 200) == []


async def test_save_of_a_history_another_memory_saved_appends_nothing(store: str) -> None:
    """When B saves the same full history between A's read of the length and A's append, A
    appends nothing (no ConflictError): every message is stored once."""
    a_side = Interleaving()
    async with (
        mnemo.Memory(store, embedder=a_side) as a,
        mnemo.Memory(store, embedder=FakeEmbedder()) as b,
    ):
        full = history(6)
        a_side.hook = lambda: b.conversation().save("t", full)
        saved = await a.conversation(retrieval=mnemo.Semantic(k=3)).save("t", full)
        assert saved == []
        assert [len(r) for r in a_side.ran] == [6]
        assert [m.seq for m in await a.conversation().raw("t")] == list(range(6))


async def test_save_appends_what_another_memory_left_new(store: str) -> None:
    """When B saves a shorter prefix meanwhile, A appends only the rest, with the vectors it
    already made (each message embedded once)."""
    a_side = Interleaving()
    async with (
        mnemo.Memory(store, embedder=a_side) as a,
        mnemo.Memory(store, embedder=FakeEmbedder()) as b,
    ):
        full = history(6)
        a_side.hook = lambda: b.conversation().save("t", full[:4])
        saved = await a.conversation(retrieval=mnemo.Semantic(k=3)).save("t", full)
        assert [m.seq for m in saved] == [4, 5]
        assert a_side.embedded == [m["content"] for m in full]
        raw = await a.conversation().raw("t")
        assert [m.content for m in raw] == [m["content"] for m in full]
        loaded = await a.conversation(retrieval=mnemo.Semantic(k=1)).load("t", query="tag5")
        assert loaded == [full[5]]
        # B stored 0-3 without vectors; A's own 4 and 5 are not embedded again.
        assert a_side.embedded[6:] == [m["content"] for m in full[:4]] + ["tag5"]


async def test_saves_of_two_extensions_racing_store_one(store: str) -> None:
    """When B saves [h, x] between A's check of its history [h, y] and A's append, A's save
    is refused naming the seq where the two part (it stored nothing): the thread holds B's
    history only, where A's save used to append nothing and return as if it had."""
    a_side = Interleaving()
    async with (
        mnemo.Memory(store, embedder=a_side) as a,
        mnemo.Memory(store, embedder=FakeEmbedder()) as b,
    ):
        full = history(4)
        await b.conversation().save("t", full[:3])
        theirs = [*full[:3], tagged(7, "user", 5)]
        a_side.hook = lambda: b.conversation().save("t", theirs)
        with pytest.raises(mnemo.InvalidInputError, match=r"messages\[3\] differs .* seq 3"):
            await a.conversation(retrieval=mnemo.Semantic(k=3)).save("t", full)
        assert [len(r) for r in a_side.ran] == [1]
        raw = await a.conversation().raw("t")
        assert [m.content for m in raw] == [m["content"] for m in theirs]


async def test_an_append_racing_a_save_is_kept(store: str) -> None:
    """When B appends a message between A's check of its history and A's append, A's save
    (whose history lacks it) is refused; B's message is kept."""
    a_side = Interleaving()
    async with (
        mnemo.Memory(store, embedder=a_side) as a,
        mnemo.Memory(store, embedder=FakeEmbedder()) as b,
    ):
        full = history(4)
        await b.conversation().save("t", full[:2])
        a_side.hook = lambda: b.conversation().append("t", [tagged(9, "user", 5)])
        with pytest.raises(mnemo.InvalidInputError, match=r"messages\[2\] differs .* seq 2"):
            await a.conversation(retrieval=mnemo.Semantic(k=3)).save("t", full)
        raw = await a.conversation().raw("t")
        theirs = [*(m["content"] for m in full[:2]), "tag9" + " filler" * 5]
        assert [m.content for m in raw] == theirs


class SummaryInterleaving(Interleaving):
    """Runs `hook` the first time A asks for a summary."""

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        if request.task == "summary":
            await self._once()
        return await self._llm.generate(request)


@pytest.mark.parametrize("span", [(4, 6), (5, 7)], ids=["inside", "overlapping"])
async def test_a_summary_racing_another_memorys_compaction_is_dropped_not_raised(
    store: str, span: tuple[int, int]
) -> None:
    """Regression: while A summarised, B recorded a compaction in A's range
    (inside it: A's record silently replaced B's summary it had never seen; overlapping its
    end: A's record was refused and its `save` raised after storing the messages). A summary
    is optional: it is dropped, the save returns its messages, and B's compaction stands."""
    a_side = SummaryInterleaving()
    async with (
        mnemo.Memory(store, llm=a_side, embedder=a_side) as a,
        mnemo.Memory(store, embedder=FakeEmbedder()) as b,
    ):
        summarising = a.conversation(compression=mnemo.Summary(max_tokens=60, keep=1))
        await a.conversation().save("t", history(6))
        a_side.hook = lambda: b.conversation().save_compaction("t", *span, "B's summary")
        saved = await summarising.save("t", history(8))
        assert [m.seq for m in saved] == [6, 7]
        assert a_side.ran, "B's compaction ran while A summarised"
        spans = [(c.start_seq, c.end_seq, c.summary_text)
                 for c in await a.conversation().compactions("t")]
        assert spans == [(*span, "B's summary")]
        assert [m.seq for m in await a.conversation().raw("t")] == list(range(8))
