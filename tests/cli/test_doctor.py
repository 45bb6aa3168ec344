"""`mnemo doctor` measures the LLM's server: latency, structured modes, requests served at
once, the concurrency mnemo will use, and whether each task's reply fits its `max_tokens`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.provider_server import Answer, ProviderServer
from tests.cli.test_cli_models import CLEAN, invoke

TASKS = ["state", "subgoal", "reward", "semantic", "procedural"]


@pytest.fixture(autouse=True)
def clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in CLEAN:
        monkeypatch.delenv(name, raising=False)


def doctor(server: ProviderServer, *args: str) -> tuple[int, dict[str, Any]]:
    result = invoke(
        "doctor", "--json", "--store", "none.db",
        "--llm", f"openai-compatible:m@{server.openai_url}",
        "--embedder", f"openai:e@{server.openai_url}", *args,
    )
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.slow
def test_a_one_slot_server_is_measured_as_serving_one_at_once() -> None:
    """Against a server that answers one request at a time, the parallel probe's batches of
    1, 2 and 4 take one reply's time each in turn: it serves 1 at once, and mnemo's planned
    concurrency is 1."""
    with ProviderServer(slots=1, latency=0.15) as server:
        _, report = doctor(server)
    measured = report["server"]
    assert set(measured["at_once_seconds"]) == {"1", "2", "4"}
    assert (measured["served_at_once"], measured["concurrency"]) == (1, 1)
    assert server.max_in_flight == 1


@pytest.mark.slow
def test_a_server_with_room_serves_several_at_once() -> None:
    """A server without a slot limit answers a batch of 4 in about one reply's time."""
    with ProviderServer(latency=0.3) as server:
        code, report = doctor(server)
    assert code == 1  # the store does not exist
    assert report["server"]["served_at_once"] >= 2
    assert server.max_in_flight >= 4


def test_structured_modes_and_task_fits_are_reported() -> None:
    """A server refusing json_schema shows that mode failed and the others working; each of
    mnemo's tasks is asked once, and a reply that used every token it was allowed is marked
    as cut."""
    with ProviderServer(json_schema=False) as server:
        server.answer_task("semantic", Answer(usage=(10, 100_000)))
        _, report = doctor(server)
    measured = report["server"]
    modes = {m["check"]: m for m in measured["structured_modes"]}
    assert not modes["json_schema"]["ok"]
    assert "response_format" in modes["json_schema"]["detail"]
    assert modes["tool"]["ok"]
    assert modes["json"]["ok"]
    tasks = {t["task"]: t for t in measured["tasks"]}
    assert list(tasks) == TASKS
    assert all(t["ok"] for t in tasks.values())
    assert tasks["semantic"]["fits"] is False
    assert tasks["reward"]["fits"] is True
    assert tasks["semantic"]["max_tokens"] > 0
    assert measured["ok"]


def test_a_mode_whose_reply_the_task_cannot_read_fails() -> None:
    """A structured mode counts as working only when its reply reads as the task's: a server
    answering the reward task with prose fails every mode, naming the problem."""
    with ProviderServer() as server:
        server.answer_task("reward", Answer(text="The step went well."))
        _, report = doctor(server)
    modes = report["server"]["structured_modes"]
    assert [m["ok"] for m in modes] == [False, False, False]
    assert all("not the task's" in m["detail"] for m in modes)


def test_quick_measures_nothing_and_the_table_shows_the_server() -> None:
    """--quick makes one chat call; without it the table has an "LLM server" part."""
    with ProviderServer() as server:
        quick = invoke(
            "doctor", "--json", "--quick", "--llm", f"openai-compatible:m@{server.openai_url}",
        )
        chats = sum(r.path.endswith("/chat/completions") for r in server.requests)
        table = invoke("doctor", "--llm", f"openai-compatible:m@{server.openai_url}")
    assert json.loads(quick.stdout)["server"] is None
    assert chats == 1
    assert "LLM server" in table.stdout
    assert "requests at once" in table.stdout
    assert "mnemo will keep" in table.stdout


def test_an_embedder_answering_one_vector_per_token_is_explained() -> None:
    """An embedding server that returns a vector per token fails the embedder check with what
    the server did and how to start it with pooling."""
    with ProviderServer(per_token=True) as server:
        result = invoke("doctor", "--json", "--quick", "--embedder",
                        f"openai:e@{server.openai_url}")
    checks = {c["check"]: c for c in json.loads(result.stdout)["checks"]}
    assert not checks["embedder"]["ok"]
    assert "one per token" in checks["embedder"]["detail"]
    assert "--pooling mean" in checks["embedder"]["detail"]


@pytest.mark.slow
def test_the_servers_speed_and_each_tasks_time_are_reported() -> None:
    """The probe's calls measure the server's speed (tokens a second, a reply's tokens with a
    tenth of its prompt's and its overhead), and each task is reported with the seconds one
    of its requests then gets: at least the first guess of 60 s, and no less for a task of
    more max_tokens; the table says both."""
    with ProviderServer(tokens_per_second=400.0, latency=0.05) as server:
        _, report = doctor(server)
        table = invoke("doctor", "--llm", f"openai-compatible:m@{server.openai_url}")
    measured = report["server"]
    assert measured["tokens_per_second"] > 0
    times = {t["task"]: t["timeout_seconds"] for t in measured["tasks"]}
    assert list(times) == TASKS
    assert all(seconds >= 60.0 for seconds in times.values())
    assert times["semantic"] >= times["reward"]
    shown = " ".join(table.stdout.replace("│", " ").split())  # cells wrap across lines
    assert "tokens a second" in shown
    assert "a request gets" in shown


def test_the_at_once_probe_cut_on_purpose_prints_no_warning() -> None:
    """The parallel probe's copies stop at 16 tokens on purpose (a server that stops at
    max_tokens cuts them): no "cut short" warning for them reaches the terminal."""
    with ProviderServer(context=1_000_000) as server:
        result = invoke(
            "doctor", "--json", "--store", "none.db",
            "--llm", f"openai-compatible:m@{server.openai_url}",
            "--embedder", f"openai:e@{server.openai_url}",
        )
    assert json.loads(result.stdout)["server"]["served_at_once"] is not None
    assert "cut short" not in result.stderr
