"""The SQLite side of the lexical index (`mnemo.storage.lexical.LexicalSource`): reads the
log and the nodes on a read-only connection of its own, so that bringing an index up in a
background thread never waits for (nor holds up) the store's one writing connection."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from mnemo.storage.lexical import Row
from mnemo.storage.lexical.index import changed_rows
from mnemo.storage.sqlite.database import storage_error


class SqliteLexicalSource:
    """`LexicalSource` over a SQLite file (not `:memory:`, which has no second connection)."""

    def __init__(self, path: str | Path, busy_timeout: float) -> None:
        self._path = str(path)
        self._busy_ms = int(busy_timeout * 1000)
        self._conn: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            uri = Path(self._path).resolve().as_uri() + "?mode=ro"
            conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            self._conn = conn
        return self._conn

    def _rows(self, statement: str, params: tuple[object, ...]) -> list[Any]:
        try:
            return self._db().execute(statement, params).fetchall()
        except sqlite3.Error as exc:
            raise storage_error(exc) from exc

    def place(self) -> str:
        return ""  # the folder is the file's own

    def epoch(self) -> str:
        return str(self._rows("SELECT epoch FROM lexical_epoch", ())[0][0])

    def state(self, repo: str) -> tuple[int, int]:
        rows = self._rows("SELECT seq, horizon FROM lexical_repos WHERE repo = ?", (repo,))
        return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)

    def changes(self, repo: str, after: int, upto: int) -> tuple[list[Row], list[int]]:
        return changed_rows(self._rows(
            "SELECT l.node, n.id, n.type, n.text FROM"
            " (SELECT DISTINCT node FROM lexical_log WHERE repo = ? AND seq > ? AND seq <= ?) l"
            " LEFT JOIN nodes n ON n.rowid = l.node AND n.repo = ?",
            (repo, after, upto, repo),
        ))

    def nodes(self, repo: str, after_rowid: int, limit: int) -> list[Row]:
        rows = self._rows(
            "SELECT rowid, id, type, text FROM nodes WHERE repo = ? AND rowid > ?"
            " ORDER BY rowid LIMIT ?",
            (repo, after_rowid, limit),
        )
        return changed_rows(rows)[0]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
