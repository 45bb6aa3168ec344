"""A SQLite store in a folder its reader cannot write (mnemo writes the -wal and -shm files
beside the store even to read it): the CLI says "read-only" in one line, not "corrupt".

A folder is SQLite's alone: PostgreSQL has no such case."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mnemo.cli import app

SESSION = ('{"repo": "r", "sessions": [{"goal": "g", "steps": [{"observation": '
           '"the build is red", "action": "rerun it"}]}]}')


@pytest.mark.slow
def test_a_store_in_a_read_only_folder_is_said_read_only() -> None:
    # Under /tmp, with a mode of its own: the reader below may be another user.
    folder = Path(tempfile.mkdtemp(prefix="mnemo-ro-"))
    try:
        db = folder / "m.db"
        (folder / "week.json").write_text(SESSION)
        filled = CliRunner().invoke(app, ["ingest", str(folder / "week.json"), "--db", str(db)])
        assert filled.exit_code == 0, filled.output
        folder.chmod(0o555)
        command = [sys.executable, "-m", "mnemo", "recall", "r", "build", "--db", str(db)]
        if os.geteuid() == 0:  # root writes into any folder: the reader is nobody
            command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
        read = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=folder,
                              env={**os.environ, "HOME": str(folder)}, check=False)
        assert read.returncode == 2, read.stderr
        assert read.stderr.count("\n") == 1, read.stderr
        assert read.stderr.startswith("error: ")
        assert "read-only" in read.stderr
        assert "corrupt" not in read.stderr
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder)
