"""Nothing hides from the agent: every message is in the viewport, or inside a snapshot's
range, or pinned and shown, and search leaves out only what the viewport shows."""

from __future__ import annotations

import functools
import uuid
from contextlib import ExitStack
from typing import Any

import anyio.from_thread
import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import mnemo
from tests.conversation._support import (
    OfflineFake,
    ScriptedEviction,
    hidden,
    prose,
    snapshot_call,
    tagged,
    tool_call,
    tool_result,
    user,
)
from tests.fakes import FakeEmbedder


@pytest.mark.slow
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


async def test_search_leaves_out_only_what_a_viewport_behind_eviction_shows(
    cmem: mnemo.Memory,
) -> None:
    """With no eviction (none asked for, no auto_evict_budget), a viewport of 400 tokens
    shows only the newest messages that fit: search excluding it finds every other message
    and none it shows (it left out everything from the boundary on: 35 of 40 messages were in
    no view and unfindable); a message saved since is found; a purge forgets what the
    viewport showed."""
    await cmem.conversation().save("t", [tagged(i, "user", 30) for i in range(40)])
    view = await cmem.viewport("t", token_budget=400)
    shown = {m.seq for m in view.messages}
    assert view.boundary_seq == 0
    assert 0 < len(shown) < 40
    found: set[int] = set()
    for start in range(0, 40, 20):
        hits = await cmem.search_messages(
            " ".join(f"tag{seq}" for seq in range(start, start + 20)), thread_id="t",
            limit=100, exclude_viewport_of="t",
        )
        found |= {h.seq for h in hits}
    assert found == set(range(40)) - shown
    # Saved since the viewport: shown by none, so found.
    await cmem.conversation().save("t", [tagged(i, "user", 30) for i in range(42)])
    hits = await cmem.search_messages("tag40 tag41", exclude_viewport_of="t")
    assert sorted(h.seq for h in hits) == [40, 41]
    await cmem.conversation().purge("t")
    await cmem.conversation().save("t", [tagged(i, "user", 30) for i in range(3)])
    hits = await cmem.search_messages("tag0 tag1 tag2", exclude_viewport_of="t")
    assert hits == []  # no viewport of the new thread laid out: all from its boundary on


async def test_a_viewport_that_shows_no_message_hides_none_from_search(
    cmem: mnemo.Memory,
) -> None:
    """A newest message larger than the whole budget, not evicted yet: the viewport shows no
    message, so search excluding it finds them all (it left out everything from the
    boundary on)."""
    history = [*(tagged(i, "user", 5) for i in range(5)), tagged(5, "user", 2000)]
    await cmem.conversation().save("t", history)
    view = await cmem.viewport("t", token_budget=200)
    assert view.messages == []
    hits = await cmem.search_messages(
        " ".join(f"tag{i}" for i in range(6)), limit=10, exclude_viewport_of="t"
    )
    assert sorted(h.seq for h in hits) == list(range(6))


async def test_a_pin_larger_than_its_old_share_is_shown(cmem: mnemo.Memory) -> None:
    """A pinned message of a tenth of the budget (twice the old 5% pin share) is shown: pins
    come before the snapshots in the memory share; a search excluding the viewport leaves it
    out."""
    goal = await cmem.add_goal("t", "deploy the nginx proxy")
    instruction = "Always use port 8443 for the nginx proxy. " + "Keep the config terse. " * 70
    stored = await cmem.conversation().save("t", [user(instruction), *map(user, ["ok"] * 30)])
    budget = stored[0].tokens * 10
    result = await cmem.evict("t", token_budget=budget, eviction_fraction=0.01)
    assert result.pinned == [stored[0].id]
    view = await cmem.viewport("t", token_budget=budget)
    assert [m.id for m in view.pinned] == [stored[0].id]
    assert view.tokens <= budget
    # Shown, so a search excluding the viewport leaves it out (pins stayed findable).
    assert await cmem.search_messages("8443", exclude_viewport_of="t") == []
    await cmem.complete_goal(goal)
    assert (await cmem.viewport("t", token_budget=budget)).pinned == []


