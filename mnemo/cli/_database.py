"""Which file a command works on, checked before `Memory` touches it: a read needs an existing
mnemo database; a write may create a missing or empty file or fill a table-less database, never
another kind of file."""

from __future__ import annotations

from pathlib import Path

from mnemo.errors import StorageError
from mnemo.storage.files import StoreFile, store_file


class CliError(Exception):
    """A problem the command reports as one line on stderr, exiting with status 2."""


def check_database(path: Path, *, must_exist: bool) -> None:
    """Checks that `path` is a mnemo database, or (unless `must_exist`) where one may be made."""
    try:
        found = store_file(path)
    except StorageError as exc:
        if isinstance(exc.__cause__, OSError):
            raise CliError(f"cannot read {path}: {exc.__cause__.strerror or exc}") from exc
        if exc.reason == "corrupt":
            raise CliError(f"{path} is not a readable SQLite database: {exc}") from exc
        raise CliError(f"cannot open {path}: {exc}") from exc
    if found is StoreFile.MISSING and must_exist:
        raise CliError(
            f"no database at {path} (create one with `mnemo ingest` or `mnemo demo`, "
            "or pass --store)")
    if found is StoreFile.DIRECTORY:
        raise CliError(f"{path} is a directory, not a database file")
    if found is StoreFile.EMPTY and must_exist:
        raise CliError(f"{path} is empty, not a mnemo database")
    if found is StoreFile.NOT_A_DATABASE:
        raise CliError(f"{path} is not a SQLite database")
    if found is StoreFile.FOREIGN or (found is StoreFile.NO_TABLES and must_exist):
        raise CliError(f"{path} is a SQLite database but not a mnemo one (no mnemo migrations)")
