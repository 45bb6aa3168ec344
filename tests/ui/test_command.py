"""`mnemo ui` from the command line: it serves on 127.0.0.1 by default, refuses a missing
database, a weak token and a malformed allowed host, and warns about a bind beyond the
loopback."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import uvicorn
from typer.testing import CliRunner

from mnemo.cli import app
from mnemo.ui.guard import Redaction
from tests.ui.conftest import Sample

TOKEN = "command-token-0123456789"


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


def _corrupt(db: Path) -> None:
    """Overwrites the root page of the repos table, which opening a memory reads (the header
    and migrations `mnemo` checks first stay readable)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        ((root,),) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'repos'")
        ((size,),) = conn.execute("PRAGMA page_size")
    with db.open("r+b") as file:
        file.seek((root - 1) * size)
        file.write(b"\xff" * size)


@pytest.mark.parametrize("kind", ["corrupt", "foreign", "text", "missing"])
def test_ui_refuses_a_store_it_cannot_open_in_one_line(
    sample: Sample, tmp_path: Path, kind: str
) -> None:
    """A corrupt store, a SQLite file that is no mnemo store, a text file or none: one error
    line and status 2, as `mnemo repos` answers, before anything is served (not the web
    server's traceback and status 3)."""
    db = sample.db if kind == "corrupt" else tmp_path / "other.db"
    if kind == "corrupt":
        _corrupt(db)
    elif kind == "foreign":
        with contextlib.closing(sqlite3.connect(db)) as conn:
            conn.execute("CREATE TABLE t (x)")
    elif kind == "text":
        db.write_text("not a database\n")
    served = CliRunner().invoke(app, ["ui", "--db", str(db), "--port", str(_free_port())])
    listed = CliRunner().invoke(app, ["repos", "--db", str(db)])
    assert (served.exit_code, listed.exit_code) == (2, 2), served.output
    assert served.output == listed.output
    assert served.output.startswith("error: ")
    assert served.output.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--token", "short"], {}, "16 to 512 characters"),
        ([], {"MNEMO_UI_TOKEN": "has a space in it, so no"}, "printable ASCII"),
        (["--allow-host", "http://evil.example.com"], {}, "not a host name"),
        (["--allow-host", "*"], {}, "needs an access token"),
    ],
)
def test_ui_refuses_weak_tokens_and_malformed_hosts(
    sample: Sample, args: list[str], env: dict[str, str], says: str
) -> None:
    """A short or spaced token (flag or MNEMO_UI_TOKEN), a host with a scheme, or '*' with no
    token is a one-line error with status 2, before anything is served."""
    result = CliRunner().invoke(app, ["ui", "--db", str(sample.db), *args], env=env)
    assert result.exit_code == 2, result.output
    assert says in result.output


@pytest.fixture
def no_serving(monkeypatch: pytest.MonkeyPatch) -> list[uvicorn.Server]:
    """uvicorn's serve replaced by one that records the server and returns at once."""
    served: list[uvicorn.Server] = []

    async def serve(self: uvicorn.Server, sockets: object = None) -> None:
        served.append(self)

    monkeypatch.setattr(uvicorn.Server, "serve", serve)
    return served


@pytest.mark.parametrize(
    ("args", "env", "warned"),
    [
        (["--host", "0.0.0.0"], {}, ["every interface", "No access token", "--allow-host"]),
        (["--host", "0.0.0.0"], {"MNEMO_UI_TOKEN": TOKEN}, ["every interface"]),
        ([], {}, []),
        (["--host", "127.0.0.2"], {}, []),
    ],
)
def test_ui_warns_about_a_bind_beyond_the_loopback(
    sample: Sample, no_serving: list[uvicorn.Server], args: list[str], env: dict[str, str],
    warned: list[str],
) -> None:
    """Binding every interface warns that the memory is exposed (and, without a token, that
    anyone sees it); a loopback bind warns of nothing. The access log hides tokens."""
    result = CliRunner().invoke(app, ["ui", "--db", str(sample.db), *args], env=env)
    assert result.exit_code == 0, result.output
    assert len(no_serving) == 1
    for words in warned:
        assert words in result.output
    assert ("mnemo ui listens on" in result.output) == bool(warned)
    assert ("No access token" in result.output) == ("No access token" in warned)
    filters = logging.getLogger("uvicorn.access").filters
    assert sum(isinstance(f, Redaction) for f in filters) == 1


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
