"""Passive recall: while a thread has open goals, past messages relevant to them (evicted
ones of the thread, and other threads') come into its viewport, `load()` and the eviction
prompt, bounded, marked as memory, never beside a copy of themselves."""

from __future__ import annotations

import mnemo
from mnemo.calls.tasks import task_inputs
from mnemo.conversation.service import SCOPES
from tests.conversation._support import ScriptedEviction, assistant, snapshot_call, user
from tests.fakes import FakeEmbedder

OLD = [
    user("Where does the edge proxy keep its TLS material?"),
    assistant("The ingress certificate lives in the secret ingress-tls-zebra, namespace edge."),
    user("Thanks, and the staging database?"),
    assistant("Staging uses orders_stage on db-2."),
]
NOW = [user("Today we rotate credentials."), assistant("Sure, where do we start?")]
GOAL = "renew the ingress certificate before it expires"


async def test_an_open_goal_pulls_another_threads_message_into_the_viewport(
    cmem: mnemo.Memory,
) -> None:
    """With a goal about the ingress certificate open, the viewport's `recalled` holds the old
    thread's ingress-tls-zebra message, inside the budget and in the memory block; without an
    open goal it holds nothing."""
    chat = cmem.conversation()
    await chat.save("ops-2024", OLD)
    await chat.save("t", NOW)
    assert (await cmem.viewport("t", token_budget=2000)).recalled == []
    goal = await cmem.add_goal("t", GOAL)
    view = await cmem.viewport("t", token_budget=2000)
    [hit] = [h for h in view.recalled if "ingress-tls-zebra" in h.snippet]
    assert (hit.thread_id, hit.seq) == ("ops-2024", 1)
    assert isinstance(hit, mnemo.SearchHit)
    assert len(view.recalled) <= 5
    assert view.tokens <= 2000
    assert view.tokens > sum(m.tokens for m in view.messages)
    [memory, *rest] = view.to_messages()
    assert memory["role"] == "system"
    assert 'trust="untrusted"' in str(memory["content"])
    assert "ingress-tls-zebra" in str(memory["content"])
    assert rest == NOW
    await cmem.complete_goal(goal)
    assert (await cmem.viewport("t", token_budget=2000)).recalled == []


async def test_recall_never_repeats_what_the_viewport_shows_and_brings_back_evicted(
    cmem: mnemo.Memory,
) -> None:
    """Messages the viewport shows (from the boundary on) and its pins are never recalled;
    an evicted message of the thread is."""
    chat = cmem.conversation()
    early = [user("Note: the ingress certificate secret is ingress-tls-zebra."),
             assistant("Noted the ingress certificate secret name.")]
    await chat.save("t", [*early, *NOW])
    await cmem.add_goal("t", GOAL)
    view = await cmem.viewport("t", token_budget=2000)
    assert view.recalled == []  # every match is in view
    while (await cmem.viewport("t", token_budget=2000)).boundary_seq < 2:
        await cmem.evict("t", token_budget=200, eviction_fraction=0.5)
    await chat.save("t", [*early, *NOW, user("Which ingress certificate do we renew first?")])
    view = await cmem.viewport("t", token_budget=2000)
    shown = {m.id for m in [*view.messages, *view.pinned]}
    assert view.recalled
    assert {h.seq for h in view.recalled} <= {0, 1}
    assert not shown & {h.message_id for h in view.recalled}


async def test_recall_stays_within_its_share_of_the_budget(cmem: mnemo.Memory) -> None:
    """Recalled messages take at most a tenth of the budget and only the room the rest
    leaves: a budget the messages fill recalls nothing, and the viewport stays inside it."""
    chat = cmem.conversation()
    await chat.save("old", [user(f"ingress certificate note {i}: " + "detail " * 30)
                            for i in range(10)])
    await chat.save("t", NOW)
    await cmem.add_goal("t", GOAL)
    for budget in (60, 400, 10_000):
        view = await cmem.viewport("t", token_budget=budget)
        recalled = view.tokens - sum(m.tokens for m in view.messages)
        assert view.tokens <= budget
        assert recalled <= budget * 0.1
        assert len(view.recalled) <= 5
    assert (await cmem.viewport("t", token_budget=60)).recalled == []
    assert len((await cmem.viewport("t", token_budget=10_000)).recalled) == 5


