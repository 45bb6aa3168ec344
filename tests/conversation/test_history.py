"""`save` takes a history that extends the stored one, and refuses any other (a sliding
window, an edited message) without storing anything; `append` takes new messages only."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import mnemo
from mnemo.conversation.drafts import history_hash, message_key
from tests.backends import sql
from tests.conversation._support import ManualClock, assistant, tool_call, tool_result, user
from tests.fakes import FakeEmbedder

A, B, C, D = (user(f"message {w} about ingress-{w}") for w in ("alpha", "bravo", "charlie",
                                                                "delta"))


async def test_a_sliding_window_is_refused_naming_the_first_seq_that_differs(
    cmem: mnemo.Memory,
) -> None:
    """Saving [b, c, d] after [a, b, c] (a window) raises InvalidInputError naming seq 0 and
    stores nothing; appending d stores it, and search finds it."""
    chat = cmem.conversation()
    await chat.save("t", [A, B, C])
    with pytest.raises(mnemo.InvalidInputError, match=r"messages\[0\] differs .* seq 0") as err:
        await chat.save("t", [B, C, D])
    assert "append" in str(err.value)
    assert [m.content for m in await chat.raw("t")] == [A["content"], B["content"], C["content"]]
    [added] = await chat.append("t", [D])
    assert added.seq == 3
    hits = await cmem.search_messages("delta")
    assert [h.seq for h in hits] == [3]
    # The history goes on from there: the full history saves again, and extends.
    assert [m.seq for m in await chat.save("t", [A, B, C, D, user("echo")])] == [4]


@pytest.mark.parametrize(
    ("seq", "edited", "differs"),
    [
        (1, user("message bravo, edited"), "content"),
        (1, {"role": "system", "content": B["content"]}, "role"),
        (2, {**tool_result("c1", "ok"), "tool_call_id": "c2"}, "tool_call_id"),
        (1, {**B, "name": "bob"}, "name"),
        (1, {"role": "user"}, "content"),
        (1, {**B, "content": None}, "content"),
        (1, {**tool_call("c9"), "name": "x"}, "role, content, name, tool_calls"),
    ],
)
async def test_an_edited_message_is_refused(
    cmem: mnemo.Memory, seq: int, edited: dict[str, Any], differs: str
) -> None:
    """A history whose message differs in role, content, name, tool_calls or tool_call_id
    from the stored one at its place is refused, naming that seq and the keys that differ;
    nothing is stored."""
    chat = cmem.conversation()
    stored = [A, B, tool_result("c1", "ok")]
    await chat.save("t", stored)
    history = [*stored, D]
    history[seq] = edited
    with pytest.raises(mnemo.InvalidInputError, match=rf"seq {seq} in {differs} \(of role"):
        await chat.save("t", history)
    assert len(await chat.raw("t")) == 3


async def test_tool_calls_are_compared(cmem: mnemo.Memory) -> None:
    """A tool call's arguments are part of the message: another one is refused; the same one
    (its keys in another order, other keys added) extends the history."""
    chat = cmem.conversation()
    call = tool_call("c1", arguments='{"path": "/etc"}')
    await chat.save("t", [A, call])
    other = tool_call("c1", arguments='{"path": "/var"}')
    with pytest.raises(mnemo.InvalidInputError, match=r"seq 1\b"):
        await chat.save("t", [A, other, D])
    same = {"tool_calls": [dict(reversed(call["tool_calls"][0].items()))],
            "content": None, "role": "assistant", "id": "kept by the app"}
    assert [m.seq for m in await chat.save("t", [A, same, D])] == [2]


async def test_repeat_and_shorter_saves_store_nothing(cmem: mnemo.Memory) -> None:
    """Saving the stored history again, or a prefix of it, appends nothing; a shorter history
    that is no prefix is refused."""
    chat = cmem.conversation()
    await chat.save("t", [A, B, C])
    assert await chat.save("t", [A, B, C]) == []
    assert await chat.save("t", [A, B]) == []
    assert await chat.save("t", []) == []
    with pytest.raises(mnemo.InvalidInputError, match=r"messages\[1\] differs .* seq 1"):
        await chat.save("t", [A, C])
    assert len(await chat.raw("t")) == 3


async def test_after_clear_the_seq_named_is_the_stored_ones(cmem: mnemo.Memory) -> None:
    """After clear a new history starts at the next seq: a refusal names the history's index
    and the stored message's seq."""
    chat = cmem.conversation()
    await chat.save("t", [A, B])
    await chat.clear("t")
    await chat.save("t", [C, D])
    with pytest.raises(mnemo.InvalidInputError, match=r"messages\[1\] differs .* seq 3"):
        await chat.save("t", [C, A, B])
    assert [m.seq for m in await chat.save("t", [C, D, A])] == [4]


