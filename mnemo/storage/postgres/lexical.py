"""The PostgreSQL side of the lexical index (`mnemo.storage.lexical.LexicalSource`): reads the
log and the nodes on a connection of its own (synchronous: it is used from the index's worker
threads), outside the `Memory`'s pool."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg

from mnemo.storage.lexical import Row
from mnemo.storage.lexical.index import changed_rows
from mnemo.storage.postgres.connection import HNSW_EF_SEARCH, conninfo, storage_error


def default_folder() -> Path:
    """Where PostgreSQL stores' indexes live on this host: `$MNEMO_LEXICAL_DIR`, else the
    user's cache folder. Each database gets a folder of its own inside (`place`)."""
    chosen = os.environ.get("MNEMO_LEXICAL_DIR")
    if chosen:
        return Path(chosen)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "mnemo" / "lexical"


class PgLexicalSource:
    """`LexicalSource` over a PostgreSQL database."""

    def __init__(self, url: str, busy_timeout: float) -> None:
        self._conninfo = conninfo(
            url, busy_timeout=busy_timeout, statement_timeout=None, ef_search=HNSW_EF_SEARCH
        )
        self._conn: psycopg.Connection[Any] | None = None

    def _rows(self, statement: str, params: tuple[object, ...] = ()) -> list[Any]:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self._conninfo, autocommit=True)
            return self._conn.execute(statement, params).fetchall()
        except psycopg.Error as exc:
            if self._conn is not None and self._conn.broken:
                self._conn = None
            raise storage_error(exc) from exc

    def place(self) -> str:
        # The cluster's identifier and the database's oid: a database dropped and made again
        # under the same name (or a copy elsewhere) gets a folder of its own.
        (system, oid), = self._rows(
            "SELECT (SELECT system_identifier FROM pg_control_system()),"
            " (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return f"pg-{system}-{oid}"

    def epoch(self) -> str:
        return str(self._rows("SELECT epoch FROM lexical_epoch")[0][0])

    def state(self, repo: str) -> tuple[int, int]:
        rows = self._rows("SELECT seq, horizon FROM lexical_repos WHERE repo = %s", (repo,))
        return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)

    def changes(self, repo: str, after: int, upto: int) -> tuple[list[Row], list[int]]:
        return changed_rows(self._rows(
            "SELECT l.node, n.id, n.type, n.text FROM"
            " (SELECT DISTINCT node FROM lexical_log WHERE repo = %s AND seq > %s AND seq <= %s) l"
            " LEFT JOIN nodes n ON n.rowid = l.node AND n.repo = %s",
            (repo, after, upto, repo),
        ))

    def nodes(self, repo: str, after_rowid: int, limit: int) -> list[Row]:
        rows = self._rows(
            "SELECT rowid, id, type, text FROM nodes WHERE repo = %s AND rowid > %s"
            " ORDER BY rowid LIMIT %s",
            (repo, after_rowid, limit),
        )
        return changed_rows(rows)[0]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
