"""What a store's file holds, found without writing to it (the CLI asks before `Memory(path)`
would create or migrate it)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from mnemo.errors import StorageError
from mnemo.storage.sqlite.database import SQLITE_HEADER, inspect_file


class StoreFile(StrEnum):
    MISSING = "missing"  # nothing there
    DIRECTORY = "directory"
    EMPTY = "empty"  # a file of no bytes: SQLite takes it for an empty database
    NOT_A_DATABASE = "not_a_database"  # a file in another format
    NO_TABLES = "no_tables"  # a database with no tables at all
    FOREIGN = "foreign"  # a database with tables, but no mnemo migrations
    MNEMO = "mnemo"


def store_file(path: Path) -> StoreFile:
    """What the file at `path` holds, read without changing it; raises `StorageError`
    ("unavailable", or "corrupt" for a SQLite header it cannot read)."""
    if not path.exists():
        return StoreFile.MISSING
    if path.is_dir():
        return StoreFile.DIRECTORY
    try:
        with path.open("rb") as file:
            header = file.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise StorageError("unavailable", exc.strerror or str(exc)) from exc
    if not header:
        return StoreFile.EMPTY
    if header != SQLITE_HEADER:
        return StoreFile.NOT_A_DATABASE
    has_tables, is_mnemo = inspect_file(path)
    if is_mnemo:
        return StoreFile.MNEMO
    return StoreFile.FOREIGN if has_tables else StoreFile.NO_TABLES
