"""`Memory(path)` picks its backend from the path; PostgreSQL's driver is an extra that
`import mnemo` and SQLite stores never need."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

WITHOUT_DRIVER = """
import sys
sys.modules["psycopg"] = None  # as if pymnemo[postgres] were not installed
import anyio
import mnemo
assert "psycopg_pool" not in sys.modules

async def main() -> None:
    async with mnemo.Memory(":memory:") as mem:
        await mem.open_repo("r")
    try:
        mnemo.Memory("postgresql://agent@/mnemo")
    except mnemo.StorageError as exc:
        print(exc.reason, "|", exc)

anyio.run(main)
"""


@pytest.mark.slow
def test_without_the_driver_sqlite_works_and_a_url_says_what_to_install() -> None:
    """Without psycopg, `import mnemo` and a SQLite store work; a PostgreSQL URL is
    StorageError("unavailable") naming the extra to install."""
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_DRIVER], cwd=ROOT, capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    reason, message = done.stdout.strip().split(" | ")
    assert reason == "unavailable"
    assert "pymnemo[postgres]" in message


@pytest.mark.slow
def test_import_mnemo_loads_no_postgres_module() -> None:
    """`import mnemo` imports neither the driver nor mnemo's PostgreSQL backend."""
    code = (
        "import sys, mnemo; print(sorted(m for m in sys.modules"
        " if m.startswith(('psycopg', 'mnemo.storage.postgres'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
