"""The SQLite `LexicalSource`: reads the log and nodes on a read-only connection of its own,
never waiting for nor holding up the writing one (so not for `:memory:`, which has no second)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from mnemo.storage.lexical.source import LexicalSource
from mnemo.storage.sqlite.database import storage_error


class SqliteLexicalSource(LexicalSource):
    def __init__(self, path: str | Path, busy_timeout: float) -> None:
        self._path = str(path)
        self._busy_ms = int(busy_timeout * 1000)
        self._conn: sqlite3.Connection | None = None

    def _rows(self, statement: str, params: tuple[object, ...] = ()) -> list[object]:
        try:
            if self._conn is None:
                uri = Path(self._path).resolve().as_uri() + "?mode=ro"
                conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
                conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
                self._conn = conn
            return self._conn.execute(statement, params).fetchall()
        except sqlite3.Error as exc:
            raise storage_error(exc) from exc
