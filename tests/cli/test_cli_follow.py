"""Following a memory from the terminal: `mnemo recall` shows short ids, `mnemo show ID` takes
one (the node, its provenance, its links, its history), `mnemo diff COMMIT` shows what a
commit changed, and `mnemo history` names the goal each commit served; on each backend."""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner, Result

import mnemo
from mnemo.cli import app
from tests.cli.test_cli_inspection import _leave_extracting, _sessions, count_tasks

REPO = "ops"
GOAL = "Deploy the blog"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={"MNEMO_STORE": "", "MNEMO_DB": ""})


def ok(*args: str) -> str:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result.stdout


def ok_json(*args: str) -> Any:
    return json.loads(ok(*args, "--json"))


async def _fill(store: str) -> None:
    """A session's commit (two steps) and an ingest's, on the offline LLM."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder()) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session(GOAL, repo=REPO)
        await mem.append(sid, "nginx returns 502: gunicorn listens on port 8001.",
                         "Bind gunicorn to 127.0.0.1:8000 and reload nginx.")
        await mem.append(sid, "The TLS certificate of the blog expires in 3 days.",
                         "Run certbot renew and reload nginx.")
        await mem.close_and_commit(sid)
        await mem.ingest(REPO, mnemo.Trajectory("Tune postgres", [mnemo.Step(
            "Postgres refuses connections above 100 clients.", "Put pgbouncer in front.",
        )]), source_id="doc-1")


def _column(table: str, number: int) -> list[str]:
    """Column `number` (from 0) of a table, each row's lines joined (a row starts where its
    first column is filled)."""
    rows: list[list[str]] = []
    for line in table.splitlines():
        cells = line.split("│")[1:-1]
        if len(cells) > number:
            if cells[0].strip():
                rows.append([])
            rows[-1].append(cells[number].strip())
    return [" ".join(part for part in row if part) for row in rows]


def test_a_recalled_memory_is_followed_by_its_short_id(store: str) -> None:
    """recall's table shows each memory's short id (8 digits, a step with its index) and
    --json the whole one; `show` takes the short id and prints the node, the step and the
    session (with its goal) it came from, its tags, and the commit that added it."""
    anyio.run(_fill, store)
    recalled = ok_json("recall", REPO, "gunicorn port", "--store", store)["memories"]
    table = ok("recall", REPO, "gunicorn port", "--store", store)
    shown = _column(table, 1)
    assert len(shown) == len(recalled) > 1
    for short, memory in zip(shown, recalled, strict=True):
        whole = memory["node"]["id"]
        head, _, index = whole.rpartition("_")[2].partition(":")
        assert short == head[:8] + (f":{index}" if index else "")
    at = next(i for i, m in enumerate(recalled) if m["node"]["type"] == "semantic")
    fact, short = recalled[at]["node"], shown[at]

    text = ok("show", short, "--store", store)
    assert " ".join(fact["text"].split()[:4]) in " ".join(text.split())
    assert fact["id"] in text
    assert f": {GOAL}" in text  # the provenance's session and the history's commit
    report = ok_json("show", short, "--store", store)
    assert report["repo"] == REPO
    assert report["node"]["id"] == fact["id"]
    assert report["node"]["retired"] is False
    assert report["node"]["superseded_by"] is None
    (source,) = report["provenance"]["sources"]
    assert source["text"] == GOAL
    assert report["provenance"]["steps"]
    assert all(step["type"] == "episodic" for step in report["provenance"]["steps"])
    assert {n["type"] for n in report["links"]["membership"]} == {"tag"}
    (added,) = report["history"]
    assert added["changes"] == ["added"]
    assert added["goal"] == GOAL
    assert report["history_complete"] is True

    step = report["provenance"]["steps"][0]
    digits = step["id"].rpartition("_")[2]
    assert ok_json("show", digits[:8] + digits[32:], "--store", store)["node"]["id"] == step["id"]


def test_show_names_the_ambiguous_and_the_unknown_in_one_line(store: str) -> None:
    """A prefix that names several nodes lists some of them; an unknown id or repo, or a
    blank one, is a one-line error (exit 2)."""
    anyio.run(_fill, store)
    ambiguous = invoke("show", "semantic_", "--store", store)
    assert ambiguous.exit_code == 2
    assert re.search(r"node id 'semantic_' is ambiguous: semantic_[0-9a-f]{8}", ambiguous.stderr)
    assert len(ambiguous.stderr.strip().splitlines()) == 1
    for prefix in ("semantic", "seman"):  # wherever a shared prefix ends
        ambiguous = invoke("show", prefix, "--store", store)
        assert ambiguous.exit_code == 2
        assert f"node id {prefix!r} is ambiguous: semantic_" in ambiguous.stderr
    for args, said in ((["zzzz"], "no node 'zzzz'"), (["zzzz", "-r", "nope"], "unknown repo"),
                       ([" "], "no node id given")):
        refused = invoke("show", *args, "--store", store)
        assert refused.exit_code == 2, args
        assert said in refused.stderr


async def _correct(store: str) -> tuple[str, str, str]:
    """Corrects the fact about gunicorn's port; returns the old fact, the new one and the
    correction's commit."""
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder()) as mem:
        facts = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
        old = next(f for f in facts if "8001" in f.text)
        receipt = await mem.correct(REPO, old.id, "gunicorn listens on 127.0.0.1:8000.")
        return old.id, receipt.node_ids[0], receipt.changeset_id


