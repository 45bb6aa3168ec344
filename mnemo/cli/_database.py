"""Which file a command works on, checked before `Memory` touches it.

`Memory(path)` creates a missing file and migrates any SQLite file it is given, which is right
for a library and wrong for a command line: `mnemo recall` on a mistyped path must not leave an
empty database behind, and `mnemo ingest` into someone else's SQLite file must not add mnemo's
tables to it. So every command checks the file first, reading it without writing:

- a read command needs an existing mnemo database;
- a write command (ingest, demo, mcp) may create a missing or empty file, and may use a SQLite
  file with no tables at all, but never a file that holds something else.

A mnemo database is a SQLite file whose `_sqlite_migrations` table has rows of the migration
set "mnemo" (`storage/sqlite/schema.py`).
"""

from __future__ import annotations

from pathlib import Path

from mnemo.errors import StorageError
from mnemo.storage.sqlite.database import inspect_file

SQLITE_HEADER = b"SQLite format 3\x00"


class CliError(Exception):
    """A problem the command reports as one line on stderr, exiting with status 2."""


def check_database(path: Path, *, must_exist: bool) -> None:
    """Checks that `path` is a mnemo database, or (when `must_exist` is False) a place where one
    may be created.

    Raises:
        CliError: a missing file (when `must_exist`), a directory, a file that is not SQLite,
            or a SQLite file that is not mnemo's.
    """
    if not path.exists():
        if must_exist:
            raise CliError(
                f"no database at {path} (create one with `mnemo ingest` or `mnemo demo`, "
                "or pass --store)"
            )
        return
    if path.is_dir():
        raise CliError(f"{path} is a directory, not a database file")
    try:
        with path.open("rb") as file:
            header = file.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not header:
        # SQLite treats an empty file as an empty database; only a writer may start one there.
        if must_exist:
            raise CliError(f"{path} is empty, not a mnemo database")
        return
    if header != SQLITE_HEADER:
        raise CliError(f"{path} is not a SQLite database")
    try:
        has_tables, is_mnemo = inspect_file(path)
    except StorageError as exc:
        raise CliError(f"{path} is not a readable SQLite database: {exc}") from exc
    if is_mnemo or (not must_exist and not has_tables):
        return
    raise CliError(f"{path} is a SQLite database but not a mnemo one (no mnemo migrations)")