async def test_a_none_key_is_the_message_without_it(cmem: mnemo.Memory) -> None:
    """A message with `"name"`, `"tool_call_id"`, `"tool_calls"` or `"content"` None (a
    pydantic item's `model_dump()`) is the same message as without the key (`exclude_none`):
    either history extends the other, also where `save` compares message by message (after a
    `pop`); another name differs."""
    chat = cmem.conversation()
    call = tool_call("c1")
    bare = {k: v for k, v in call.items() if k != "content"}
    await chat.save("t", [A, {**B, "name": None}, call])
    assert [m.seq for m in await chat.save("t", [A, B, bare, {**C, "tool_call_id": None}])
            ] == [3]
    dumped = [{**m, "name": None, "tool_call_id": None, "tool_calls": None} for m in (A, B)]
    dumped += [{**call, "name": None}, {**C, "tool_calls": None}, D]
    assert [m.seq for m in await chat.save("t", dumped)] == [4]
    await chat.pop("t")
    assert [m.seq for m in await chat.save("t", [A, B, bare, C, D])] == [5]
    with pytest.raises(mnemo.InvalidInputError, match=r"messages\[1\] differs .* seq 1"):
        await chat.save("t", [A, {**B, "name": "bob"}, bare, C, D, user("echo")])


async def test_a_ttl_erased_prefix_still_extends(store: str) -> None:
    """Messages the ttl erased are still part of the history: the full history extends it,
    and one that differs there is refused."""
    clock = ManualClock()
    async with mnemo.Memory(store, embedder=FakeEmbedder()) as mem:
        chat = mem.conversation(ttl=60, clock=clock)
        await chat.save("t", [A, B])
        clock.advance(seconds=120)
        await chat.save("t", [A, B, C])
        assert [m.seq for m in await chat.raw("t")] == [2]
        with pytest.raises(mnemo.InvalidInputError, match="ttl erased"):
            await chat.save("t", [B, A, C, D])
        with pytest.raises(mnemo.InvalidInputError, match=r"messages\[2\] differs .* seq 2"):
            await chat.save("t", [A, B, D])
        assert [m.seq for m in await chat.save("t", [A, B, C, D])] == [3]


async def test_an_item_kept_whole_past_the_bound_still_extends_after_a_pop(store: str) -> None:
    """A message holding an item kept whole (`openai_item`) past the bound is stored whole,
    search reading the bound's worth: after a `pop` (which makes `save` compare message by
    message) the same history extends. Before, its content was stored cut, never matched the
    caller's, and every later save of the thread was refused."""
    config = mnemo.Config(max_text_chars=100)
    async with mnemo.Memory(store, embedder=FakeEmbedder(), config=config) as mem:
        conv = mem.conversation()
        page = {"type": "function_call_output", "call_id": "c", "output": "x" * 500}
        first = {"role": "tool", "content": "x" * 500, "openai_item": page}
        await conv.save("t", [first, user("hi")])
        assert [len(m.content) for m in await conv.raw("t")] == [500, 2]
        await conv.pop("t")
        added = await conv.save("t", [first, user("again")])
        assert [m.content for m in added] == ["again"]
        assert (await conv.raw("t"))[0].data["openai_item"] == page


