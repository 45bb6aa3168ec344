"""Pins survive intact and show whenever the budget has room: they come first (up to half the
budget, which eviction keeps free for them), take the room the rest leaves, and are named in
`Viewport.pins_left_out` when even that cannot hold them, never cut."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import mnemo
from mnemo.conversation.ports import ViewportInputs
from mnemo.conversation.viewport import layout
from tests.conversation._support import hidden, tagged, user
from tests.fakes import js

INSTRUCTION = "Always use port 8443 for the nginx proxy. "


def pin_text(words: int) -> str:
    """An instruction (the offline eviction pins those) of about `words` more words."""
    return INSTRUCTION + " ".join(f"rule{i}" for i in range(words))


def message(seq: int, tokens: int) -> mnemo.Message:
    return mnemo.Message(f"m{seq}", "t", seq, "user", f"message {seq}", {},
                         datetime(2026, 1, 1, tzinfo=UTC), tokens)


def inputs(pins: list[int], past: list[int]) -> ViewportInputs:
    """A thread whose pins (before the boundary, seqs 0.., newest first as the store gives
    them) and messages past the boundary (seqs 100..) cost these tokens."""
    pinned = [message(seq, tokens) for seq, tokens in enumerate(pins)][::-1]
    newest = [message(100 + i, tokens) for i, tokens in enumerate(past)][::-1]
    return ViewportInputs(100, pinned, [], [], sum(past), newest)


async def test_a_pin_past_the_old_memory_share_is_shown_while_there_is_room(
    cmem: mnemo.Memory,
) -> None:
    """At a 2,000-token budget, a pinned instruction of 500 to 1,000 tokens (past the old 25%
    memory share, which hid it while most of the budget was free) is shown whole, within the
    budget, and nothing hides."""
    await cmem.add_goal("t", "deploy the nginx proxy")
    history: list[dict[str, Any]] = [user(pin_text(260))]
    history += [tagged(i, "user", 4) for i in range(1, 30)]
    stored = await cmem.conversation().save("t", history)
    assert 500 < stored[0].tokens < 1000
    result = await cmem.evict("t", token_budget=2000, eviction_fraction=0.01)
    assert result.pinned == [stored[0].id]
    view = await cmem.viewport("t", token_budget=2000)
    assert [m.id for m in view.pinned] == [stored[0].id]
    assert view.pinned[0].content == stored[0].content
    assert view.pins_left_out == []
    assert view.tokens <= 2000
    assert "port 8443" in js(view.to_messages()[0])["content"]


async def test_auto_eviction_keeps_room_for_a_large_pin(cmem: mnemo.Memory) -> None:
    """Under auto_evict_budget=2000, a pinned instruction of 500 to 1,000 tokens stays in view
    after every one of 40 saves (eviction keeps room for the pins' share), and nothing
    hides."""
    await cmem.add_goal("t", "deploy the nginx proxy")
    conv = cmem.conversation(auto_evict_budget=2000)
    history: list[dict[str, Any]] = [user(pin_text(260))]
    first = (await conv.save("t", history))[0]
    assert 500 < first.tokens < 1000
    shown_after: list[int] = []
    for turn in range(40):
        history.append(tagged(len(history), "user", 60))
        await conv.save("t", history)
        view = await cmem.viewport("t", token_budget=2000)
        if view.boundary_seq > 0:
            shown_after.append(turn)
            assert [m.id for m in view.pinned] == [first.id], f"after save {turn}"
        assert await hidden(cmem, "t", 2000) == [], f"after save {turn}"
    assert len(shown_after) > 20


async def test_evicting_while_the_viewport_is_behind_shows_the_pin(cmem: mnemo.Memory) -> None:
    """The README's manual loop, `evict` while `Viewport.behind`, ends with the pin shown, as
    auto-eviction does. The loop it gave before, until `tokens_past_boundary` fits the budget,
    stopped while the messages past the boundary still took the pin's room."""
    await cmem.add_goal("t", "deploy the nginx proxy")
    history: list[dict[str, Any]] = [user(pin_text(20))]
    history += [tagged(i, "user", 12) for i in range(1, 41)]
    stored = await cmem.conversation().save("t", history)
    budget = 200
    assert (await cmem.viewport("t", token_budget=budget)).behind
    for _ in range(40):
        if not (await cmem.viewport("t", token_budget=budget)).behind:
            break
        await cmem.evict("t", token_budget=budget)
    view = await cmem.viewport("t", token_budget=budget)
    assert not view.behind
    assert [m.id for m in view.pinned] == [stored[0].id]
    assert view.pins_left_out == []
    assert view.tokens <= budget
    assert await hidden(cmem, "t", budget) == []


def test_pins_past_their_share_take_the_room_left() -> None:
    """Two pins of 700 and 600 tokens at a 2,000-token budget: the newest takes the pins'
    half, the older the room the 200 tokens of messages leave; with 900 tokens of messages
    the older no longer fits, is left out whole and named."""
    view = layout("t", 2000, inputs([600, 700], [100, 100]))
    assert [m.seq for m in view.pinned] == [0, 1]
    assert (view.pins_left_out, view.tokens, view.behind) == ([], 1500, False)
    view = layout("t", 2000, inputs([600, 700], [450, 450]))
    assert [m.seq for m in view.pinned] == [1]
    assert [m.seq for m in view.messages] == [100, 101]
    assert (view.pins_left_out, view.tokens, view.behind) == (["m0"], 1600, False)


def test_pins_alone_past_the_budget_show_the_newest_that_fit() -> None:
    """Pins of 1,500, 1,200 and 800 tokens (oldest first) at a 2,000-token budget: the newest
    is shown, the two others are left out whole (never cut) and named, oldest first; the
    viewport stays within the budget and the messages keep their room."""
    view = layout("t", 2000, inputs([1500, 1200, 800], [100]))
    assert [(m.seq, m.tokens) for m in view.pinned] == [(2, 800)]
    assert view.pins_left_out == ["m0", "m1"]
    assert [m.seq for m in view.messages] == [100]
    assert (view.tokens, view.behind) == (900, False)


def test_messages_past_the_boundary_outrank_pins() -> None:
    """When the messages past the boundary need the pins' room (eviction is behind), the pins
    give way, oldest first, and the layout says eviction is behind."""
    view = layout("t", 2000, inputs([400, 500], [600, 600, 600]))
    assert view.behind
    assert [m.seq for m in view.messages] == [100, 101, 102]
    assert [m.seq for m in view.pinned] == []
    assert view.pins_left_out == ["m0", "m1"]
    assert view.tokens == 1800


def test_a_lone_newest_message_is_not_behind() -> None:
    """One message past the boundary, the newest, which eviction never takes unless it alone
    is past the budget, takes the memory's room without the layout saying eviction is
    behind (`evict` until it is not would never end); a second message past it is behind."""
    pin = 100
    view = layout("t", 300, inputs([pin], [261]))
    assert [m.seq for m in view.messages] == [100]
    assert view.pinned == []
    assert not view.behind
    assert layout("t", 300, inputs([pin], [130, 131])).behind
    assert layout("t", 300, inputs([pin], [301])).behind
