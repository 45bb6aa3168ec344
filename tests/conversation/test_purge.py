"""Erasure: after `purge`, no byte of the thread is left in the database file or its WAL."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import mnemo
from tests.conversation._support import OfflineFake, assistant, tool_call, tool_result, user
from tests.fakes import FakeEmbedder


def occurrences(path: Path, needle: bytes) -> int:
    """How often `needle` appears in the database file and its -wal and -journal files."""
    total = 0
    for name in (path.name, f"{path.name}-wal", f"{path.name}-journal"):
        candidate = path.with_name(name)
        if candidate.exists():
            total += candidate.read_bytes().count(needle)
    return total


async def test_purge_leaves_no_trace(tmp_path: Path) -> None:
    """A unique marker saved everywhere a thread reaches (messages, tool calls, search index,
    vectors, compaction, snapshot, goal, pins) is gone from the file after purge and VACUUM."""
    marker = f"zq{uuid.uuid4().hex}qz"
    # FTS5 stores a term after the prefix it shares with the previous term, so look for a
    # stretch no other term can share; "qz" survives stemming.
    needle = marker[4:].encode()
    path = tmp_path / "memory.db"
    thread = f"thread-{marker}"
    async with mnemo.Memory(path, llm=OfflineFake(), embedder=FakeEmbedder()) as mem:
        conv = mem.conversation(
            retrieval=mnemo.Semantic(k=5), compression=mnemo.Summary(max_tokens=80, keep=2)
        )
        await mem.add_goal(thread, f"ship the {marker} release")
        history = [
            user(f"Always tag the build {marker} before the release of {marker}."),
            assistant(f"Understood, I will tag {marker} first."),
            tool_call("c1", "git_tag", f'{{"tag": "{marker}"}}'),
            tool_result("c1", f"tagged {marker} at commit abc123"),
            *[user(f"step {i}: the {marker} checklist item number {i} is done") for i in range(8)],
        ]
        await conv.save(thread, history)
        await conv.save("keeper", [user("unrelated thread about gardening tomatoes")])
        await conv.load(thread, query=f"checklist {marker}")
        result = await mem.evict(thread, token_budget=400, eviction_fraction=0.5)
        assert result.snapshot is not None
        assert marker in result.snapshot.text
        assert result.pinned, "the instruction was pinned to the goal"
        assert await conv.compactions(thread), "a summary holding the marker was saved"
        assert len(await mem.search_messages(marker)) > 0
        assert occurrences(path, needle) > 0, "sanity: the marker is in the file before purge"

        await conv.purge(thread)

        assert occurrences(path, needle) == 0, "nothing left even before VACUUM"
        assert await conv.raw(thread) == []
        assert await conv.load(thread, query=marker) == []
        assert await mem.search_messages(marker) == []
        assert (await mem.viewport(thread, token_budget=400)).snapshots == []
        assert [m["content"] for m in await conv.load("keeper")] == [
            "unrelated thread about gardening tomatoes"
        ]
    with sqlite3.connect(path) as conn:
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        leftovers = {
            table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("threads", "messages", "message_vectors", "compactions", "snapshots",
                          "goals", "pins")
        }
    conn.close()
    assert occurrences(path, needle) == 0
    assert leftovers == {"threads": 1, "messages": 1, "message_vectors": 1, "compactions": 0,
                         "snapshots": 0, "goals": 0, "pins": 0}