def test_show_follows_a_corrected_fact_to_its_successor(store: str) -> None:
    """A corrected fact shows as retired, superseded by the new one, and its history holds
    the commit that added it and the correction that retired it; the new one supersedes
    it."""
    anyio.run(_fill, store)
    old, new, correction = anyio.run(_correct, store)
    report = ok_json("show", old, "--store", store)
    assert report["node"]["retired"] is True
    assert report["node"]["retired_at"] is not None
    assert report["node"]["superseded_by"] == new
    assert [(h["changes"], h["id"] == correction) for h in report["history"]] == [
        (["added"], False), (["retired"], True)]
    assert "(retired)" in ok("show", old, "--store", store)
    successor = ok_json("show", new, "--store", store)
    assert successor["node"]["supersedes"] == [old]
    assert successor["history"][0]["id"] == correction


def test_diff_shows_what_a_commit_added_with_its_goal(store: str) -> None:
    """diff takes a short commit id from history and prints the goal, each added node's short
    id and text, and the links; --json holds the nodes and links that commit_diff reads."""
    anyio.run(_fill, store)
    commits = ok_json("history", REPO, "--store", store)
    assert [c["goal"] for c in commits] == ["Tune postgres", GOAL]
    table = ok("history", REPO, "--store", store)
    assert _column(table, 3) == ["source doc-1: Tune postgres",
                                 f"session {commits[1]['session_id'][8:16]}: {GOAL}"]
    assert max(len(line) for line in table.splitlines()) <= 80
    session = commits[1]
    short = session["id"].removeprefix("changeset_")[:8]
    shown = ok_json("diff", short, "--store", store)
    assert shown["repo"] == REPO
    assert shown["commit"]["id"] == session["id"]
    assert shown["commit"]["goal"] == GOAL
    assert len(shown["added"]) == session["nodes"]
    assert len(shown["links"]) == session["links"]
    text = ok("diff", short, "--store", store)
    assert session["id"] in text
    assert GOAL in text
    for node in shown["added"]:
        digits = node["id"].rpartition("_")[2]
        head, _, index = digits.partition(":")
        assert f"+  {head[:8]}{':' + index if index else ''} " in text, node["id"]
    assert f"links added ({session['links']})" in text
    unknown = invoke("diff", "ffffffff", "--store", store)
    assert unknown.exit_code == 2
    assert "no commit 'ffffffff'" in unknown.stderr


def test_show_and_diff_take_no_extraction_over(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a session left extracting on the offline LLM, show and diff read without
    claiming it or asking any model."""
    anyio.run(_fill, store)
    sid = anyio.run(_leave_extracting, store)
    before = anyio.run(_sessions, store)
    assert sid in [s.id for s in before]
    asked = count_tasks(monkeypatch)
    commit = ok_json("history", REPO, "--store", store)[-1]
    node = ok_json("diff", commit["id"], "--store", store)["added"][0]
    ok("show", node["id"], "--store", store)
    ok("diff", commit["id"], "--repo", REPO, "--store", store)
    assert asked == []
    assert anyio.run(_sessions, store) == before


def test_history_diff_and_show_say_what_was_reverted(store: str) -> None:
    """A fact said by two ingests is one node: show lists the second commit as joining it.
    Once the first is reverted, history lists the revert (what it reverts) and the first
    marked reverted; diff of either says so; show keeps the node, its adding commit marked
    reverted."""
    trajectory = mnemo.Trajectory("Tune postgres", [mnemo.Step(
        "Postgres refuses connections above 100 clients.", "Put pgbouncer in front.")])

    async def fill() -> None:
        async with mnemo.Memory(store, embedder=mnemo.HashEmbedder()) as mem:
            await mem.open_repo(REPO)
            for source in ("doc-1", "doc-2"):
                await mem.ingest(REPO, trajectory, source_id=source)

    anyio.run(fill)
    second, first = ok_json("history", REPO, "--store", store)
    added = ok_json("diff", first["id"], "--store", store)["added"]
    knowledge = [n for n in added if n["type"] in ("semantic", "procedural")]
    assert (second["joined"], first["reverted_by"]) == (len(knowledge), None)
    fact = next(n for n in knowledge if n["type"] == "semantic")
    shown = ok_json("show", fact["id"], "--store", store)["history"]
    assert [(h["id"], h["changes"]) for h in shown] == [
        (first["id"], ["added"]), (second["id"], ["joined"])]

    ok("revert", REPO, first["id"], "--yes", "--store", store)
    revert, joined, reverted = ok_json("history", REPO, "--store", store)
    assert (revert["reverts"], reverted["reverted_by"]) == (first["id"], revert["id"])
    assert joined["reverted_by"] is None
    short = first["id"].removeprefix("changeset_")[:8]
    assert _column(ok("history", REPO, "--store", store), 3) == [
        f"revert of {short}", "source doc-2: Tune postgres",
        "source doc-1 (reverted)"]  # its goal, its source node's text, went with it
    assert re.search(rf"reverted +by {revert['id']}", ok("diff", first["id"], "--store", store))
    assert re.search(rf"reverts +{first['id']}", ok("diff", revert["id"], "--store", store))
    assert ok_json("diff", first["id"], "--store", store)["commit"]["reverted_by"] == revert["id"]
    text = ok("show", fact["id"], "--store", store)
    assert "(reverted)" in text
    assert "joined" in text