async def test_an_image_past_the_text_bound_is_stored_and_long_text_is_refused(
    store: str,
) -> None:
    """A message whose text fits `max_text_chars` is stored whole however large its other
    parts (a screenshot as an OpenAI data URL or an Anthropic base64 block), and comes back
    equal; one whose text does not is refused naming it, and nothing of its save is stored."""
    config = mnemo.Config(max_text_chars=1000)
    image = "iVBORw0KGgo" + "A" * 200_000
    shots = [
        {"role": "user", "content": [{"type": "text", "text": "What does this page say?"}, {
            "type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}]},
        {"role": "user", "content": [{"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": image}},
            {"type": "text", "text": "And this one?"}]},
    ]
    async with mnemo.Memory(store, embedder=FakeEmbedder(), config=config) as mem:
        chat = mem.conversation()
        await chat.save("t", shots)
        assert await chat.load("t") == shots
        assert [h.seq for h in await mem.search_messages("page say")] == [0]
        with pytest.raises(mnemo.InvalidInputError,
                           match=r"messages\[3\] holds 1,001 characters of text"):
            await chat.save("t", [*shots, user("ok"), user("x" * 1001)])
        huge = {"role": "user", "content": [{"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + "A" * 4_000_000}}]}
        with pytest.raises(mnemo.InvalidInputError, match=r"messages\[2\] .* 4,000,000 "):
            await chat.save("t", [*shots, huge])
        assert len(await chat.raw("t")) == 2


async def test_a_save_reads_no_stored_message(
    cmem: mnemo.Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save of a history that extends the stored one is checked by the stored history's
    hash: no stored message is read, however long the thread."""
    chat = cmem.conversation()
    history = [user(f"turn {i}") if i % 2 == 0 else assistant(f"reply {i}") for i in range(1500)]
    await chat.save("t", history[:1000])
    store = cmem._conversations.store
    read: list[int] = []
    first_difference = store.first_difference

    async def counted(thread_id: str, keys: Any) -> Any:
        read.append(len(keys))
        return await first_difference(thread_id, keys)

    monkeypatch.setattr(store, "first_difference", counted)
    monkeypatch.setattr(store, "raw", None)  # a save that read the whole log would fail here
    assert len(await chat.save("t", history)) == 500
    assert read == []


async def test_append_takes_new_messages_only(cmem: mnemo.Memory) -> None:
    """append stores every message given after the stored ones, however they compare to the
    stored ones; an empty list stores nothing; bad input stores nothing."""
    chat = cmem.conversation()
    await chat.append("t", [A, B])
    assert [m.seq for m in await chat.append("t", [B, C])] == [2, 3]
    assert await chat.append("t", []) == []
    with pytest.raises(mnemo.InvalidInputError, match=r"messages\[1\]"):
        await chat.append("t", [D, {"role": "user", "content": 5}])
    assert [m.content for m in await chat.raw("t")] == [
        m["content"] for m in (A, B, B, C)
    ]
    # save takes the whole history, as appended.
    assert [m.seq for m in await chat.save("t", [A, B, B, C, D])] == [4]


async def test_append_compresses_and_evicts_as_save_does(cmem: mnemo.Memory) -> None:
    """append with a Summary and an auto-eviction budget summarises and evicts like save."""
    chat = cmem.conversation(
        compression=mnemo.Summary(max_tokens=60, keep=2), auto_evict_budget=120
    )
    for i in range(8):
        await chat.append("t", [user(f"step {i}: the deploy of service {i} went through fine")])
    assert await chat.compactions("t")
    view = await cmem.viewport("t", token_budget=120)
    assert view.boundary_seq > 0
    assert view.snapshots


async def test_saves_racing_in_one_memory_store_one_history(cmem: mnemo.Memory) -> None:
    """Two saves of different extensions racing through one Memory: one is stored, the other
    is refused naming the seq where they part."""
    chat = cmem.conversation()
    await chat.save("t", [A, B])
    outcomes: list[str] = []

    async def save(last: dict[str, Any]) -> None:
        try:
            await chat.save("t", [A, B, last])
            outcomes.append(str(last["content"]))
        except mnemo.InvalidInputError as exc:
            outcomes.append("refused" if "seq 2" in str(exc) else str(exc))

    async with anyio.create_task_group() as tg:
        tg.start_soon(save, C)
        tg.start_soon(save, D)
    assert sorted(outcomes) == sorted([str(C["content"]), "refused"])
    [third] = (await chat.raw("t"))[2:]
    assert third.content in outcomes


async def test_a_thread_saved_before_hashes_is_checked_message_by_message(
    cmem: mnemo.Memory,
) -> None:
    """A thread stored before its history's hash was kept (NULL) is checked against its
    stored messages: a window is refused naming seq 0, the full history extends it, and from
    then on its hash is kept."""
    chat = cmem.conversation()
    await chat.save("t", [A, B])
    await sql(cmem, "UPDATE threads SET history_hash = NULL WHERE id = ?", "t")
    with pytest.raises(mnemo.InvalidInputError, match=r"messages\[0\] differs .* seq 0"):
        await chat.save("t", [B, C])
    await chat.append("t", [C])  # an unknown hash stays unknown
    assert await sql(cmem, "SELECT history_hash FROM threads WHERE id = ?", "t") == [(None,)]
    assert [m.seq for m in await chat.save("t", [A, B, C, D])] == [3]
    [(digest,)] = await sql(cmem, "SELECT history_hash FROM threads WHERE id = ?", "t")
    assert digest == history_hash(message_key(m, i) for i, m in enumerate([A, B, C, D]))