async def test_a_pin_too_large_to_show_stays_findable(cmem: mnemo.Memory) -> None:
    """A pinned message larger than the whole budget is not shown (never cut): the viewport
    names it in pins_left_out, and search with exclude_viewport_of still finds it."""
    await cmem.add_goal("t", "deploy the nginx proxy")
    instruction = "Always use port 8443 for the nginx proxy. " + "Keep the config terse. " * 70
    stored = await cmem.conversation().save("t", [user(instruction), *map(user, ["ok"] * 30)])
    budget = stored[0].tokens * 9 // 10
    result = await cmem.evict("t", token_budget=budget, eviction_fraction=0.01)
    assert result.pinned == [stored[0].id]
    view = await cmem.viewport("t", token_budget=budget)
    assert view.pinned == []
    assert view.pins_left_out == [stored[0].id]
    assert view.tokens <= budget
    hits = await cmem.search_messages("8443", exclude_viewport_of="t")
    assert [h.message_id for h in hits] == [stored[0].id]


async def test_snapshots_give_way_to_the_messages_past_the_boundary(store: str) -> None:
    """When an eviction's snapshot would crowd the boundary message out, the viewport drops
    the snapshot from view (its range stays covered) rather than the message."""
    llm = ScriptedEviction(snapshot_call("The user said ok. " * 12))
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        history = [tagged(0, "user", 0), *(tagged(i, "user", 100) for i in range(1, 6))]
        stored = await mem.conversation().save("t", history)
        budget = sum(m.tokens for m in stored)
        result = await mem.evict("t", token_budget=budget, eviction_fraction=0.01)
        assert (result.start_seq, result.end_seq) == (0, 0)
        view = await mem.viewport("t", token_budget=budget)
        assert [m.seq for m in view.messages] == [1, 2, 3, 4, 5]
        assert view.snapshots == []
        assert await hidden(mem, "t", budget) == []


class ThreadRules(RuleBasedStateMachine):
    """Random saves (auto-evicting at the thread's budget; a tool call saved with its result
    or before it), evictions at any budget, goals opened and completed (the offline model
    pins instructions to them), with an eviction model that works, answers in prose, or
    fails: nothing ever hides."""

    goals = Bundle("goals")

    def __init__(self, store: str) -> None:
        super().__init__()
        self.store = store
        # Examples share the test's store: each one writes a thread of its own.
        self.thread = f"t-{uuid.uuid4().hex}"
        self.stack = ExitStack()
        self.portal = self.stack.enter_context(anyio.from_thread.start_blocking_portal())
        self.history: list[dict[str, Any]] = []
        self.budget = 0

    @initialize(
        budget=st.integers(min_value=40, max_value=3000),
        model=st.sampled_from(["offline", "prose", "failing"]),
    )
    def open(self, budget: int, model: str) -> None:
        llm: mnemo.LLM
        if model == "prose":
            llm = ScriptedEviction(prose())
        else:
            llm = OfflineFake()
            if model == "failing":
                llm.fail_tasks.add("eviction")
        self.mem = self.stack.enter_context(
            self.portal.wrap_async_context_manager(
                mnemo.Memory(self.store, llm=llm, embedder=FakeEmbedder())
            )
        )
        self.budget = budget
        self.conv = self.mem.conversation(auto_evict_budget=budget)

    @rule(
        sizes=st.lists(st.integers(min_value=0, max_value=400), min_size=1, max_size=4),
        instruction=st.booleans(),
        tool=st.booleans(),
        apart=st.booleans(),
    )
    def save(self, sizes: list[int], instruction: bool, tool: bool, apart: bool) -> None:
        for size in sizes:
            role = "user" if len(self.history) % 2 == 0 else "assistant"
            message = tagged(len(self.history), role, size)
            if instruction and role == "user":
                message["content"] += " Always deploy the proxy on port 8443."
            self.history.append(message)
        if tool:
            seq = len(self.history)
            call = {**tool_call(f"c{seq}", "run", f'{{"q": "tag{seq}"}}'), "content": f"tag{seq}"}
            self.history.append(call)
            if apart:  # the call saved alone first, as an approval flow does
                self.portal.call(self.conv.save, self.thread, self.history)
            self.history.append(tool_result(f"c{seq}", f"tag{seq + 1} " + "out " * sizes[0]))
        self.portal.call(self.conv.save, self.thread, self.history)

    @precondition(lambda self: bool(self.history))
    @rule(
        budget=st.none() | st.integers(min_value=20, max_value=3000),
        fraction=st.floats(min_value=0.05, max_value=1.0),
    )
    def evict(self, budget: int | None, fraction: float) -> None:
        self.portal.call(
            functools.partial(
                self.mem.evict, self.thread, token_budget=budget or self.budget,
                eviction_fraction=fraction,
            )
        )

    @rule(target=goals, description=st.sampled_from(["deploy the proxy", "choose the port"]))
    def add_goal(self, description: str) -> str:
        goal: str = self.portal.call(self.mem.add_goal, self.thread, description)
        return goal

    @rule(goal=consumes(goals))
    def complete_goal(self, goal: str) -> None:
        self.portal.call(self.mem.complete_goal, goal)

    @invariant()
    def nothing_hides(self) -> None:
        if self.history:
            assert self.portal.call(hidden, self.mem, self.thread, self.budget) == []

    def teardown(self) -> None:
        self.stack.close()


