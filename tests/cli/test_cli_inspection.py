"""The command line's reads open the store for inspection (the API contract, "Inspection never
works"): they take no extraction over, call no model but for their own query, and record no model or
setting of a repo; `recall --reinforce` counts accesses, a plain one does not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner, Result

import mnemo
from mnemo.adapters.offline import OfflineLLM
from mnemo.cli import app
from mnemo.session.machine import SessionInfo
from tests.fakes import FakeLLM, leave_extracting

REPO = "ops"
# Built without touching the network; any call to it fails (nothing listens on port 9).
DEAD = "openai-compatible:dead@http://127.0.0.1:9/v1"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


class OfflineNamed(FakeLLM):
    """A FakeLLM recorded as the offline LLM: a Memory running `offline` may resume its work."""

    name = "offline"


async def _leave_extracting(store: str) -> str:
    """A session of a repo recorded with the offline LLM, left extracting."""
    return await leave_extracting(store, OfflineNamed(), repo=REPO,
                                  embedder=mnemo.HashEmbedder())


async def _sessions(store: str) -> list[SessionInfo]:
    async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(), inspect=True) as mem:
        return await mem.list_sessions()


def count_tasks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tasks the offline LLM is asked from now on, as they are asked."""
    asked: list[str] = []
    answer = OfflineLLM.generate

    async def counted(self: OfflineLLM, request: mnemo.LLMRequest) -> mnemo.LLMResponse:
        asked.append(request.task)
        return await answer(self, request)

    monkeypatch.setattr(OfflineLLM, "generate", counted)
    return asked


READS = [
    ["recall", REPO, "kitchen"], ["sessions"], ["repos"], ["history", REPO], ["graph", REPO],
    ["search", "kitchen"],
]


def test_the_read_commands_take_no_extraction_over(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session left extracting on the offline LLM, its holder gone: each read command, which
    runs the repo's offline LLM, neither claims the session nor asks the model to extract.
    Before, opening the store took the extraction over at once."""
    sid = anyio.run(_leave_extracting, store)
    before = anyio.run(_sessions, store)
    assert [(s.id, s.state) for s in before] == [(sid, mnemo.State.EXTRACTING)]
    asked = count_tasks(monkeypatch)
    for command in READS:
        result = invoke(*command, "--db", store)
        assert result.exit_code == 0, result.output
        assert set(asked) <= {"recall_plan"}, command  # its own query's plan, no extraction
        assert anyio.run(_sessions, store) == before, command  # state, holder, lease


def _ingest(store: str, folder: Path, name: str, *options: str) -> Result:
    source = folder / f"{name}.json"
    source.write_text(json.dumps({"sessions": [{
        "goal": f"Deploy {name}",
        "steps": [{"observation": f"gunicorn of {name} binds port 8000.", "action": "Reload."}],
    }]}))
    return invoke("ingest", str(source), "--repo", REPO, "--db", store, *options)


def test_a_recall_with_another_llm_leaves_the_recorded_one(store: str, tmp_path: Path) -> None:
    """`mnemo recall --llm URI` uses that model for itself only: the next ingest without
    --llm runs on the repo's recorded model. Before, `recall --llm` recorded it, and the next
    ingest ran on it (here: failed, nothing listens there)."""
    assert _ingest(store, tmp_path, "first", "--embedder", "hash").exit_code == 0
    result = invoke("recall", REPO, "gunicorn", "--db", store, "--llm", DEAD,
                    "--embedder", "hash")
    assert result.exit_code == 0, result.output
    again = _ingest(store, tmp_path, "second")
    assert again.exit_code == 0, again.output


def _access_counts(store: str) -> list[int]:
    async def read() -> list[int]:
        async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(), inspect=True) as mem:
            nodes = await mem.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
            stats = await mem._graph.access_stats(REPO, [n.id for n in nodes])
            return sorted(count for count, _ in stats.values())

    return anyio.run(read)


def test_recall_counts_accesses_only_with_reinforce(store: str, tmp_path: Path) -> None:
    """`mnemo recall` is a look and counts no access; `--reinforce` counts what it returned."""
    assert _ingest(store, tmp_path, "first", "--embedder", "hash").exit_code == 0
    before = _access_counts(store)
    looked: Any = json.loads(invoke("recall", REPO, "gunicorn port", "--db", store,
                                    "--json").stdout)
    assert looked["memories"]
    assert _access_counts(store) == before
    result = invoke("recall", REPO, "gunicorn port", "--db", store, "--reinforce")
    assert result.exit_code == 0, result.output
    assert sum(_access_counts(store)) > sum(before)
