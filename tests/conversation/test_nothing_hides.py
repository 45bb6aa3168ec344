"""Nothing hides from the agent: every message is in the viewport, or inside a snapshot's
range, or pinned and shown, and search leaves out only what the viewport shows."""

from __future__ import annotations

from typing import Any

import mnemo
from tests.conversation._support import ScriptedEviction, hidden, snapshot_call, tagged, user
from tests.fakes import FakeEmbedder


async def test_auto_eviction_keeps_every_message_in_view(cmem: mnemo.Memory) -> None:
    """80 saves of long turns under auto_evict_budget=1000: after each save, every message is
    in the viewport or behind the boundary inside a snapshot, and findable when not shown."""
    conv = cmem.conversation(auto_evict_budget=1000)
    history: list[dict[str, Any]] = []
    for turn in range(80):
        history.append(tagged(len(history), "user", 40 + turn % 7 * 9))
        history.append(tagged(len(history), "assistant", 120 + turn % 5 * 17))
        await conv.save("t", history)
        assert await hidden(cmem, "t", 1000) == [], f"after save {turn}"
    view = await cmem.viewport("t", token_budget=1000)
    assert view.boundary_seq > 0
    assert view.messages[0].seq == view.boundary_seq


async def test_a_pin_larger_than_its_old_share_is_shown(cmem: mnemo.Memory) -> None:
    """A pinned message of a tenth of the budget (twice the old 5% pin share) is shown: pins
    come before the snapshots in the memory share."""
    goal = await cmem.add_goal("t", "deploy the nginx proxy")
    instruction = "Always use port 8443 for the nginx proxy. " + "Keep the config terse. " * 70
    stored = await cmem.conversation().save("t", [user(instruction), *map(user, ["ok"] * 30)])
    budget = stored[0].tokens * 10
    result = await cmem.evict("t", token_budget=budget, eviction_fraction=0.01)
    assert result.pinned == [stored[0].id]
    view = await cmem.viewport("t", token_budget=budget)
    assert [m.id for m in view.pinned] == [stored[0].id]
    assert view.tokens <= budget
    await cmem.complete_goal(goal)
    assert (await cmem.viewport("t", token_budget=budget)).pinned == []


async def test_a_pin_too_large_to_show_stays_findable(cmem: mnemo.Memory) -> None:
    """A pinned message larger than the whole memory share is not shown, and search with
    exclude_viewport_of still finds it."""
    await cmem.add_goal("t", "deploy the nginx proxy")
    instruction = "Always use port 8443 for the nginx proxy. " + "Keep the config terse. " * 70
    stored = await cmem.conversation().save("t", [user(instruction), *map(user, ["ok"] * 30)])
    budget = stored[0].tokens * 3
    result = await cmem.evict("t", token_budget=budget, eviction_fraction=0.01)
    assert result.pinned == [stored[0].id]
    assert (await cmem.viewport("t", token_budget=budget)).pinned == []
    hits = await cmem.search_messages("8443", exclude_viewport_of="t")
    assert [h.message_id for h in hits] == [stored[0].id]


async def test_snapshots_give_way_to_the_messages_past_the_boundary() -> None:
    """When an eviction's snapshot would crowd the boundary message out, the viewport drops
    the snapshot from view (its range stays covered) rather than the message."""
    llm = ScriptedEviction(snapshot_call("The user said ok. " * 12))
    async with mnemo.Memory(":memory:", llm=llm, embedder=FakeEmbedder()) as mem:
        history = [tagged(0, "user", 0), *(tagged(i, "user", 100) for i in range(1, 6))]
        stored = await mem.conversation().save("t", history)
        budget = sum(m.tokens for m in stored)
        result = await mem.evict("t", token_budget=budget, eviction_fraction=0.01)
        assert (result.start_seq, result.end_seq) == (0, 0)
        view = await mem.viewport("t", token_budget=budget)
        assert [m.seq for m in view.messages] == [1, 2, 3, 4, 5]
        assert view.snapshots == []
        assert await hidden(mem, "t", budget) == []
