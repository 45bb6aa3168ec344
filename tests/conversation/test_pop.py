"""`ConversationManager.pop`: the newest message erased and returned, on both backends; `raw`
pages and `count` over what it leaves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import pytest

import mnemo
from tests.conversation._support import ManualClock, assistant, user
from tests.fakes import FakeEmbedder


async def test_pop_erases_the_newest_message_from_every_view(cmem: mnemo.Memory) -> None:
    """The popped message is returned and then neither raw, load, search nor a vector holds
    it; the one before it stays, and the next message takes a new seq."""
    conv = cmem.conversation(retrieval=mnemo.Semantic(k=5))
    await conv.append("t", [user("the parrot is green"), user("the walrus is purple")])

    popped = await conv.pop("t")

    assert popped is not None
    assert (popped.seq, popped.to_dict()) == (1, user("the walrus is purple"))
    assert [m.to_dict() for m in await conv.raw("t")] == [user("the parrot is green")]
    assert await conv.load("t") == [user("the parrot is green")]
    assert await conv.load("t", query="walrus purple") == [user("the parrot is green")]
    assert await cmem.search_messages("walrus") == []
    assert len(await cmem.search_messages("parrot")) == 1
    assert popped.id not in await cmem._conversations.store.vectors("t")
    [after] = await conv.append("t", [user("the owl is brown")])
    assert after.seq == 2


async def test_count_counts_what_pop_left(cmem: mnemo.Memory) -> None:
    """`count` is the number of messages stored (a popped one gone; 0 for no thread)."""
    conv = cmem.conversation()
    await conv.append("t", [user(f"message {i}") for i in range(6)])
    await conv.pop("t")
    assert (await conv.count("t"), await conv.count("nobody")) == (5, 0)


async def test_pop_of_an_empty_or_unknown_thread_is_none(cmem: mnemo.Memory) -> None:
    """Nothing to pop gives None; a thread popped empty stays a thread whose seqs go on."""
    conv = cmem.conversation()
    assert await conv.pop("nobody") is None
    await conv.append("t", [user("one")])
    assert await conv.pop("t") is not None
    assert await conv.pop("t") is None
    [again] = await conv.append("t", [user("two")])
    assert again.seq == 1
    with pytest.raises(mnemo.InvalidInputError):
        await conv.pop(" ")


async def test_pop_drops_the_compaction_that_holds_the_message(cmem: mnemo.Memory) -> None:
    """A summary covering the popped message goes (it quotes the message); the messages it
    covered load uncompacted, and a compaction before it stays."""
    conv = cmem.conversation()
    await conv.append("t", [user(f"message {i}") for i in range(4)])
    await conv.save_compaction("t", 0, 1, "zero and one")
    await conv.save_compaction("t", 2, 3, "two and three")

    await conv.pop("t")

    assert [(c.start_seq, c.end_seq) for c in await conv.compactions("t")] == [(0, 1)]
    assert [m["content"] for m in await conv.load("t")][1:] == ["message 2"]


async def test_concurrent_pops_of_two_memories_take_different_messages(
    store: str, embedder: FakeEmbedder
) -> None:
    """Two Memory objects on one store popping at once each take one message: the two
    newest, none twice."""
    async with mnemo.Memory(store, embedder=embedder) as one, \
            mnemo.Memory(store, embedder=embedder) as two:
        await one.conversation().append("t", [user(f"m{i}") for i in range(3)])
        popped: list[str] = []

        async def pop(mem: mnemo.Memory) -> None:
            message = await mem.conversation().pop("t")
            assert message is not None
            popped.append(message.content)

        async with anyio.create_task_group() as tg:
            tg.start_soon(pop, one)
            tg.start_soon(pop, two)
        assert sorted(popped) == ["m1", "m2"]
        assert [m.content for m in await two.conversation().raw("t")] == ["m0"]


async def test_a_save_after_pop_stores_the_new_tail(cmem: mnemo.Memory) -> None:
    """After pop the history is one shorter: saving the same history stores the popped message
    again, a regenerated reply is appended, and the next turns extend it."""
    conv = cmem.conversation()
    question, wrong, right = user("What is 2+2?"), assistant("5"), assistant("4")
    await conv.save("t", [question, wrong])
    await conv.pop("t")
    assert [m.seq for m in await conv.save("t", [question, wrong])] == [2]
    await conv.pop("t")
    assert [m.content for m in await conv.save("t", [question, right])] == ["4"]
    assert [m.seq for m in await conv.save("t", [question, right, user("thanks")])] == [4]
    with pytest.raises(mnemo.InvalidInputError, match=r"messages\[1\] differs .* seq 3"):
        await conv.save("t", [question, wrong, user("thanks"), user("more")])
    assert [m.content for m in await conv.raw("t")] == ["What is 2+2?", "4", "thanks"]


async def test_a_save_after_pop_of_a_ttl_erased_history(store: str) -> None:
    """Pop after the ttl erased the oldest messages: the history is one shorter, what follows
    is appended, and a refusal names the history's index of the stored message that differs."""
    clock = ManualClock()
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        conv = mem.conversation(ttl=60, clock=clock)
        history = [user(f"message {i}") for i in range(4)]
        await conv.save("t", history[:3])
        clock.advance(seconds=120)
        await conv.save("t", history)
        assert [m.seq for m in await conv.raw("t")] == [3]
        assert (await conv.pop("t")) is not None
        assert [m.seq for m in await conv.save("t", [*history[:3], user("again")])] == [4]
        longer = [*history[:3], user("again"), *history]
        assert [m.seq for m in await conv.save("t", longer)] == [5, 6, 7, 8]
        with pytest.raises(mnemo.InvalidInputError, match=r"messages\[3\] differs .* seq 4"):
            await conv.save("t", [*history, *history])
        with pytest.raises(mnemo.InvalidInputError, match="ttl erased"):
            await conv.save("t", [user("other"), *longer[1:], user("x")])


