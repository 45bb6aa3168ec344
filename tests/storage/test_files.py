"""`store_file`: what a path holds, told apart without writing to it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from mnemo.errors import StorageError
from mnemo.memory import Memory
from mnemo.storage.files import StoreFile, store_file


def _database(path: Path, *statements: str) -> Path:
    conn = sqlite3.connect(path)
    with conn:
        for statement in statements:
            conn.execute(statement)
    conn.close()
    return path


@pytest.fixture
async def mnemo_db(tmp_path: Path) -> Path:
    path = tmp_path / "memory.db"
    async with Memory(path):
        pass
    return path


def test_each_kind_of_file_is_told_apart_and_left_unchanged(
    tmp_path: Path, mnemo_db: Path
) -> None:
    """A missing path, a directory, an empty file, a text file, a database with no tables,
    one with foreign tables and a mnemo store each get their kind, and no file's bytes
    change."""
    (tmp_path / "empty.db").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not a database at all")
    cases = {
        tmp_path / "missing.db": StoreFile.MISSING,
        tmp_path: StoreFile.DIRECTORY,
        tmp_path / "empty.db": StoreFile.EMPTY,
        tmp_path / "notes.txt": StoreFile.NOT_A_DATABASE,
        _database(tmp_path / "blank.db", "PRAGMA user_version = 1"): StoreFile.NO_TABLES,
        _database(tmp_path / "app.db", "CREATE TABLE things (x)"): StoreFile.FOREIGN,
        mnemo_db: StoreFile.MNEMO,
    }
    before = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert {path: store_file(path) for path in cases} == cases
    assert {p: p.read_bytes() for p in before} == before
    assert not (tmp_path / "missing.db").exists()


def test_a_file_with_a_database_header_but_no_database_is_corrupt(tmp_path: Path) -> None:
    """A file that starts like a SQLite database but is none raises StorageError("corrupt")."""
    path = tmp_path / "cut.db"
    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    with pytest.raises(StorageError) as caught:
        store_file(path)
    assert caught.value.reason == "corrupt"
