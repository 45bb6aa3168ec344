"""The viewport and eviction: budgets, the zone math, snapshots, folding, goals and pins."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import mnemo
from mnemo.calls.tasks import task_inputs
from mnemo.conversation.render import render_zone
from mnemo.conversation.viewport import L1_SHARE, RECALL_SHARE, snapshot_tokens
from tests.conversation._support import OfflineFake, assistant, tool_call, tool_result, user
from tests.fakes import js


def even(n: int) -> list[dict[str, Any]]:
    """n messages of identical token cost, alternating user and assistant."""
    return [
        (user if i % 2 == 0 else assistant)(f"message number {i:03d} says plain things here")
        for i in range(n)
    ]


async def saved(mem: mnemo.Memory, history: list[dict[str, Any]], thread: str = "t") -> int:
    """Saves the history; returns the token cost of one message (they are all equal)."""
    stored = await mem.conversation().save(thread, history)
    return stored[0].tokens


async def test_viewport_keeps_the_newest_within_budget(cmem: mnemo.Memory) -> None:
    """The viewport holds the newest messages that fit, contiguous up to the last."""
    cost = await saved(cmem, even(30))
    view = await cmem.viewport("t", token_budget=cost * 10 + 3)
    assert [m.seq for m in view.messages] == list(range(20, 30))
    assert view.tokens <= view.token_budget
    assert view.tokens_past_boundary == cost * 30
    assert view.to_messages() == [m.to_dict() for m in view.messages]


async def test_viewport_of_unknown_thread_is_empty(cmem: mnemo.Memory) -> None:
    """An unknown thread has an empty viewport."""
    view = await cmem.viewport("ghost", token_budget=100)
    assert (view.messages, view.snapshots, view.pinned, view.tokens) == ([], [], [], 0)


async def test_viewport_drops_an_orphaned_tool_result(cmem: mnemo.Memory) -> None:
    """When the budget cuts between a call and its result, the result is left out too."""
    history = [user("go"), tool_call("c1"), tool_result("c1", "short"), assistant("done")]
    stored = await cmem.conversation().save("t", history)
    budget = stored[2].tokens + stored[3].tokens
    view = await cmem.viewport("t", token_budget=budget)
    assert [m.seq for m in view.messages] == [3]


@pytest.mark.parametrize(("budget_messages", "evicted"), [(30, 9), (15, 4), (60, 9)])
async def test_eviction_zone_is_the_oldest_fraction(
    cmem: mnemo.Memory, budget_messages: int, evicted: int
) -> None:
    """Only the oldest third (of the budget, or of what is there) leaves the viewport."""
    cost = await saved(cmem, even(30))
    result = await cmem.evict("t", token_budget=cost * budget_messages, eviction_fraction=0.33)
    assert (result.start_seq, result.end_seq) == (0, evicted - 1)
    assert (result.boundary_before, result.boundary_after) == (0, evicted)
    assert result.evicted == evicted
    assert result.tokens_evicted == evicted * cost
    view = await cmem.viewport("t", token_budget=cost * 100)
    assert [m.seq for m in view.messages] == list(range(evicted, 30))


async def test_eviction_never_takes_the_newest(cmem: mnemo.Memory) -> None:
    """Even with fraction 1 the newest message stays; one message alone is not evicted."""
    cost = await saved(cmem, even(2))
    result = await cmem.evict("t", token_budget=cost * 3, eviction_fraction=1.0)
    assert (result.start_seq, result.end_seq, result.boundary_after) == (0, 0, 1)
    again = await cmem.evict("t", token_budget=cost * 3, eviction_fraction=1.0)
    assert (again.evicted, again.boundary_before, again.boundary_after) == (0, 1, 1)
    assert again.snapshot is None


async def test_eviction_takes_a_newest_message_larger_than_the_budget(
    cmem: mnemo.Memory,
) -> None:
    """A newest message that alone exceeds the budget cannot be shown: it is evicted into a
    snapshot rather than left in no view at all."""
    stored = await cmem.conversation().save("t", [user("short"), user("huge " * 400)])
    budget = stored[1].tokens - 1
    first = await cmem.evict("t", token_budget=budget, eviction_fraction=0.1)
    assert (first.start_seq, first.end_seq) == (0, 0)
    second = await cmem.evict("t", token_budget=budget, eviction_fraction=0.1)
    assert (second.start_seq, second.end_seq, second.boundary_after) == (1, 1, 2)
    assert second.snapshot is not None
    assert (second.snapshot.start_seq, second.snapshot.end_seq) == (1, 1)


async def test_eviction_keeps_tool_results_with_their_call(cmem: mnemo.Memory) -> None:
    """A zone ending at a tool call takes its results along."""
    history = [user("u" * 40), tool_call("c1"), tool_result("c1", "r" * 40), tool_result("c1", "x"),
               user("next"), assistant("end")]
    stored = await cmem.conversation().save("t", history)
    budget = sum(m.tokens for m in stored)
    result = await cmem.evict("t", token_budget=budget, eviction_fraction=0.5)
    assert result.end_seq == 3


async def test_zone_rendering(cmem: mnemo.Memory, offline: OfflineFake) -> None:
    """The model sees "message N: role: text" lines, tool runs collapsed to [N tools called]."""
    history = [user("check the disk"), tool_call("c1", "df"), tool_result("c1", "80% used"),
               tool_call("c2", "du"), tool_result("c2", "logs 5G"), assistant("Logs fill it."),
               user("ok"), assistant("bye")]
    stored = await cmem.conversation().save("t", history)
    assert render_zone(stored[:6]) == (
        "message 0: user: check the disk\n"
        "message 1-4: [2 tools called]\n"
        "message 5: assistant: Logs fill it."
    )
    await cmem.evict("t", token_budget=sum(m.tokens for m in stored), eviction_fraction=0.9)
    request = next(r for r in offline.calls if r.task == "eviction")
    assert "message 1-4: [2 tools called]" in js(request.messages[0])["content"]
    assert request.tools is not None
    assert {t["name"] for t in request.tools} == {
        "save_snapshot", "attach_messages_to_goals", "everything_ok"
    }


async def test_eviction_writes_a_snapshot_shown_in_the_viewport(cmem: mnemo.Memory) -> None:
    """The zone's snapshot (level 1) appears in the viewport as untrusted memory."""
    history = [user("The staging database runs PostgreSQL 16 on host db2.internal."),
               assistant("Noted: PostgreSQL 16 on db2.internal."), *even(10)]
    await cmem.conversation().save("t", history)
    result = await cmem.evict("t", token_budget=4000, eviction_fraction=0.33)
    assert result.snapshot is not None
    assert result.snapshot.level == 1
    assert "db2.internal" in result.snapshot.text
    view = await cmem.viewport("t", token_budget=4000)
    assert view.snapshots == [result.snapshot]
    memory = js(view.to_messages()[0])
    assert memory["role"] == "system"
    assert "db2.internal" in memory["content"]
    assert 'trust="untrusted"' in memory["content"]


