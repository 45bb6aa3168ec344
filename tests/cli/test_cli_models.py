"""Choosing the store and the models from the command line: flags, environment, config file,
`mnemo doctor`, and a repo's own models used without flags."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner, Result

import mnemo
from mnemo.cli import app
from mnemo.cli._settings import resolve
from tests.adapters.provider_server import Fail, ProviderServer

runner = CliRunner()
# Every variable the settings read, so the host's environment cannot leak into a test.
CLEAN = {
    "MNEMO_STORE": "", "MNEMO_DB": "", "MNEMO_LLM": "", "MNEMO_EMBEDDER": "", "MNEMO_CONFIG": "",
}


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, list(args), env={**CLEAN, **(env or {})})


def one_line_error(result: Result, *words: str) -> None:
    """Exit 2 and one `error:` line on stderr naming the problem."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for word in words:
        assert word in lines[0]


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer(dim=16) as s:
        yield s


@pytest.fixture(autouse=True)
def no_config_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test runs in an empty folder with an empty user config folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in CLEAN:
        monkeypatch.delenv(name, raising=False)


# ---- precedence -----------------------------------------------------------------------------


def test_flags_beat_environment_beat_file_beat_defaults(tmp_path: Path) -> None:
    """Each setting comes from the flag, else the variable, else the file, else the default,
    and says where it came from."""
    (tmp_path / "mnemo.toml").write_text(
        'store = "from-file.db"\nllm = "anthropic:claude-file"\nembedder = "hash:8"\n'
    )
    env = {"MNEMO_LLM": "openai:gpt-env", "MNEMO_STORE": "env.db"}
    s = resolve(llm="offline", env=env, cwd=tmp_path)
    assert (s.store, s.llm, s.embedder) == ("env.db", "offline", "hash:8")
    assert {key: s.sources[key] for key in ("store", "llm", "embedder")} == {
        "store": "MNEMO_STORE", "llm": "--llm", "embedder": str(tmp_path / "mnemo.toml")
    }
    s = resolve(env={}, cwd=tmp_path)
    assert (s.store, s.llm) == (str(tmp_path / "from-file.db"), "anthropic:claude-file")
    s = resolve(env={}, cwd=tmp_path / "elsewhere")
    assert (s.store, s.llm, s.embedder) == ("memory.db", None, None)
    assert set(s.sources.values()) == {"default"}


def test_the_user_config_file_and_an_explicit_one(tmp_path: Path) -> None:
    """Without ./mnemo.toml the user's XDG config file is read; --config or MNEMO_CONFIG names
    another, which must then exist."""
    user = tmp_path / "xdg" / "mnemo" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text('embedder = "hash:16"\n')
    other = tmp_path / "other.toml"
    other.write_text('embedder = "minilm"\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert resolve(env=env, cwd=tmp_path).embedder == "hash:16"
    assert resolve(config=other, env=env, cwd=tmp_path).embedder == "minilm"
    assert resolve(env={**env, "MNEMO_CONFIG": str(other)}, cwd=tmp_path).embedder == "minilm"
    one_line_error(invoke("repos", "--config", str(tmp_path / "missing.toml")), "no config file")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('api_key = "sk"\n', "unknown setting 'api_key'"),
        ("llm = 3\n", "must be a non-blank string"),
        ("llm = \n", "not valid TOML"),
    ],
)
def test_a_bad_config_file_is_one_line(tmp_path: Path, text: str, words: str) -> None:
    """An unknown key (a key among them), a wrong type or broken TOML is one clear line."""
    (tmp_path / "mnemo.toml").write_text(text)
    one_line_error(invoke("repos"), words)


def test_model_errors_are_one_line_naming_the_fix(tmp_path: Path) -> None:
    """An unknown provider or a missing key, from a flag or the environment, is one line."""
    one_line_error(invoke("recall", "r", "q", "--llm", "gemini:pro"), "unknown LLM provider")
    one_line_error(
        invoke("recall", "r", "q", env={"MNEMO_LLM": "openai:gpt-4o-mini", "OPENAI_API_KEY": ""}),
        "OPENAI_API_KEY",
    )
    one_line_error(invoke("recall", "r", "q", "--embedder", "e5:x"), "unknown embedder")