@pytest.mark.slow
def test_nothing_hides_after_any_call(store: str) -> None:
    """No program of saves, evictions and goals, whatever the eviction model answers, hides a
    message from both the viewport and search."""

    class OnTheStore(ThreadRules):
        def __init__(self) -> None:
            super().__init__(store)

    run_state_machine_as_test(
        OnTheStore,
        settings=settings(
            max_examples=30, stateful_step_count=12, deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


async def boundary(mem: mnemo.Memory, thread_id: str) -> int:
    """The thread's boundary as stored (a viewport would lay itself out anew)."""
    state = await mem._conversations.store.state(thread_id)
    assert state is not None
    return state.boundary_seq


async def test_search_finds_what_an_eviction_moved_out_of_the_last_viewport(
    cmem: mnemo.Memory,
) -> None:
    """A viewport showed message 0, then a save evicted it (auto_evict_budget): search
    excluding that viewport finds it, now only in a snapshot. After an explicit evict, what
    it moved behind the boundary is found and what the viewport still shows is not.
    Regression: the last viewport's ids were left out as they were, so an evicted message
    was in no view and unfindable."""
    conv = cmem.conversation(auto_evict_budget=300)
    history = [tagged(i, "user", 30) for i in range(5)]
    await conv.save("t", history)
    assert 0 in {m.seq for m in (await cmem.viewport("t", token_budget=300)).messages}
    history += [tagged(i, "user", 30) for i in range(5, 12)]
    await conv.save("t", history)
    assert await boundary(cmem, "t") > 0
    hits = await cmem.search_messages("tag0", exclude_viewport_of="t")
    assert [h.seq for h in hits] == [0]
    view = await cmem.viewport("t", token_budget=300)
    await cmem.evict("t", token_budget=100)
    after = await boundary(cmem, "t")
    moved = {m.seq for m in view.messages if m.seq < after}
    assert moved
    assert any(m.seq >= after for m in view.messages)
    hits = await cmem.search_messages(
        " ".join(f"tag{m.seq}" for m in view.messages), limit=20, exclude_viewport_of="t")
    assert {h.seq for h in hits} == moved


async def test_a_save_whose_thread_is_purged_before_its_eviction_returns(
    cmem: mnemo.Memory, store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another Memory purges the thread after a save appended and before its eviction
    (auto_evict_budget): nothing is left to evict, and the save returns what it appended
    (it raised the eviction's NotFoundError)."""
    conv = cmem.conversation(auto_evict_budget=100)
    service = cmem._conversations
    evict = service._evict
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as other:

        async def purged_first(
            thread_id: str, token_budget: int, fraction: float, llm: mnemo.LLM
        ) -> Any:
            await other.conversation().purge(thread_id)
            return await evict(thread_id, token_budget, fraction, llm)

        monkeypatch.setattr(service, "_evict", purged_first)
        saved = await conv.save("t", [tagged(i, "user", 60) for i in range(6)])
    assert [m.seq for m in saved] == list(range(6))
    assert await conv.raw("t") == []