async def test_room_the_messages_leave_shows_the_older_snapshots(cmem: mnemo.Memory) -> None:
    """Snapshots past their share of the budget are shown where the messages leave room: what
    left the window is not hidden behind a fixed share."""
    cost = await saved(cmem, even(24))
    results = [await cmem.evict("t", token_budget=cost * 12, eviction_fraction=0.25)
               for _ in range(3)]
    written = [r.snapshot for r in results]
    assert all(s is not None and s.level == 1 for s in written)
    total = sum(snapshot_tokens(s) for s in written if s is not None)
    past = (await cmem.viewport("t", token_budget=cost * 100)).tokens_past_boundary
    budget = past + total
    assert budget * L1_SHARE < total  # the share alone holds fewer
    view = await cmem.viewport("t", token_budget=budget)
    assert view.snapshots == written
    assert len(view.messages) * cost == past
    assert view.tokens == budget
    # With an open goal, the older snapshots leave passive recall its share.
    await cmem.add_goal("t", "message number 001 says plain things")
    view = await cmem.viewport("t", token_budget=budget)
    assert view.snapshots == written[len(written) - len(view.snapshots):]
    assert past + sum(snapshot_tokens(s) for s in view.snapshots) <= budget * (1 - RECALL_SHARE)
    assert view.tokens <= budget


async def test_failed_eviction_still_advances(cmem: mnemo.Memory, offline: OfflineFake) -> None:
    """When the LLM fails, the boundary moves anyway and the snapshot points to search."""
    offline.fail_tasks.add("eviction")
    cost = await saved(cmem, even(30))
    result = await cmem.evict("t", token_budget=cost * 30)
    assert result.error is not None
    assert "boom" in result.error
    assert result.boundary_after == 9
    assert result.snapshot is not None
    assert "search_messages" in result.snapshot.text


