"""The PostgreSQL `LexicalSource`: reads the log and nodes on a synchronous connection of its
own (used from the index's threads), outside the Memory's pool."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg

from mnemo.storage.lexical.source import LexicalSource
from mnemo.storage.postgres.connection import conninfo, placeholders, storage_error
from mnemo.storage.row import Column


def default_folder() -> Path:
    """`$MNEMO_LEXICAL_DIR`, else the user's cache folder (a folder per database inside)."""
    chosen = os.environ.get("MNEMO_LEXICAL_DIR")
    if chosen:
        return Path(chosen)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "mnemo" / "lexical"


# The name of a database's folder under `default_folder()`: "pg-<the cluster's identifier>-<the
# database's oid>", so a recreated database gets its own folder.
PLACE = (
    "SELECT 'pg-' || (SELECT system_identifier FROM pg_control_system()) || '-'"
    " || (SELECT oid FROM pg_database WHERE datname = current_database())"
)


class PgLexicalSource(LexicalSource):
    def __init__(self, url: str, busy_timeout: float) -> None:
        self._conninfo = conninfo(url, busy_timeout=busy_timeout)
        self._conn: psycopg.Connection[Any] | None = None

    def _rows(self, statement: str, params: tuple[object, ...] = ()) -> list[Column]:
        """The statement's rows, run once more on a new connection if the old one was gone."""
        retry = self._conn is not None and not self._conn.closed
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(self._conninfo, autocommit=True)
                return self._conn.execute(placeholders(statement), params).fetchall()
            except psycopg.Error as exc:
                if not (retry and self._conn is not None and self._conn.broken):
                    raise storage_error(exc) from exc
                retry = False

    def place(self) -> str:
        (place,), = self._rows(PLACE)
        return str(place)
