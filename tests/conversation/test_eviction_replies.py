"""The eviction model answers only through its tools: prose is asked again, and an eviction
without a snapshot still writes a plain note snapshot and reports the error."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

import mnemo
from mnemo.calls.tasks import task_inputs
from mnemo.conversation.viewport import snapshot_words
from tests.conversation._support import ScriptedEviction, prose, snapshot_call, user
from tests.fakes import FakeEmbedder, js

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
    done = js(task_inputs(llm.requests[1]))["done"]
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
    assert any("save_snapshot first" in line for line in js(task_inputs(llm.requests[1]))["done"])


class Failing(ScriptedEviction):
    """A scripted eviction model that raises, or sleeps past the model timeout, instead."""

    def __init__(self, how: str) -> None:
        super().__init__(prose())
        self.how = how

    async def generate(self, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        if request.task == "eviction":
            self.requests.append(request)
            if self.how == "raises":
                raise mnemo.LLMError("HTTP 503 from the model server")
            await anyio.sleep(30)
        return await super().generate(request)


def bad_arguments() -> mnemo.LLMResponse:
    return mnemo.LLMResponse(tool_calls=[mnemo.ToolCall("save_snapshot", {"txt": "x"}, "c1")])


@pytest.mark.parametrize(
    ("replies", "cause"),
    [
        ([prose()], "replied 3 times without calling a tool"),
        ([bad_arguments()], "save_snapshot: error: save_snapshot reply has no 'text' field"),
        ([prose(), prose(), mnemo.LLMResponse(data={"summary": "the deploy"})],
         "not save_snapshot's arguments"),
        ([prose(), bad_arguments(), prose()], "rounds (last: error: your reply called no tool"),
        ("raises", "the eviction model failed: LLMError('HTTP 503"),
        ("sleeps", "the eviction model timed out after 0.5 s"),
    ],
)
async def test_a_reply_not_used_is_reported(
    store: str, replies: list[mnemo.LLMResponse] | str, cause: str
) -> None:
    """Whenever the model's reply is not used (no tool call, arguments that fail the tool's
    schema, a structured reply without the summary, a failure, a timeout) the zone still gets
    the note snapshot, the boundary moves past it, and `error` says why."""
    llm = ScriptedEviction(*replies) if isinstance(replies, list) else Failing(replies)
    config = mnemo.Config(extraction_timeout=0.5)
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder(), config=config) as mem:
        await mem.conversation().save("t", HISTORY)
        await mem.add_goal("t", "deploy the billing service")
        result = await mem.evict("t", token_budget=4000, eviction_fraction=0.5)
    assert cause in (result.error or "")
    assert result.snapshot is not None
    assert "search_messages" in result.snapshot.text
    assert result.snapshot.end_seq == result.boundary_after - 1 >= 0
    assert llm.requests


async def test_many_snapshot_parts_are_bounded_together(
    scripted: tuple[mnemo.Memory, ScriptedEviction],
) -> None:
    """Parts of a snapshot saved by many calls hold twice the asked words at most, together
    (a word more marks the cut); calls past it are refused and add nothing."""
    mem, llm = scripted
    llm.replies = [mnemo.LLMResponse(tool_calls=[
        *(mnemo.ToolCall("save_snapshot", {"text": f"part {i} " + "word " * 500}, f"c{i}")
          for i in range(40)),
        mnemo.ToolCall("everything_ok", {}, "done")])]
    result = await mem.evict("t", token_budget=300, eviction_fraction=0.5)
    assert result.error is None
    assert result.snapshot is not None
    assert len(result.snapshot.text.split()) <= 2 * snapshot_words(300, 1) + 1
    assert result.snapshot.text.startswith("part 0 word")
