"""Eviction's own model (the seed runs it on a fast model) and what its prompt asks for."""

from __future__ import annotations

import pytest

import mnemo
from tests.conversation._support import OfflineFake, ScriptedEviction, snapshot_call, user
from tests.fakes import FakeEmbedder

HISTORY = [user(f"step {i}: deploy the billing service to the staging cluster") for i in range(12)]


async def test_evict_takes_a_model_of_its_own(store: str) -> None:
    """evict(llm=) sends the eviction's calls to that model; the Memory's model gets none."""
    memory_model = OfflineFake()
    fast = ScriptedEviction(snapshot_call("Billing went to staging."))
    async with mnemo.Memory(store, llm=memory_model, embedder=FakeEmbedder()) as mem:
        await mem.conversation().save("t", HISTORY)
        result = await mem.evict("t", token_budget=4000, eviction_fraction=0.5, llm=fast)
    assert result.error is None
    assert result.snapshot is not None
    assert result.snapshot.text == "Billing went to staging."
    assert len(fast.requests) == 1
    assert memory_model.calls == []


async def test_a_manager_with_a_model_of_its_own_evicts_and_summarises_with_it(
    store: str,
) -> None:
    """conversation(llm=) runs the manager's automatic evictions (and their folds) and its
    summaries on that model; the Memory's model gets no call."""
    memory_model = OfflineFake()
    fast = ScriptedEviction(snapshot_call("Steps of the billing deploy."))
    async with mnemo.Memory(store, llm=memory_model, embedder=FakeEmbedder()) as mem:
        chat = mem.conversation(
            llm=fast, auto_evict_budget=150, compression=mnemo.Summary(max_tokens=80, keep=2)
        )
        history: list[dict[str, object]] = []
        for message in HISTORY:
            history.append(message)
            await chat.save("t", history)
        assert await chat.compactions("t")
        view = await mem.viewport("t", token_budget=150)
    assert view.boundary_seq > 0
    assert fast.requests
    assert memory_model.calls == []


async def test_a_model_that_is_none_is_refused(cmem: mnemo.Memory) -> None:
    """An llm that is not a model is InvalidInputError, before anything runs."""
    with pytest.raises(mnemo.InvalidInputError, match="llm"):
        cmem.conversation(llm="gpt-4o-mini")  # type: ignore[arg-type]
    await cmem.conversation().save("t", HISTORY)
    with pytest.raises(mnemo.InvalidInputError, match="llm"):
        await cmem.evict("t", token_budget=100, llm=object())  # type: ignore[arg-type]
    assert (await cmem.viewport("t", token_budget=10_000)).boundary_seq == 0


async def test_the_eviction_prompt_asks_for_decisions_progress_and_paraphrase(
    store: str,
) -> None:
    """The eviction instructions ask for what was decided and why, the goals' progress, a
    paraphrase, and no tool details."""
    fast = ScriptedEviction(snapshot_call("Billing went to staging."))
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        await mem.conversation().save("t", HISTORY)
        await mem.evict("t", token_budget=4000, llm=fast)
    prompt = " ".join(" ".join(str(m["content"]) for m in fast.requests[0].messages).split())
    prompt = prompt.lower()
    for asked in ("decided and why", "goals and their progress", "paraphrase",
                  "leave out tool details"):
        assert asked in prompt
