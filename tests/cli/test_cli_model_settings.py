"""The temperature and the timeouts are settings like the store and the models: flag, then
environment, then config file; they reach the LLM's requests and the Memory's config."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mnemo.cli._settings import resolve
from tests.adapters.provider_server import ProviderServer, Slow
from tests.cli.test_cli_models import CLEAN, invoke, one_line_error

MORE = {"MNEMO_TEMPERATURE": "", "MNEMO_LLM_TIMEOUT": "", "MNEMO_EXTRACTION_TIMEOUT": ""}
SESSION = {"goal": "serve the blog", "steps": [
    {"observation": "nginx listens on port 80", "action": "curl localhost"},
]}


@pytest.fixture(autouse=True)
def clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test runs in an empty folder, with none of the settings' variables set."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in {**CLEAN, **MORE}:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer(dim=16) as s:
        yield s


def test_model_settings_come_from_flag_environment_or_file(tmp_path: Path) -> None:
    """temperature, llm_timeout and extraction_timeout follow the same order as the store;
    the file may give numbers; the LLM's URI carries the first two, overriding its own."""
    (tmp_path / "mnemo.toml").write_text(
        'llm = "openai-compatible:m@http://127.0.0.1:9/v1?temperature=0&max_tokens=99"\n'
        "temperature = 0.4\nllm_timeout = 120\nextraction_timeout = 900\n"
    )
    s = resolve(env={"MNEMO_LLM_TIMEOUT": "300"}, cwd=tmp_path, temperature="server")
    assert (s.temperature, s.llm_timeout, s.extraction_timeout) == ("server", 300.0, 900.0)
    assert s.sources["temperature"] == "--temperature"
    assert s.sources["llm_timeout"] == "MNEMO_LLM_TIMEOUT"
    assert s.llm_uri == (
        "openai-compatible:m@http://127.0.0.1:9/v1?max_tokens=99&temperature=server&timeout=300"
    )
    assert s.config is not None
    assert s.config.extraction_timeout == 900.0
    plain = resolve(env={}, cwd=tmp_path / "elsewhere")
    assert (plain.llm_uri, plain.config) == (None, None)


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (("--temperature", "hot"), {}, "temperature from --temperature must be a number"),
        ((), {"MNEMO_LLM_TIMEOUT": "0"}, "llm_timeout from MNEMO_LLM_TIMEOUT must be"),
        (("--extraction-timeout", "-5"), {}, "extraction_timeout from --extraction-timeout"),
        (("--temperature", "0.7"), {}, "--temperature tune the LLM chosen with --llm"),
    ],
)
def test_a_bad_model_setting_is_one_line(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], words: str
) -> None:
    """A value out of range names where it came from; a temperature flag with no LLM chosen
    says that each repo's model keeps its own."""
    result = invoke(
        "ingest", str(_file(tmp_path)), "--repo", "r", "--db", str(tmp_path / "m.db"), *args,
        env={**MORE, **env},
    )
    one_line_error(result, words)


def test_temperature_and_timeout_reach_the_llm_requests(
    tmp_path: Path, server: ProviderServer
) -> None:
    """`ingest --temperature 0.7` sends temperature 0.7 with every chat request."""
    result = invoke(
        "ingest", str(_file(tmp_path)), "--repo", "r", "--db", str(tmp_path / "m.db"),
        "--llm", f"openai-compatible:m@{server.openai_url}",
        "--embedder", f"openai:e@{server.openai_url}", "--temperature", "0.7",
        "--llm-timeout", "30", "--json", env=MORE,
    )
    assert result.exit_code == 0, result.output
    chats = [r.body for r in server.requests if r.path.endswith("/chat/completions")]
    assert chats
    assert {body["temperature"] for body in chats} == {0.7}


def test_the_extraction_timeout_bounds_the_extraction(
    tmp_path: Path, server: ProviderServer
) -> None:
    """`--extraction-timeout 0.5` against a model slower than that fails the ingest with the
    extraction timeout (the default of 60 s would have waited)."""
    server.answer_task("semantic", Slow(5))
    server.answer_task("procedural", Slow(5))
    result = invoke(
        "ingest", str(_file(tmp_path)), "--repo", "r", "--db", str(tmp_path / "m.db"),
        "--llm", f"openai-compatible:m@{server.openai_url}?timeout=10",
        "--embedder", f"openai:e@{server.openai_url}", "--extraction-timeout", "0.5",
        "--json", env=MORE,
    )
    one_line_error(result, "extraction_timeout")


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "talk.json"
    path.write_text(json.dumps(SESSION))
    return path
