"""Ids shown short, as git shows commits, and taken back by a unique prefix."""

from __future__ import annotations

import pytest

import mnemo
from mnemo.cli._database import CliError
from mnemo.cli._ids import resolve_id, resolve_in_repos, short_ids

A = "session_3f2a9c1b00000000000000000000000a"
B = "session_3f2a9c1b77000000000000000000000b"
C = "session_9e000000000000000000000000000000"


def test_short_ids_are_eight_digits_or_as_many_as_tell_them_apart() -> None:
    """Each id is cut to 8 digits, or more where another id shares them; without its kind
    when asked."""
    assert short_ids([A, B, C], kind=True) == {
        A: "session_3f2a9c1b0", B: "session_3f2a9c1b7", C: "session_9e000000",
    }
    assert short_ids([C], known=[A]) == {C: "9e000000"}
    assert short_ids(["holder"], kind=True) == {"holder": "holder"}


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


STEP = "episodic_episode_085d80d976084afeac8e31ceb7b6cf8c:3"
SOURCE = "source_episode_085d80d976084afeac8e31ceb7b6cf8c"


def test_a_step_is_shown_and_named_with_its_index() -> None:
    """A step's short id is its episode's digits and its index; without the index a prefix
    names the episode's source, not its steps; a clash of 8 digits lengthens both."""
    other = STEP.replace(":3", ":13")
    assert short_ids([STEP, other, SOURCE]) == {
        STEP: "085d80d9:3", other: "085d80d9:13", SOURCE: "085d80d9"}
    assert resolve_id("085d80d9:3", [STEP, other, SOURCE], "node") == STEP
    assert resolve_id("085d80d9", [STEP, other, SOURCE], "node") == SOURCE
    assert resolve_id("episodic_episode_085d:13", [STEP, other], "node") == other
    twin = "semantic_" + "085d80d9" + "f" * 24
    assert short_ids([SOURCE, twin]) == {SOURCE: "085d80d97", twin: "085d80d9f"}


def test_an_id_is_found_among_several_repos() -> None:
    """Across repos the one match wins; an ambiguity names each candidate's repo; a miss in
    one repo names it."""
    found = {"a": [A, C], "b": [B]}
    assert resolve_in_repos("9e", found, "session") == ("a", C)
    with pytest.raises(CliError, match=r"ambiguous: session_3f2a9c1b0 \(a\), "
                                       r"session_3f2a9c1b7 \(b\)"):
        resolve_in_repos("3f2a", found, "session")
    with pytest.raises(CliError, match="no session 'ff' in repo 'a'"):
        resolve_in_repos("ff", {"a": [A]}, "session")


async def test_node_ids_are_found_by_a_short_id(mem: mnemo.Memory) -> None:
    """node_ids finds a node by a prefix of its id or of its digits, a step only with its
    index, `_` and `%` literally, sorted and at most `limit`; bad input is refused."""
    await mem.open_repo("r")
    receipt = await mem.ingest("r", mnemo.Trajectory("explore", [
        mnemo.Step(f"room {i}", "go north") for i in range(12)]), source_id="walk")
    ids = [str(i) for i in receipt.node_ids]
    fact = next(i for i in ids if i.startswith("semantic_"))
    step = next(i for i in ids if i.startswith("episodic_") and i.endswith(":1"))
    source = next(i for i in ids if i.startswith("source_"))
    digits = fact.rpartition("_")[2]
    assert await mem.node_ids("r", digits[:8]) == [fact]
    assert await mem.node_ids("r", fact) == [fact]
    assert await mem.node_ids("r", "semantic_" + digits[:6]) == [fact]
    episode = step.rpartition("_")[2].partition(":")[0]
    assert await mem.node_ids("r", f"{episode[:8]}:1") == [step]
    assert await mem.node_ids("r", f"{episode[:8]}:99") == []
    assert await mem.node_ids("r", episode[:8]) == [source]
    steps = sorted(i for i in ids if i.startswith("episodic_"))
    assert await mem.node_ids("r", "episodic_", limit=100) == []  # a step needs its index
    kind = step.rpartition("_")[0] + "_"  # episodic_ingest_
    assert await mem.node_ids("r", f"{kind}{episode[:4]}:1") == [step]
    assert len(steps) == 12
    assert await mem.node_ids("r", "semantic%") == []
    assert await mem.node_ids("r", "semantic\\_") == []
    assert len(await mem.node_ids("r", "semantic_", limit=100)) > 1
    assert len(await mem.node_ids("r", "semantic_", limit=1)) == 1
    facts = sorted(i for i in ids if i.startswith("semantic_"))
    for kind in ("semantic", "seman", "s"):  # a prefix of the kind, ending anywhere
        assert (await mem.node_ids("r", kind, limit=100))[:len(facts)] == facts, kind
    assert await mem.node_ids("r", "sourc") == [source]
    for prefix, limit in ((" ", 2), ("x", 0), ("x", 101)):
        with pytest.raises(mnemo.InvalidInputError):
            await mem.node_ids("r", prefix, limit=limit)
    with pytest.raises(mnemo.NotFoundError):
        await mem.node_ids("nope", "x")
