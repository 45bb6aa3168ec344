"""`mnemo ui` from the command line: it serves on 127.0.0.1 by default and refuses a missing
database."""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from mnemo.cli import app
from tests.ui.conftest import Sample


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_ui_refuses_a_missing_database(tmp_path: Path) -> None:
    """A mistyped --db is a one-line error with status 2, and no file is created."""
    missing = tmp_path / "nope.db"
    result = CliRunner().invoke(app, ["ui", "--db", str(missing)])
    assert result.exit_code == 2
    assert "no database at" in result.output
    assert not missing.exists()


@pytest.mark.slow
def test_ui_serves_on_localhost_by_default(sample: Sample) -> None:
    """`mnemo ui --db X --port P` listens on 127.0.0.1:P and serves the pages."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    process = subprocess.Popen(
        [sys.executable, "-m", "mnemo", "ui", "--db", str(sample.db), "--port", str(port)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.put(line)
        lines.put("")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        seen = []
        while True:
            line = lines.get(timeout=60)
            seen.append(line)
            assert line, f"mnemo ui exited: {''.join(seen)}"
            if "Uvicorn running on" in line:
                break
        assert f"http://127.0.0.1:{port}" in line
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=30)
        assert page.status_code == 200
        assert "read-only" in page.text
    finally:
        process.terminate()
        process.wait(30)
        reader.join(30)  # the pipe is at its end once the process is gone
        assert process.stderr is not None
        process.stderr.close()
