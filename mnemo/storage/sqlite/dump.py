"""The SQLite side of `mnemo migrate` (`storage.transfer`): tables read in rowid (or key)
order and written in neutral values; copied rows reach FTS5 through the insert triggers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import anyio
import numpy as np
from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.errors import StorageError
from mnemo.ports import vector_from_blob, vector_to_blob
from mnemo.storage.sql import marks
from mnemo.storage.sqlite.database import Database, inspect_file
from mnemo.storage.sqlite.rows import half_blob, pack_text, unpack_text, vector_of_half
from mnemo.storage.transfer import Kind, Row, SqlDump, Table, quoted

# Declared WITHOUT ROWID in tables.py: read in key order.
_WITHOUT_ROWID = {"compactions", "pins", "ingests", "task_results", "node_scopes"}
# JSON columns kept packed (`rows.pack_text`).
_PACKED = {("commits", "nodes"), ("commits", "links"), ("applied_changesets", "receipt")}
# Vectors, keyed by node rowid, read as the neutral (node_id, repo, vec).
_VECTORS_READ = (
    "SELECT v.node, n.id, n.repo, v.vec FROM vectors v JOIN nodes n ON n.rowid = v.node"
)
_VECTORS_WRITE = "INSERT OR IGNORE INTO vectors(node, vec) SELECT rowid, ? FROM nodes WHERE id = ?"
# Links by their ends' ids (an end that is no node makes a NULL, which fails: NOT NULL).
_LINKS_WRITE = (
    "INSERT INTO links(src, dst, type, refs) VALUES ((SELECT rowid FROM nodes WHERE id = ?),"
    " (SELECT rowid FROM nodes WHERE id = ?), ?, ?) ON CONFLICT DO NOTHING"
)
# Links, whose ends are rowids, read as the neutral (repo, src, dst, type, refs) of ids.
_LINKS_READ = (
    "SELECT l.src, l.dst, l.type, a.repo, a.id, b.id, l.type, l.refs FROM links l"
    " JOIN nodes a ON a.rowid = l.src JOIN nodes b ON b.rowid = l.dst"
)


def _store(kind: Kind, value: object, half: bool = False, packed: bool = False) -> object:
    if value is None:
        return None
    if kind is Kind.TIME:
        assert isinstance(value, datetime)
        return value.astimezone(UTC).isoformat(timespec="microseconds")
    if kind is Kind.JSON:
        text = json.dumps(value, sort_keys=True)
        return pack_text(text) if packed else text
    if kind is Kind.BOOL:
        return int(bool(value))
    if kind is Kind.VECTOR:
        vector = np.asarray(value, dtype=np.float32)
        return half_blob(vector) if half else vector_to_blob(vector)
    return value


class SqliteDump(SqlDump):
    _driver: Database

    def _load(self, table: Table, kind: Kind, value: object) -> object:
        if kind is Kind.JSON:
            assert isinstance(value, str | bytes)
            return json.loads(unpack_text(value))
        if kind is Kind.VECTOR:
            assert isinstance(value, bytes)
            return vector_of_half(value) if table.name == "vectors" else vector_from_blob(value)
        return super()._load(table, kind, value)

    def _source(self, table: Table) -> tuple[str, tuple[str, ...]]:
        if table.name == "vectors":
            return _VECTORS_READ, ("v.node",)
        if table.name == "links":
            return _LINKS_READ, ("l.src", "l.dst", "l.type")
        if table.name in _WITHOUT_ROWID:
            return super()._source(table)
        return f'SELECT rowid, {quoted(table.names)} FROM "{table.name}"', ("rowid",)

    async def write(self, table: Table, rows: Sequence[Row]) -> int:
        statement = (f'INSERT OR IGNORE INTO "{table.name}" ({quoted(table.names)})'
                     f" VALUES ({marks(len(table.names))})")
        half = table.name == "vectors"
        packed = [(table.name, name) in _PACKED for name in table.names]
        stored = [tuple(_store(kind, value, half, pack)
                        for kind, value, pack in zip(table.kinds, row, packed, strict=True))
                  for row in rows]
        if table.name == "vectors":
            statement = _VECTORS_WRITE
            node_id, vec = table.names.index("node_id"), table.names.index("vec")
            stored = [(row[vec], row[node_id]) for row in stored]
        if table.name == "links":
            statement = _LINKS_WRITE
            ends = [table.names.index(name) for name in ("src", "dst", "type", "refs")]
            stored = [tuple(row[i] for i in ends) for row in stored]

        def work(db: SqliteUtilsDatabase) -> int:
            with db.atomic():
                # rowcount counts the rows inserted, not those ignored or the FTS triggers'.
                return db.conn.executemany(statement, stored).rowcount

        return await self._driver.run(work)


@asynccontextmanager
async def open_sqlite_dump(path: Path, *, must_exist: bool) -> AsyncIterator[SqliteDump]:
    """The dump of the mnemo database at `path`, opened and migrated for the block; raises
    `StorageError("unavailable")` when `must_exist` and there is none."""
    if must_exist and not await anyio.to_thread.run_sync(
            lambda: path.is_file() and inspect_file(path)[1]):
        raise StorageError("unavailable", f"no mnemo database at {path}")
    database = Database(path)
    await database.open()
    try:
        yield SqliteDump(database)
    finally:
        await database.close()
