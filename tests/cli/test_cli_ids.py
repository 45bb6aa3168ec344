"""Ids shown short, as git shows commits, and taken back by a unique prefix."""

from __future__ import annotations

import pytest

import mnemo
from mnemo.cli._database import CliError
from mnemo.cli._ids import resolve_id, short_ids

A = "session_3f2a9c1b00000000000000000000000a"
B = "session_3f2a9c1b77000000000000000000000b"
C = "session_9e000000000000000000000000000000"


def test_short_ids_are_eight_digits_or_as_many_as_tell_them_apart() -> None:
    """Each id is cut to 8 digits, or more where another id shares them; without its kind
    when asked."""
    assert short_ids([A, B, C]) == {
        A: "session_3f2a9c1b0", B: "session_3f2a9c1b7", C: "session_9e000000",
    }
    assert short_ids([C], known=[A], kind=False) == {C: "9e000000"}
    assert short_ids(["holder"]) == {"holder": "holder"}


def test_a_prefix_names_one_id_or_is_refused() -> None:
    """A whole id, a prefix with or without the kind, or a refusal naming the ambiguity."""
    assert resolve_id(A, [A, B], "session") == A
    assert resolve_id("3f2a9c1b0", [A, B, C], "session") == A
    assert resolve_id("session_9e", [A, B, C], "session") == C
    with pytest.raises(CliError, match="ambiguous: session_3f2a9c1b0, session_3f2a9c1b7"):
        resolve_id("3f2a", [A, B, C], "session")
    with pytest.raises(CliError, match="no session 'ff'"):
        resolve_id("ff", [A, B, C], "session")


async def test_message_ids_are_found_by_prefix(mem: mnemo.Memory) -> None:
    """message_ids lists the stored ids that start with a prefix, sorted and at most
    `limit`; a prefix holding `_` or `%` matches them literally."""
    chat = mem.conversation()
    await chat.save("t", [{"role": "user", "content": f"m{i}"} for i in range(3)])
    ids = sorted(m.id for m in await chat.raw("t"))
    assert await mem.message_ids(ids[0]) == [ids[0]]
    assert await mem.message_ids("msg_", limit=5) == ids
    assert await mem.message_ids("msg_", limit=2) == ids[:2]
    assert await mem.message_ids("msg%") == []
    assert await mem.message_ids("ms_") == []
    with pytest.raises(mnemo.InvalidInputError):
        await mem.message_ids(" ")