async def test_a_save_refuses_a_history_another_memory_popped_and_extended_meanwhile(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a save's check of the stored history and its write, another Memory pops the last
    message and appends its own (the stored length is as checked again): the save is refused,
    not written after a message its history never had."""
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as a_mem, \
            mnemo.Memory(store, embedder=FakeEmbedder()) as b_mem:
        a, b = a_mem.conversation(), b_mem.conversation()
        await a.save("t", [user("q"), assistant("wrong"), user("more")])
        embed = a._embed  # runs between the check and the write

        async def racing(*args: object, **kwargs: object) -> object:
            if await b.pop("t") is not None:
                await b.append("t", [user("other")])
            return await embed(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(a, "_embed", racing)
        with pytest.raises(mnemo.InvalidInputError, match="differs"):
            await a.save("t", [user("q"), assistant("wrong"), user("more"), user("next")])
        assert [m.content for m in await a.raw("t")] == ["q", "wrong", "other"]


@pytest.mark.parametrize("fillers", [12, 3])
async def test_a_popped_message_leaves_no_snapshot_telling_it(
    cmem: mnemo.Memory, fillers: int
) -> None:
    """Popping messages eviction had folded into snapshots erases those snapshots too (a
    fold of them as well), and moves the boundary back to the first message they told: those
    left are shown as messages again, so nothing hides, and nothing tells a popped word (with
    short messages a snapshot tells two; the boundary stopped at the popped one and hid the
    other)."""
    words = [f"zq{i:02d}mark" for i in range(16)]
    conv = cmem.conversation(auto_evict_budget=120)
    filler = "filler " * fillers
    for i in range(0, len(words), 2):
        await conv.append("t", [user(f"Note {i}: the codeword is {words[i]}. {filler}"),
                                assistant(f"Note {i + 1}: it is {words[i + 1]}. {filler}")])
    before = await cmem.viewport("t", token_budget=100_000)
    assert before.boundary_seq > 0
    everything = await cmem._conversations.store.snapshots("t")
    assert any(s.level == 1 and s.end_seq > s.start_seq for s in everything) == (fillers == 3)
    while len(await conv.raw("t")) > 1:
        popped = await conv.pop("t")
        assert popped is not None
        view = await cmem.viewport("t", token_budget=100_000)
        told = " ".join(s.text for s in view.snapshots)
        assert not any(w in told for w in words[popped.seq:])
        kept = {m.seq for m in await conv.raw("t")}
        shown = {m.seq for m in view.messages} | {
            seq for s in view.snapshots for seq in range(s.start_seq, s.end_seq + 1)}
        assert kept <= shown
        assert view.boundary_seq <= popped.seq


def _shown(view: mnemo.Viewport) -> set[int]:
    return {m.seq for m in view.messages} | {
        seq for s in view.snapshots for seq in range(s.start_seq, s.end_seq + 1)}


async def test_a_ttl_that_ends_part_of_a_snapshot_retells_it(cmem: mnemo.Memory) -> None:
    """A snapshot that told messages a thread's ttl erased and messages it kept is written
    again as a pointer to the kept ones: no snapshot tells an erased word, nothing hides, and
    the snapshots after it stay (the thread is not evicted again)."""
    clock = ManualClock()
    words = [f"zq{i:02d}mark" for i in range(24)]
    conv = cmem.conversation(auto_evict_budget=120, ttl=3600, clock=clock)
    for i in range(len(words)):
        said = f"Note {i}: the codeword is {words[i]}. " + "filler " * 3
        await conv.append("t", [assistant(said) if i % 2 else user(said)])
        clock.advance(seconds=60)
    store = cmem._conversations.store
    before = await cmem.viewport("t", token_budget=100_000)
    written = await store.snapshots("t")
    told = next(s for s in written if s.level == 1 and s.end_seq > s.start_seq)
    clock.advance(seconds=3600 - 60 * (len(words) - told.start_seq - 1))  # ends its first
    kept = {m.seq for m in await conv.raw("t")}
    assert told.start_seq not in kept
    assert told.end_seq in kept
    view = await cmem.viewport("t", token_budget=100_000)
    left = await store.snapshots("t")
    assert not any(w in s.text for s in left for w in words[:told.start_seq + 1])
    assert kept <= _shown(view)
    assert view.boundary_seq == before.boundary_seq
    later = [(s.start_seq, s.text) for s in written if s.level == 1 and s.start_seq > told.end_seq]
    assert later
    assert later == [(s.start_seq, s.text) for s in left
                     if s.level == 1 and s.start_seq > told.end_seq]
    pointer = next(s for s in left if s.level == 1 and s.end_seq == told.end_seq)
    assert (pointer.start_seq, "search_messages" in pointer.text) == (told.start_seq + 1, True)


async def test_an_eviction_that_lost_a_message_of_its_zone_writes_nothing(
    cmem: mnemo.Memory
) -> None:
    """An eviction whose zone lost its oldest message to a ttl, or its newest to `pop`, while
    the model wrote the snapshot, is refused: the snapshot would tell an erased message."""
    conv = cmem.conversation()
    await conv.append("t", [user(f"message {i}") for i in range(6)])
    store = cmem._conversations.store
    await store.expire("t", datetime.now(UTC) + timedelta(seconds=1))  # the ttl ended them all
    with pytest.raises(mnemo.ConflictError):
        await store.commit_eviction("t", boundary_before=0, boundary_after=3, zone=(0, 2),
                                    snapshot_text="message 0 said it", pins=[],
                                    now=datetime.now(UTC))
    assert await store.snapshots("t") == []
