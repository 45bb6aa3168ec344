"""README.md's shell commands work as written: the ```sh blocks run in order, in a fresh
folder, as a reader would after cloning (the ```sh ids block with ids from the listings in
place of its capitals), and every ```sh no-run block (a provider, a server) is valid shell
whose `mnemo` commands exist."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import mnemo
from tests.test_readme import blocks

ROOT = Path(__file__).resolve().parents[1]
RUN, IDS, NO_RUN = blocks("sh"), blocks("sh ids"), blocks("sh no-run")


def commands(code: str) -> list[str]:
    """The block's commands, a continued line joined, comments and blank lines left out."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def bash(script: str, folder: Path) -> str:
    """Runs `script` with bash -e in `folder`; its stdout (stderr in the failure's message)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEMO_")}
    done = subprocess.run(
        ["bash", "-e", "-c", script], cwd=folder, env=env, capture_output=True, text=True,
        timeout=600, check=False,
    )
    assert done.returncode == 0, f"{script}\n--- stderr:\n{done.stderr}"
    return done.stdout


def test_there_are_shell_blocks() -> None:
    """The README has a setup block, the command line's block, the ids block and provider
    blocks (a changed fence would silently skip them)."""
    assert len(RUN) >= 2
    assert len(IDS) == 1
    assert len(NO_RUN) >= 5
    assert commands(RUN[0][1])[0] == "scripts/demo"


@pytest.mark.slow
def test_the_shell_blocks_name_commands_that_exist() -> None:
    """Every block is valid shell, and every `mnemo ...` line in it names a command that
    `mnemo ... --help` knows."""
    from typer.testing import CliRunner

    from mnemo.cli import app

    for line, code in [*RUN, *IDS, *NO_RUN]:
        checked = subprocess.run(["bash", "-n"], input=code, text=True, check=False)
        assert checked.returncode == 0, f"README.md:{line}"
        for command in commands(code):
            words = shlex.split(command, comments=True)
            if not words or words[0] != "mnemo":
                continue
            path = words[1:3] if words[1] == "session" else words[1:2]
            result = CliRunner().invoke(app, [*path, "--help"])
            assert result.exit_code == 0, f"README.md:{line}: {command}"


async def _leave_a_session(store: Path) -> str:
    async with mnemo.Memory(store) as mem:
        sid = await mem.start_session("Rotate the TLS certificate", repo="assistant")
        await mem.append(sid, "certbot says the certificate expires in 3 days.", "Renew it.")
        return sid


@pytest.mark.slow
def test_the_shell_blocks_run_as_written(tmp_path: Path) -> None:
    """In a folder holding what a clone holds (`.venv`, `mnemo/`; `scripts/demo` runs its
    `scripts/demo.py` there, the install being the test's own), the setup block and the
    command line's block run in order and do what their comments say; the ids block then runs
    with a recalled node's, a message's, a commit's and a live session's short ids from the
    listings."""
    for name in (".venv", "mnemo"):
        (tmp_path / name).symlink_to(ROOT / name)
    setup = "\n".join(
        f"{shlex.quote(sys.executable)} {ROOT / 'scripts' / 'demo.py'}"
        if command == "scripts/demo" else command
        for command in commands(RUN[0][1])
    )
    shown = bash(setup, tmp_path)
    assert "gunicorn" in shown
    store = tmp_path / "demo.db"
    assert store.exists()
    rest = [". .venv/bin/activate", *(c for _, code in RUN[1:] for c in commands(code))]
    printed = bash("\n".join(rest), tmp_path)
    assert "demo/1" in printed  # the demo's sessions are threads: search finds them
    assert (tmp_path / "assistant.graphml").exists()

    activated = f". .venv/bin/activate\nexport MNEMO_STORE={shlex.quote(str(store))}\n"
    hit = json.loads(bash(activated + 'mnemo search "pgbouncer" --json --limit 1', tmp_path))
    commit = json.loads(bash(activated + "mnemo history assistant --json --limit 1", tmp_path))
    recalled = json.loads(bash(activated + 'mnemo recall assistant "gunicorn" --json -k 1',
                               tmp_path))
    head, _, index = recalled["memories"][0]["node"]["id"].rpartition("_")[2].partition(":")
    session = anyio.run(_leave_a_session, store)
    ids = {
        "MESSAGE_ID": hit[0]["message_id"].removeprefix("msg_")[:8],
        "COMMIT_ID": commit[0]["id"].removeprefix("changeset_")[:8],
        "SESSION_ID": session.removeprefix("session_")[:8],
        "NODE_ID": head[:8] + (f":{index}" if index else ""),
    }
    script = commands(IDS[0][1])
    for name, value in ids.items():
        script = [command.replace(name, value) for command in script]
    bash(activated + "\n".join(script), tmp_path)
    listed = json.loads(bash(activated + "mnemo sessions --all --json", tmp_path))
    assert listed[0]["state"] == "idle"
