"""`mnemo.tools`: every answer is bounded, and what is cut can be read whole with get_node."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import mnemo
from mnemo import tools
from mnemo.adapters.hashing import HashEmbedder

REPO = "blog"
# About 6,000 characters, one sentence: one step's observation, which becomes an EPISODIC
# node's text and a fact's.
LONG = "The gunicorn worker binds port 8000 on the blog host after the deploy, " * 80


@pytest.fixture
async def mem(store: str) -> AsyncIterator[mnemo.Memory]:
    async with mnemo.Memory(store, embedder=HashEmbedder()) as m:
        await m.open_repo(REPO)
        yield m


async def ingest_long_steps(mem: mnemo.Memory, n: int) -> list[str]:
    """Ingests one trajectory of `n` long steps; the ids of its long nodes (the steps and the
    facts made from them)."""
    steps = [
        mnemo.Step(f"Step {i}: {LONG}", f"Reload nginx after binding gunicorn, attempt {i}.")
        for i in range(n)
    ]
    receipt = await mem.ingest(
        REPO, mnemo.Trajectory("Deploy the blog", steps), source_id="deploy-log"
    )
    nodes = [await mem.get_node(REPO, nid) for nid in receipt.node_ids]
    return [n.id for n in nodes if n is not None and len(n.text) > tools.SNIPPET_CHARS]


async def test_recall_answers_with_snippets_and_ids(mem: mnemo.Memory) -> None:
    """recall shows each memory as a bounded snippet with its id, never the whole text, and
    the answer stays within MAX_OUTPUT_CHARS however many long memories match."""
    long = await ingest_long_steps(mem, 12)
    call = mnemo.ToolCall("recall", {"query": "gunicorn worker binds port 8000", "k": 30})
    answer = await tools.execute_tool(mem, call, repo=REPO)
    assert len(answer) <= tools.MAX_OUTPUT_CHARS
    assert LONG.strip() not in answer
    assert any(nid in answer for nid in long)
    for line in answer.splitlines():
        assert len(line) <= tools.SNIPPET_CHARS + 120, line
    assert "get_node for all" in answer


async def test_get_node_pages_through_a_whole_node(mem: mnemo.Memory) -> None:
    """get_node shows a node a page at a time; following next offsets reads all of it."""
    (first, *_) = await ingest_long_steps(mem, 1)
    node = await mem.get_node(REPO, first)
    assert node is not None
    assert len(node.text) > tools.PAGE_CHARS / 2
    small = tools.page(node.text, 0, 1_000)
    assert (small.offset, small.total, small.next_offset) == (0, len(node.text), 1_000)

    answer = await tools.execute_tool(
        mem, mnemo.ToolCall("get_node", {"node_id": first}), repo=REPO
    )
    assert len(answer) <= tools.PAGE_CHARS + tools.MESSAGE_CHARS + 200
    assert first in answer
    assert node.text[: tools.PAGE_CHARS] in answer or node.text in answer

    read, offset = "", 0
    while True:
        part = tools.page(node.text, offset, 1_000)
        read += part.text
        if part.next_offset is None:
            break
        offset = part.next_offset
    assert read == node.text
    past = await tools.execute_tool(
        mem, mnemo.ToolCall("get_node", {"node_id": first, "offset": 10**9}), repo=REPO
    )
    assert f"of {len(node.text)}" in past


async def test_get_node_errors_are_text(mem: mnemo.Memory) -> None:
    """An unknown node, a missing repo or a negative offset answers with error text."""
    unknown = mnemo.ToolCall("get_node", {"node_id": "node_missing"})
    assert (await tools.execute_tool(mem, unknown, repo=REPO)).startswith("error:")
    assert (await tools.execute_tool(mem, unknown)).startswith("error:")
    negative = mnemo.ToolCall("get_node", {"node_id": "x", "offset": -1})
    assert (await tools.execute_tool(mem, negative, repo=REPO)).startswith("error:")


async def test_errors_quoting_huge_input_are_bounded(mem: mnemo.Memory) -> None:
    """An error message that quotes its input is clipped."""
    call = mnemo.ToolCall("view_messages", {"message_id": "x" * 100_000})
    answer = await tools.execute_tool(mem, call)
    assert answer.startswith("error:")
    assert len(answer) <= tools.ERROR_CHARS + 10


async def test_view_keeps_the_target_within_the_bound(mem: mnemo.Memory) -> None:
    """A view of many long messages drops the far ends, never the target, and stays within
    MAX_OUTPUT_CHARS."""
    conv = mem.conversation()
    history = [{"role": "user", "content": f"message {i}: " + "words " * 400} for i in range(60)]
    stored = await conv.save("t", history)
    target = stored[30]
    call = mnemo.ToolCall("view_messages", {"message_id": target.id, "radius": 30})
    answer = await tools.execute_tool(mem, call)
    assert len(answer) <= tools.MAX_OUTPUT_CHARS
    assert f"> message 30 [{target.id}]" in answer
    assert f"[{stored[29].id}]" in answer
    assert f"[{stored[31].id}]" in answer
    assert f"[{stored[0].id}]" not in answer
