"""What a command prints on stderr besides its own lines: mnemo's warnings and every error,
never the PostgreSQL driver's notes about connections it drops at cancellation."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from mnemo.cli._common import command_logging

ROOT = Path(__file__).resolve().parents[2]
NOISE = ("query cancellation interrupted", "discarding closed connection")


def test_the_drivers_warnings_are_left_out_and_errors_shown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Within a command: psycopg's and its pool's warnings are not printed, their errors and
    mnemo's warnings are, one line each; --verbose shows the driver's warnings and mnemo's
    info; the loggers are put back after."""
    driver, pool, mine = (logging.getLogger(n) for n in ("psycopg", "psycopg.pool", "mnemo"))
    levels = (driver.level, pool.level, logging.getLogger().level)
    with command_logging():
        driver.warning("query cancellation interrupted (CancelledError): closing connection")
        pool.warning("discarding closed connection: <conn>")
        pool.error("connection failed: server closed the connection")
        mine.warning("the lexical index is rebuilt")
        mine.info("an info line")
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "error: psycopg.pool: connection failed: server closed the connection",
        "warning: mnemo: the lexical index is rebuilt",
    ]
    with command_logging(verbose=True):
        pool.warning("discarding closed connection: <conn>")
        mine.info("an info line")
    assert capsys.readouterr().err.splitlines() == [
        "warning: psycopg.pool: discarding closed connection: <conn>",
        "info: mnemo: an info line",
    ]
    assert (driver.level, pool.level, logging.getLogger().level) == levels


@pytest.mark.slow
def test_commands_on_postgresql_print_no_driver_noise(pg_url: str, tmp_path: Path) -> None:
    """An ingest and the reads after it on a PostgreSQL store, each its own process, print
    nothing on stderr (with --json, no progress either). Before, each printed the driver's
    "query cancellation interrupted" and "discarding closed connection" warnings."""
    source = tmp_path / "week.json"
    source.write_text(json.dumps({"repo": "ops", "sessions": [{
        "goal": "Deploy", "steps": [{"observation": "gunicorn listens on 8001.",
                                     "action": "Bind it to 8000."}],
    }]}))
    commands = [
        ["ingest", str(source)], ["ingest", str(source)], ["sessions"], ["repos"],
        ["recall", "ops", "gunicorn"], ["history", "ops"],
    ]
    for command in commands:
        done = subprocess.run(
            [sys.executable, "-m", "mnemo", *command, "--db", pg_url, "--json"],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        )
        assert done.returncode == 0, done.stderr
        assert not any(noise in done.stderr for noise in NOISE), done.stderr
        assert done.stderr == "", done.stderr
