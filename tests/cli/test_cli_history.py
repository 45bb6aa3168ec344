"""`mnemo history REPO` and `mnemo revert REPO COMMIT`, on each backend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
from typer.testing import CliRunner, Result

import mnemo
from mnemo.cli import app

runner = CliRunner()
REPO = "ops"


def invoke(*args: str, input: str | None = None) -> Result:
    return runner.invoke(app, list(args), input=input, env={"MNEMO_STORE": "", "MNEMO_DB": ""})


def ok_json(*args: str) -> Any:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_history_lists_and_revert_undoes(store: str) -> None:
    """history lists an ingest's commit with its source and counts; revert asks first (a no,
    or --json without --yes, keeps the commit), then removes its nodes, and history then lists
    the revert and the commit marked reverted; reverting it again is a clear error."""

    async def fill() -> list[str]:
        async with mnemo.Memory(store, embedder=mnemo.HashEmbedder()) as mem:
            await mem.open_repo(REPO)
            receipt = await mem.ingest(REPO, mnemo.Trajectory("Tune postgres", [mnemo.Step(
                "Postgres runs out of connections.", "Put pgbouncer in front of it.",
            )]), source_id="doc-1")
            return [str(i) for i in receipt.node_ids]

    node_ids = anyio.run(fill)
    (commit,) = ok_json("history", REPO, "--store", store)
    assert commit["source_id"] == "doc-1"
    assert commit["session_id"] is None
    assert commit["nodes"] == len(node_ids) > 0
    table = invoke("history", REPO, "--store", store)
    assert table.exit_code == 0
    assert "doc-1" in table.stdout
    short = commit["id"].removeprefix("changeset_")[:8]
    [row] = [line for line in table.stdout.splitlines() if "doc-1" in line]
    assert row.split("│")[2].strip() == short  # whole on its line, at 80 columns
    assert max(len(line) for line in table.stdout.splitlines()) <= 80
    assert invoke("revert", REPO, "0123456789", "--store", store).exit_code == 2

    declined = invoke("revert", REPO, short, "--store", store, input="n\n")
    assert declined.exit_code == 1
    assert f"remove its {len(node_ids)} nodes" in declined.stdout
    refused = invoke("revert", REPO, short, "--store", store, "--json")
    assert refused.exit_code == 2
    assert "--yes" in refused.stderr
    assert ok_json("history", REPO, "--store", store) == [commit]

    undone = ok_json("revert", REPO, short, "--yes", "--store", store)
    assert sorted(undone["node_ids"]) == sorted(node_ids)
    revert, reverted = ok_json("history", REPO, "--store", store)
    assert (revert["reverts"], revert["nodes"]) == (commit["id"], 0)
    assert (reverted["id"], reverted["reverted_by"]) == (commit["id"], revert["id"])
    assert undone["reverted_by"] == revert["id"]
    assert "(reverted)" in invoke("history", REPO, "--store", store).stdout
    assert ok_json("graph", REPO, "--store", store)["nodes"]["source"] == 0

    again = invoke("revert", REPO, commit["id"], "--store", store)
    assert again.exit_code == 2
    assert "was reverted by" in again.output
    assert invoke("history", "nope", "--store", store).exit_code == 2


def test_history_and_revert_never_create_a_database(tmp_path: Path) -> None:
    """On a missing file both are a one-line error (exit 2) and create nothing."""
    missing = tmp_path / "missing.db"
    for command in (["history", REPO], ["revert", REPO, "c1"]):
        result = invoke(*command, "--db", str(missing))
        assert result.exit_code == 2
        assert "no database" in result.output
    assert not missing.exists()
