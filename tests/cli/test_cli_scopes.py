"""`--where KEY=VALUE` on `mnemo recall` and `mnemo search`, and `mnemo forget` of a source or
a scope, on both backends (the store fixture's)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

import mnemo
from mnemo.cli import app

REPO = "ops"
runner = CliRunner()


def ok_json(*args: str) -> Any:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def scoped(store: str) -> str:
    """Alice's and Bob's facts ingested with their user_id, and a message of each."""

    async def fill() -> None:
        async with mnemo.Memory(store, embedder=mnemo.HashEmbedder()) as mem:
            await mem.open_repo(REPO)
            for user, n in (("alice", 1), ("bob", 2)):
                chat = mnemo.Trajectory("deploy", [mnemo.Step(
                    f"{user}'s gunicorn listens on port 800{n}.", "note it")])
                await mem.ingest(REPO, chat, source_id=f"chat-{user}",
                                 metadata={"user_id": user, "n": n})
                await mem.conversation().save(
                    f"t-{user}", [{"role": "user", "content": f"{user} asks about gunicorn"}],
                    metadata={"user_id": user})

    anyio.run(fill)
    return store


def test_recall_and_search_take_where(scoped: str) -> None:
    """--where KEY=VALUE (a string) and KEY:=JSON (typed) keep to the scope."""
    everyone = ok_json("recall", REPO, "gunicorn port", "--db", scoped)
    assert {m["node"]["metadata"]["user_id"] for m in everyone["memories"]} == {"alice", "bob"}
    alice = ok_json("recall", REPO, "gunicorn port", "--where", "user_id=alice", "--db", scoped)
    assert alice["memories"]
    assert {m["node"]["metadata"]["user_id"] for m in alice["memories"]} == {"alice"}
    typed = ok_json("recall", REPO, "gunicorn", "--where", "n:=2", "--db", scoped)
    assert {m["node"]["metadata"]["user_id"] for m in typed["memories"]} == {"bob"}
    assert ok_json("recall", REPO, "gunicorn", "--where", "n=2", "--db", scoped)["memories"] == []
    both = ok_json("recall", REPO, "gunicorn", "--where", "user_id=alice",
                   "--where", "user_id=bob", "--db", scoped)
    assert {m["node"]["metadata"]["user_id"] for m in both["memories"]} == {"alice", "bob"}
    hits = ok_json("search", "gunicorn", "--where", "user_id=bob", "--db", scoped)
    assert [h["thread_id"] for h in hits] == ["t-bob"]
    bad = runner.invoke(app, ["recall", REPO, "x", "--where", "user_id", "--db", scoped])
    assert bad.exit_code == 2
    assert "KEY=VALUE" in bad.stderr  # one line, no traceback


def test_forget_a_scope_or_a_source(scoped: str) -> None:
    """mnemo forget --where erases the scope only; mnemo forget SOURCE erases the source."""
    gone = ok_json("forget", REPO, "--where", "user_id=alice", "--yes", "--db", scoped)
    assert gone["nodes"] > 0
    left = ok_json("recall", REPO, "gunicorn port", "--db", scoped)
    assert {m["node"]["metadata"]["user_id"] for m in left["memories"]} == {"bob"}
    assert ok_json("forget", REPO, "chat-bob", "--yes", "--db", scoped)["nodes"] > 0
    assert ok_json("recall", REPO, "gunicorn port", "--db", scoped)["memories"] == []
    neither = runner.invoke(app, ["forget", REPO, "--yes", "--db", scoped])
    assert neither.exit_code == 2
