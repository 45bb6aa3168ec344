"""A thread's messages carry the metadata they were saved with, and search_messages(where=)
finds only the messages of that scope (mnemo/storage/*/conversation.py)."""

from __future__ import annotations

import pytest

import mnemo


async def test_saved_messages_carry_metadata_and_search_keeps_to_the_scope(
    mem: mnemo.Memory,
) -> None:
    """save/append(metadata=) reach Message.metadata; where= selects by key and value (a
    list: any of them), keeping JSON types apart."""
    conv = mem.conversation()
    await conv.save("t1", [{"role": "user", "content": "my kettle is blue"}],
                    metadata={"user_id": "alice", "n": 1})
    await conv.append("t2", [{"role": "user", "content": "my kettle is red"}],
                      metadata={"user_id": "bob", "n": True})
    await conv.save("t3", [{"role": "user", "content": "a kettle without owner"}])
    assert [m.metadata for m in await conv.raw("t1")] == [{"user_id": "alice", "n": 1}]
    assert [m.metadata for m in await conv.raw("t3")] == [{}]
    assert len(await mem.search_messages("kettle", limit=10)) == 3
    alice = await mem.search_messages("kettle", limit=10, where={"user_id": "alice"})
    assert [h.thread_id for h in alice] == ["t1"]
    both = await mem.search_messages("kettle", limit=10, where={"user_id": ["alice", "bob"]})
    assert sorted(h.thread_id for h in both) == ["t1", "t2"]
    assert [h.thread_id for h in await mem.search_messages(
        "kettle", limit=10, where={"n": 1})] == ["t1"]
    assert [h.thread_id for h in await mem.search_messages(
        "kettle", limit=10, where={"n": True})] == ["t2"]
    assert await mem.search_messages("kettle", where={"user_id": "carol"}) == []
    assert await mem.search_messages("kettle", thread_id="t2", where={"user_id": "alice"}) == []



@pytest.mark.parametrize("value", ["José", "東京", "a\x7fb", 0.1 + 0.2, 1e-300, 2**63 - 1])
async def test_search_finds_a_scope_whatever_its_value(mem: mnemo.Memory, value: object) -> None:
    """A where on a value SQLite's json_quote spells unlike Python's JSON (a non-ASCII
    string, a float it rounds, the largest int) finds that scope's messages on both
    backends: SQLite compared its re-spelling of the stored value with Python's, and found
    nothing for {"user_id": "José"}."""
    conv = mem.conversation()
    await conv.save("t1", [{"role": "user", "content": "my kettle is blue"}],
                    metadata={"user_id": value})
    await conv.save("t2", [{"role": "user", "content": "my kettle is red"}],
                    metadata={"user_id": "bob"})
    found = await mem.search_messages("kettle", limit=10, where={"user_id": value})
    assert [h.thread_id for h in found] == ["t1"]

async def test_bad_message_metadata_or_where_is_refused(mem: mnemo.Memory) -> None:
    """A metadata or a where outside the bounds is InvalidInputError; nothing is stored."""
    conv = mem.conversation()
    with pytest.raises(mnemo.InvalidInputError):
        await conv.save("t", [{"role": "user", "content": "x"}], metadata={"k": [1]})
    with pytest.raises(mnemo.InvalidInputError):
        await conv.append("t", [{"role": "user", "content": "x"}], metadata="alice")  # type: ignore[arg-type]
    assert await conv.raw("t") == []
    with pytest.raises(mnemo.InvalidInputError):
        await mem.search_messages("x", where={"k": {"a": 1}})