async def test_load_carries_recalled_messages_as_memory(cmem: mnemo.Memory) -> None:
    """load() of a thread with an open goal has one system message, marked as memory,
    holding the recalled messages, none of those it loads; without a goal it has none."""
    chat = cmem.conversation(retrieval=mnemo.Recent(k=1))
    await chat.save("ops-2024", OLD)
    early = [user("The ingress certificate was renewed last year by hand.")]
    await chat.save("t", [*early, *NOW])
    assert await chat.load("t") == NOW
    await cmem.add_goal("t", GOAL)
    [memory, *rest] = await chat.load("t")
    assert rest == NOW
    text = str(memory["content"])
    assert memory["role"] == "system"
    assert 'trust="untrusted"' in text
    assert "ingress-tls-zebra" in text
    assert "renewed last year" in text  # an older message of the thread, not loaded
    await chat.save("t", [*early, *NOW, user("The ingress certificate: who renews it?")])
    loaded = await chat.load("t")
    assert "who renews it" not in str(loaded[0]["content"])


async def test_the_eviction_prompt_gets_the_recalled_messages(store: str) -> None:
    """An eviction of a thread with an open goal shows the model the recalled messages."""
    llm = ScriptedEviction(snapshot_call("We rotate credentials."))
    async with mnemo.Memory(store, llm=llm, embedder=FakeEmbedder()) as mem:
        chat = mem.conversation()
        await chat.save("ops-2024", OLD)
        await chat.save("t", NOW * 3)
        await mem.add_goal("t", GOAL)
        await mem.evict("t", token_budget=100, eviction_fraction=0.5)
    recalled = task_inputs(llm.requests[0])["recalled"]
    assert isinstance(recalled, str)
    assert "ingress-tls-zebra" in recalled


async def test_a_purged_thread_is_not_recalled(cmem: mnemo.Memory) -> None:
    """After purge, nothing of a thread is recalled."""
    chat = cmem.conversation()
    await chat.save("ops-2024", OLD)
    await chat.save("t", NOW)
    await cmem.add_goal("t", GOAL)
    assert (await cmem.viewport("t", token_budget=2000)).recalled
    await chat.purge("ops-2024")
    assert (await cmem.viewport("t", token_budget=2000)).recalled == []


async def test_recall_stays_inside_the_thread_s_scope(cmem: mnemo.Memory) -> None:
    """A thread saved with metadata recalls other threads' messages only inside the scope its
    messages share (every pair): Bob's viewport and load never hold Alice's message, Alice's
    second thread does; a thread whose messages share no pair recalls no other thread's, one
    without messages recalls nothing, and a thread without metadata recalls every thread's."""
    chat = cmem.conversation()
    await chat.save("alice-1", OLD, metadata={"user_id": "alice"})

    async def recalled(thread: str, messages: list[dict[str, str]],
                       *metadata: dict[str, str]) -> set[str]:
        """The threads `thread`'s viewport and load recall from, once `messages` are saved
        (message i with `metadata[i]`, the last for the rest) and the goal is open."""
        for i, message in enumerate(messages):
            scope = metadata[min(i, len(metadata) - 1)] if metadata else None
            await chat.append(thread, [message], metadata=scope)
        await cmem.add_goal(thread, GOAL)
        view = await cmem.viewport(thread, token_budget=2000)
        loaded = await chat.load(thread)
        zebra = "ingress-tls-zebra" in str(loaded)
        assert zebra == any("ingress-tls-zebra" in h.snippet for h in view.recalled)
        return {h.thread_id for h in view.recalled}

    alice, ops, bob = {"user_id": "alice"}, {"user_id": "alice", "org": "ops"}, {"user_id": "bob"}
    assert await recalled("bob-1", NOW, bob) == set()
    assert await recalled("alice-2", NOW, ops, alice) == {"alice-1"}
    assert await recalled("alice-ops", NOW, ops) == set()  # alice-1 is not of the org
    assert await recalled("bob-2", NOW, {"org": "ops", **bob}, bob) == set()
    assert await recalled("mixed", NOW, bob, alice) == set()
    many = [user(f"turn {i}") for i in range(SCOPES + 1)]
    # Each of its messages says alice, but more distinct metadata than read: taken as mixed.
    assert await recalled("alice-turns", many, *({**alice, "turn": str(i)}
                                                 for i in range(SCOPES + 1))) == set()
    assert await recalled("empty", []) == set()
    assert "alice-1" in await recalled("open", NOW)