async def test_pins_released_with_their_last_goal(cmem: mnemo.Memory) -> None:
    """An instruction in the zone is pinned to its goals, shown while one is open, released
    when the last one completes."""
    deploy = await cmem.add_goal("t", "deploy the nginx proxy")
    port = await cmem.add_goal("t", "choose the port")
    history = [user("Always use port 8443 for the nginx proxy."), assistant("Understood."),
               *even(10)]
    await cmem.conversation().save("t", history)
    result = await cmem.evict("t", token_budget=4000, eviction_fraction=0.1)
    assert result.start_seq == 0
    pinned_id = (await cmem.conversation().raw("t"))[0].id
    assert result.pinned == [pinned_id]
    view = await cmem.viewport("t", token_budget=4000)
    assert [m.id for m in view.pinned] == [pinned_id]
    assert "port 8443" in js(view.to_messages()[0])["content"]
    await cmem.complete_goal(deploy)
    assert [m.id for m in (await cmem.viewport("t", token_budget=4000)).pinned] == [pinned_id]
    await cmem.complete_goal(port)
    assert (await cmem.viewport("t", token_budget=4000)).pinned == []
    await cmem.complete_goal(port)  # completing again is harmless


async def test_goal_errors(cmem: mnemo.Memory) -> None:
    """Blank descriptions and unknown goals are refused."""
    with pytest.raises(mnemo.InvalidInputError):
        await cmem.add_goal("t", "  ")
    with pytest.raises(mnemo.NotFoundError):
        await cmem.complete_goal("goal_nope")


async def test_five_l1_snapshots_fold_into_l2(cmem: mnemo.Memory, offline: OfflineFake) -> None:
    """After 5 uncovered level-1 snapshots, they fold into one level-2 snapshot."""
    await cmem.conversation().save("t", even(200))
    results = [await cmem.evict("t", token_budget=4000) for _ in range(5)]
    assert [r.folded for r in results[:4]] == [None] * 4
    folded = results[4].folded
    assert folded is not None
    assert folded.level == 2
    assert (folded.start_seq, folded.end_seq) == (0, results[4].end_seq)
    view = await cmem.viewport("t", token_budget=4000)
    assert [s.level for s in view.snapshots] == [2]
    sixth = await cmem.evict("t", token_budget=4000)
    view = await cmem.viewport("t", token_budget=4000)
    assert [s.level for s in view.snapshots] == [2, 1]
    assert view.snapshots[1] == sixth.snapshot
    assert offline.tasks().count("snapshot_fold") == 1


async def test_failed_fold_keeps_level_one(cmem: mnemo.Memory, offline: OfflineFake) -> None:
    """A failed fold leaves the level-1 snapshots visible and is tried again later."""
    offline.fail_tasks.add("snapshot_fold")
    await cmem.conversation().save("t", even(200))
    for _ in range(5):
        result = await cmem.evict("t", token_budget=4000)
    assert result.folded is None
    assert [s.level for s in (await cmem.viewport("t", token_budget=4000)).snapshots] == [1] * 5
    offline.fail_tasks.clear()
    assert (await cmem.evict("t", token_budget=4000)).folded is not None


async def test_concurrent_evictions_never_share_a_zone(cmem: mnemo.Memory) -> None:
    """Two evictions of one thread run one after the other, over disjoint zones."""
    cost = await saved(cmem, even(30))
    results: list[mnemo.EvictionResult] = []

    async def evict() -> None:
        results.append(await cmem.evict("t", token_budget=cost * 30))

    async with anyio.create_task_group() as tg:
        tg.start_soon(evict)
        tg.start_soon(evict)
    first, second = sorted(results, key=lambda r: r.boundary_before)
    assert second.boundary_before == first.boundary_after
    assert first.end_seq is not None
    assert second.start_seq == first.end_seq + 1


async def test_auto_eviction(cmem: mnemo.Memory, offline: OfflineFake) -> None:
    """With auto_evict_budget, a save past the budget evicts until the viewport of that
    budget shows every message from the boundary on."""
    conv = cmem.conversation(auto_evict_budget=200)
    await conv.save("t", even(4))
    assert "eviction" not in offline.tasks()
    await conv.save("t", even(30))
    assert offline.tasks().count("eviction") >= 1
    view = await cmem.viewport("t", token_budget=200)
    assert view.boundary_seq > 0
    assert [m.seq for m in view.messages] == list(range(view.boundary_seq, 30))


