"""The eviction model answers only through its tools: prose is asked again, and an eviction
without a snapshot still writes a plain note snapshot and reports the error."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import mnemo
from mnemo.calls.tasks import task_inputs
from tests.conversation._support import ScriptedEviction, prose, snapshot_call, user
from tests.fakes import FakeEmbedder

HISTORY = [user(f"step {i}: deploy the billing service to the staging cluster") for i in range(12)]


@pytest.fixture
async def scripted(store: str) -> AsyncIterator[tuple[mnemo.Memory, ScriptedEviction]]:
    llm = ScriptedEviction(prose())
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.conversation().save("t", HISTORY)
        yield mem, llm


async def test_prose_is_asked_again_then_noted(
    scripted: tuple[mnemo.Memory, ScriptedEviction],
) -> None:
    """A model that keeps answering in prose is asked again each round; the zone then gets a
    note snapshot and the error says why."""
    mem, llm = scripted
    result = await mem.evict("t", token_budget=4000, eviction_fraction=0.5)
    assert len(llm.requests) == 3
    assert "without calling a tool" in (result.error or "")
    assert result.snapshot is not None
    assert (result.snapshot.start_seq, result.snapshot.end_seq) == (0, result.boundary_after - 1)
    assert "search_messages" in result.snapshot.text
    done = task_inputs(llm.requests[1])["done"]
    assert any("called no tool" in line for line in done)
    assert "only through your tools" in llm.requests[0].system


async def test_prose_then_tools_keeps_the_snapshot(
    scripted: tuple[mnemo.Memory, ScriptedEviction],
) -> None:
    """A model that answers in prose once and then with its tools has its snapshot kept."""
    mem, llm = scripted
    llm.replies = [prose(), snapshot_call("The billing service went to staging.")]
    result = await mem.evict("t", token_budget=4000, eviction_fraction=0.5)
    assert result.error is None
    assert result.snapshot is not None
    assert result.snapshot.text == "The billing service went to staging."
    assert len(llm.requests) == 2


async def test_finishing_without_a_snapshot_is_an_error(
    scripted: tuple[mnemo.Memory, ScriptedEviction],
) -> None:
    """everything_ok before save_snapshot is refused; with no snapshot at the end the zone
    gets the note and the error."""
    mem, llm = scripted
    llm.replies = [mnemo.LLMResponse(tool_calls=[mnemo.ToolCall("everything_ok", {}, "c1")])]
    result = await mem.evict("t", token_budget=4000, eviction_fraction=0.5)
    assert "saved no snapshot" in (result.error or "")
    assert result.snapshot is not None
    assert "search_messages" in result.snapshot.text
    assert any("save_snapshot first" in line for line in task_inputs(llm.requests[1])["done"])
