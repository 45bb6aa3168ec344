"""Tool calls and their results stay together: where a view or the eviction boundary may start
(`safe_cuts`), the eviction zone, the viewport's window and `load`, for Chat Completions,
Anthropic and Responses items, however the call and its result were saved."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

import mnemo
from mnemo.conversation import ports
from mnemo.conversation.model import ITEM_KEY, Message
from mnemo.conversation.viewport import eviction_zone, layout, safe_cuts
from tests.conversation._support import hidden, tool_call, tool_result, user

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)


def responses_call(call_id: str) -> dict[str, Any]:
    """A Responses function_call item as `MnemoSession` stores it."""
    item = {"type": "function_call", "call_id": call_id, "name": "run", "arguments": "{}"}
    return {"role": "assistant", "content": "run({})", ITEM_KEY: item}


def responses_output(call_id: str, output: str) -> dict[str, Any]:
    item = {"type": "function_call_output", "call_id": call_id, "output": output}
    return {"role": "tool", "content": output, ITEM_KEY: item}


def anthropic_call(call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [
        {"type": "tool_use", "id": call_id, "name": "run", "input": {}}]}


def anthropic_result(call_id: str, output: str) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call_id, "content": output}]}


SHAPES = {
    "chat_completions": (tool_call, tool_result),
    "anthropic": (anthropic_call, anthropic_result),
    "responses": (responses_call, responses_output),
}


def message(seq: int, saved: dict[str, Any], tokens: int = 10) -> Message:
    data = {k: v for k, v in saved.items() if k not in ("role", "content")}
    if not isinstance(saved.get("content"), str):
        data["content"] = saved.get("content")
    return Message(f"m{seq}", "t", seq, saved["role"], str(saved.get("content")), data, EPOCH,
                   tokens)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_cut_between_a_call_and_its_result_is_not_safe(shape: str) -> None:
    """Only a cut that leaves no result without its call is safe: not between a call and its
    result, nor before a result whose call came before the messages; a tool result without
    ids pairs with nothing."""
    call, result = SHAPES[shape]
    messages = [message(i, m) for i, m in enumerate([
        result("c0", "late"), user("go"), call("c1"), result("c1", "out"), user("next"),
        {"role": "tool", "content": "no ids"}])]
    assert safe_cuts(messages) == [False, True, True, False, True, True, True]


def test_a_cut_between_a_reasoning_item_and_the_item_after_it_is_not_safe() -> None:
    """OpenAI's Responses refuse a reasoning item without the item after it, and a call
    without the reasoning before it: no view starts between them."""
    reasoning = {"role": "assistant", "content": "", ITEM_KEY: {
        "type": "reasoning", "id": "rs_1", "summary": []}}
    messages = [message(i, m) for i, m in enumerate([
        user("go"), reasoning, responses_call("c1"), responses_output("c1", "out"),
        user("next")])]
    assert safe_cuts(messages) == [True, True, False, False, True, True]


@pytest.mark.parametrize("shape", SHAPES)
def test_an_eviction_zone_never_parts_a_call_from_its_result(shape: str) -> None:
    """The zone ends at the first safe cut from its share on, else the last one before it,
    else past the newest message: a result never stays past the boundary without its call."""
    call, result = SHAPES[shape]

    def zone(*saved: dict[str, Any], fraction: float = 0.5) -> list[int]:
        past = [message(i, m) for i, m in enumerate(saved)]
        return [m.seq for m in eviction_zone(past, sum(m.tokens for m in past), fraction)]

    # Its share ends at the call, the newest is its result: the zone stops before the call.
    assert zone(user("go"), user("more"), call("c1"), result("c1", "out"), fraction=0.75) == [0, 1]
    # Nothing before the call: the call goes with its result, newest or not.
    assert zone(call("c1"), result("c1", "out")) == [0, 1]
    # A result whose call is already behind the boundary goes, even the newest.
    assert zone(result("c0", "late")) == [0]
    assert zone(result("c0", "late"), user("go"), user("more"), fraction=0.1) == [0]
    # A later safe cut within the share's reach comes first.
    assert zone(user("go"), call("c1"), result("c1", "out"), user("next")) == [0, 1, 2]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_window_never_starts_with_a_result_whose_call_is_behind_it(shape: str) -> None:
    """The viewport's window leaves out a result whose call is before it, cut by the budget
    or behind the boundary; the latter is eviction falling behind, so an auto-evict goes on."""
    call, result = SHAPES[shape]
    newest = [message(10 + i, m) for i, m in enumerate([
        result("c0", "late"), user("go"), call("c1"), result("c1", "out"), user("next")])]

    def shown(budget: int) -> tuple[list[int], bool]:
        inputs = ports.ViewportInputs(10, [], [], [], sum(m.tokens for m in newest), newest[::-1])
        view = layout("t", budget, inputs)
        return [m.seq for m in view.messages], view.behind

    assert shown(1000) == ([11, 12, 13, 14], True)
    assert shown(20) == ([14], True)


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_result_saved_after_its_call_never_shows_without_it(
    cmem: mnemo.Memory, shape: str
) -> None:
    """Each message appended alone (as the OpenAI Agents SDK's approval flow stores a call,
    then its output), auto-evicting at budgets around the turn's size: no viewport shows a
    result without its call, nothing hides, and `load` keeps the pair too."""
    call, result = SHAPES[shape]
    asked = call("c1")
    # Each message holds `tag<seq>`, which `hidden` searches for.
    parts = [{"type": "text", "text": "tag1"}, *asked["content"]] if shape == "anthropic" else None
    asked["content"] = parts or f"tag1 {asked['content'] or ''}"
    turn = [user("tag0 where is my parcel " * 3), asked, result("c1", "tag2 " + "depot " * 40),
            {"role": "assistant", "content": "tag3 depot"}]
    for budget in range(40, 160, 10):
        conversation = cmem.conversation(auto_evict_budget=budget)
        thread = f"t{budget}"
        for saved in turn:
            await conversation.append(thread, [saved])
            assert await hidden(cmem, thread, budget) == [], budget


@pytest.mark.parametrize("shape", SHAPES)
async def test_load_leaves_out_a_result_whose_call_was_compacted(
    cmem: mnemo.Memory, shape: str
) -> None:
    """A compaction ending at a call leaves its result without it: `load` leaves the result
    out, Responses items included."""
    call, result = SHAPES[shape]
    conversation = cmem.conversation()
    await conversation.save("t", [user("go"), call("c1"), result("c1", "out"), user("next")])
    await conversation.save_compaction("t", 0, 1, "The user asked; a tool ran.")
    loaded = await conversation.load("t")
    assert [m.get("content") for m in loaded[1:]] == ["next"]