async def test_a_small_budget_still_shows_the_newest_snapshot(cmem: mnemo.Memory) -> None:
    """A budget whose snapshot shares hold no whole snapshot still shows the newest one, in
    the memory's share, eviction keeping that room free: what left the window stays in view
    (it was shown nowhere, and eviction never fell behind)."""
    budget = 120
    conv = cmem.conversation(auto_evict_budget=budget)
    await conv.save("t", even(30))
    view = await cmem.viewport("t", token_budget=budget)
    assert view.boundary_seq > 0
    every = (await cmem.viewport("t", token_budget=10_000)).snapshots
    newest = max(every, key=lambda s: s.end_seq)
    assert snapshot_tokens(newest) > budget * L1_SHARE
    assert view.snapshots
    assert view.snapshots[-1] == newest
    assert not view.behind
    assert view.tokens <= budget


async def test_evict_refuses(cmem: mnemo.Memory) -> None:
    """Bad arguments and unknown threads are refused."""
    with pytest.raises(mnemo.NotFoundError):
        await cmem.evict("ghost", token_budget=100)
    await saved(cmem, even(3))
    for kwargs in ({"token_budget": 0}, {"token_budget": 100, "eviction_fraction": 1.5}):
        with pytest.raises(mnemo.InvalidInputError):
            await cmem.evict("t", **kwargs)
    with pytest.raises(mnemo.InvalidInputError):
        await cmem.viewport("t", token_budget=-1)


async def test_zone_rendering_of_calls_with_text(cmem: mnemo.Memory) -> None:
    """A call made beside text stays on its line; its results are counted as results."""
    with_text = {**tool_call("c1", "ls"), "content": "Let me look."}
    stored = await cmem.conversation().save(
        "t", [with_text, tool_result("c1", "a b"), assistant("Two files.")]
    )
    assert render_zone(stored) == (
        "message 0: assistant: Let me look. [1 tools called]\n"
        "message 1: [1 tool results]\n"
        "message 2: assistant: Two files."
    )


async def test_eviction_model_sees_three_zones(cmem: mnemo.Memory, offline: OfflineFake) -> None:
    """The eviction model sees the eviction, middle and recent zones of the window, each under
    a delimiter line, tool runs collapsed: what stays is context beside the zone."""
    history = [user(f"plan step {i}: migrate table t{i}") for i in range(20)]
    history += [tool_call("c1", "df"), tool_result("c1", "80% used"), user("now verify it")]
    stored = await cmem.conversation().save("t", history)
    result = await cmem.evict("t", token_budget=sum(m.tokens for m in stored))
    assert result.end_seq is not None
    inputs = js(task_inputs(next(r for r in offline.calls if r.task == "eviction")))
    zone, middle, recent = (inputs[k].splitlines() for k in ("zone", "middle", "recent"))
    assert zone[0] == (
        f"--- eviction zone: messages 0-{result.end_seq}, leaving the context window now ---"
    )
    assert middle[0].startswith(f"--- middle zone: messages {result.end_seq + 1}-")
    assert recent[0].startswith("--- recent zone: messages ")
    assert recent[-1] == "message 22: user: now verify it"
    assert "message 20-21: [1 tools called]" in middle + recent
    shown = [line.split(":")[0] for line in zone[1:] + middle[1:] + recent[1:]]
    assert shown == [f"message {i}" for i in range(20)] + ["message 20-21", "message 22"]


async def test_eviction_prompt_is_bounded(cmem: mnemo.Memory, offline: OfflineFake) -> None:
    """However long the backlog, the eviction prompt stays bounded, and says what it left
    out."""
    history = [user(f"message {i} " + "x" * 4000) for i in range(300)]
    await cmem.conversation().save("t", history)
    await cmem.evict("t", token_budget=10**6, eviction_fraction=0.5)
    request = next(r for r in offline.calls if r.task == "eviction")
    assert len(js(request.messages[0])["content"]) < 40_000
    inputs = js(task_inputs(request))
    assert "lines left out here; search_messages finds them" in inputs["zone"]
    assert "lines left out here; search_messages finds them" in inputs["middle"]
    last = inputs["recent"].splitlines()[-1]
    assert last.startswith("message 299: user: message 299 xxx")
    assert last.endswith("...")
    assert len(last) < 650
