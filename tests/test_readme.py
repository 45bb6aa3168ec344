"""README.md's code runs as written: every ```python block is executed (offline, in a fresh
directory; an agent of the OpenAI Agents SDK talks to a local fake server), and every
```python no-run block (those need a model provider) at least compiles."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import anyio
import pytest

import mnemo
from tests.adapters.provider_server import ProviderServer

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def blocks(info: str) -> list[tuple[int, str]]:
    """(line number, code) of every fenced block whose info string is exactly `info`."""
    text = README.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, m.start()) + 1, m.group("body"))
        for m in FENCE.finditer(text)
        if m.group("info").strip() == info
    ]


RUNNABLE = blocks("python")


def run_block(line: int, code: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs the block in `folder`; it must end every session it starts. A block that runs an
    OpenAI Agents SDK agent gets a fake model server on 127.0.0.1 as its OpenAI endpoint
    (through the variables the SDK reads), with the SDK's tracing off, and must call it."""
    monkeypatch.chdir(folder)
    with ProviderServer() as server:
        if "from agents import" in code:
            from agents import set_tracing_disabled  # the SDK's import: 2 s, here only

            set_tracing_disabled(True)
            monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)
            monkeypatch.setenv("OPENAI_API_KEY", "not-a-key")
        exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__main__"})
    assert bool(server.requests) == ("from agents import" in code)

    async def live(store: Path) -> list[str]:
        async with mnemo.Memory(store, embedder=mnemo.HashEmbedder(), inspect=True) as mem:
            return [s.id for s in await mem.list_sessions()]

    for store in folder.glob("*.db"):
        assert anyio.run(live, store) == [], f"README.md:{line} leaves a session in {store.name}"


def test_the_readme_opens_with_a_short_runnable_quickstart() -> None:
    """The first code after the two commands is the quickstart, at most 15 lines, runnable."""
    text = README.read_text(encoding="utf-8")
    assert "scripts/demo" in text.split("## Quickstart")[0]
    assert "scripts/test" in text.split("## Quickstart")[0]
    line, quickstart = RUNNABLE[0]
    assert line > text[: text.index("## Quickstart")].count("\n")
    assert len(quickstart.strip().splitlines()) <= 15


def test_the_quickstart_prints_what_it_recalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The quickstart recalls the gunicorn fact it stored, one "score type text" per line."""
    run_block(*RUNNABLE[0], tmp_path, monkeypatch)
    lines = capsys.readouterr().out.splitlines()
    assert lines
    assert all(re.fullmatch(r"\d\.\d\d [a-z]+ .+", line) for line in lines), lines
    assert any(re.fullmatch(r"\d\.\d\d semantic .*gunicorn.*", line) for line in lines), lines
    assert (tmp_path / "memory.db").exists()


def test_the_quickstart_run_twice_recalls_each_sentence_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run again on the same store, the quickstart recalls what it recalled the first time,
    each sentence once (its fact and its instruction are stored once)."""
    run_block(*RUNNABLE[0], tmp_path, monkeypatch)
    first = capsys.readouterr().out.splitlines()
    run_block(*RUNNABLE[0], tmp_path, monkeypatch)
    second = capsys.readouterr().out.splitlines()
    said = [line.split(" ", 2)[2] for line in second]
    assert len(said) == len(set(said)), second
    assert {line.split(" ", 2)[2] for line in first} <= set(said)


@pytest.mark.slow  # whole programs on the default models, beside the unit tests
@pytest.mark.parametrize(("line", "code"), RUNNABLE[1:], ids=[f"line{n}" for n, _ in RUNNABLE[1:]])
def test_every_python_block_runs(
    line: int,
    code: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each runnable block runs to the end in a fresh directory and prints something."""
    run_block(line, code, tmp_path, monkeypatch)
    assert capsys.readouterr().out.strip()


PROVIDER_BLOCKS = blocks("python no-run")


@pytest.mark.parametrize(
    ("line", "code"), PROVIDER_BLOCKS, ids=[f"line{n}" for n, _ in PROVIDER_BLOCKS]
)
def test_provider_blocks_compile(line: int, code: str) -> None:
    """Blocks that need a provider are not run, but each is a valid script as written (no
    top-level await: a reader pastes it into a file and runs it)."""
    compile(code, f"README.md:{line}", "exec")
    assert "anyio.run(main)" in code


def test_there_are_blocks_to_run() -> None:
    """The extraction finds the README's blocks (a changed fence would silently skip them)."""
    assert len(RUNNABLE) >= 6
    assert len(PROVIDER_BLOCKS) >= 2


def raised_reasons() -> set[str]:
    """The reasons mnemo/ gives `SessionError`, `PipelineError` and `StorageError` as a literal
    first argument, and every reason of the session's state table (`machine.REFUSALS`)."""
    from mnemo.session.machine import REFUSALS

    found = {reason for refusals in REFUSALS.values() for reason in refusals.values()}
    package = Path(mnemo.__file__).parent
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("SessionError", "PipelineError", "StorageError")
                    and node.args and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)):
                found.add(node.args[0].value)
    return found


def test_every_reason_mnemo_raises_is_in_the_readme_errors_table() -> None:
    """The API contract: every reason a caller can see is listed in the README (its Errors
    section)."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`([a-z_]+)`", section))
    reasons = raised_reasons()
    assert {"not_collecting", "busy", "extraction_timeout"} <= reasons
    assert reasons - listed == set()