def test_store_comes_from_the_environment_and_urls_are_checked(tmp_path: Path) -> None:
    """MNEMO_STORE names the store; a PostgreSQL URL without the backend is one clear line."""

    async def make() -> None:
        async with mnemo.Memory(tmp_path / "env.db", embedder=mnemo.HashEmbedder()) as mem:
            await mem.open_repo("from-env")

    anyio.run(make)
    listed = invoke("repos", "--json", env={"MNEMO_STORE": str(tmp_path / "env.db")})
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == [{"repo": "from-env", "live_sessions": 0}]
    one_line_error(invoke("repos", "--store", "postgresql://me@/mnemo"), "PostgreSQL")


# ---- a repo's own models ------------------------------------------------------------------


def test_a_repo_built_with_openai_embedder_is_queryable_from_the_cli(
    tmp_path: Path, server: ProviderServer
) -> None:
    """The CLI, given no models, recalls with the OpenAIEmbedder the repo was built with."""
    db = tmp_path / "m.db"

    async def build() -> None:
        embedder = mnemo.OpenAIEmbedder("embed-m", base_url=server.openai_url)
        async with embedder, mnemo.Memory(db, embedder=embedder) as mem:
            await mem.open_repo("r")
            await mem.ingest(
                "r", mnemo.Trajectory("g", [mnemo.Step("nginx listens on port 80", "ok")]),
                source_id="s",
            )

    anyio.run(build)
    before = len(server.requests)
    result = invoke("recall", "r", "nginx port", "--db", str(db), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["memories"]
    assert [r.path for r in server.requests[before:]] == ["/v1/embeddings"]


# ---- doctor -------------------------------------------------------------------------------


def doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    result = invoke("doctor", "--json", *args, env=env)
    return result.exit_code, json.loads(result.stdout)


def test_doctor_checks_store_model_and_embedder_with_real_calls(
    tmp_path: Path, server: ProviderServer
) -> None:
    """Against the local fake provider, doctor --quick makes one chat and one embedding call
    and reports the repos, the model's answer and the embedding dimension."""
    db = tmp_path / "m.db"

    async def make() -> None:
        async with mnemo.Memory(db, embedder=mnemo.HashEmbedder()) as mem:
            await mem.open_repo("ops")

    anyio.run(make)
    code, report = doctor(
        "--store", str(db), "--llm", f"openai-compatible:chat-m@{server.openai_url}",
        "--embedder", f"openai:embed-m@{server.openai_url}", "--quick",
    )
    assert code == 0, report
    checks = {c["check"]: c for c in report["checks"]}
    assert all(c["ok"] for c in checks.values())
    assert "1 repos (ops)" in checks["store"]["detail"]
    assert f"openai-compatible:chat-m@{server.openai_url}" in checks["llm"]["detail"]
    assert "dimension 16" in checks["embedder"]["detail"]
    assert sorted(r.path for r in server.requests) == ["/v1/chat/completions", "/v1/embeddings"]
    assert report["sources"]["llm"] == "--llm"


@pytest.mark.slow
def test_doctor_reports_each_failure_and_exits_1(tmp_path: Path, server: ProviderServer) -> None:
    """A missing store, a missing key and a failing provider are each one finding; exit 1."""
    server.script(Fail(500, "boom"), Fail(500, "boom"), Fail(500, "boom"), Fail(500, "boom"))
    code, report = doctor(
        "--store", str(tmp_path / "none.db"), "--llm", "anthropic:claude-x",
        "--embedder", f"openai:embed-m@{server.openai_url}",
        env={"ANTHROPIC_API_KEY": ""},
    )
    assert code == 1
    checks = {c["check"]: c for c in report["checks"]}
    assert checks.pop("package")["ok"]
    assert not any(c["ok"] for c in checks.values())
    assert "no database" in checks["store"]["detail"]
    assert "ANTHROPIC_API_KEY" in checks["llm"]["detail"]
    assert "500" in checks["embedder"]["detail"]
    assert not (tmp_path / "none.db").exists()
