"""Moving a memory from one store to another (`mnemo migrate`), backend-neutral: each
backend's `SqlDump` reads and writes `TABLES` as neutral values, skipping rows the target holds
(rerunnable), rowids kept. Work holders, leases, a re-embedding under way and search indexes
are not copied."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from pathlib import Path

import numpy as np

from mnemo.errors import ConflictError, StorageError
from mnemo.storage.ports import is_postgres
from mnemo.storage.sql import SqlStore, marks, moment, utc
from mnemo.storage.tables import MAINTENANCE, ddl

# A neutral row: one value per column of its table, in the table's column order.
Row = tuple[object, ...]


class Kind(StrEnum):
    """What a column holds, and so how each backend stores it."""

    TEXT = "text"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"  # SQLite 0/1, PostgreSQL boolean
    TIME = "time"  # SQLite ISO-8601 text, PostgreSQL timestamptz
    JSON = "json"  # SQLite text, PostgreSQL jsonb
    VECTOR = "vector"  # SQLite float32 blob, PostgreSQL pgvector's vector
    BYTES = "bytes"


@dataclass(frozen=True, slots=True)
class Table:
    """One table to copy: its columns' names and kinds, and its primary key; a `rowid` table
    has its ordering integer as first column."""

    name: str
    names: tuple[str, ...]
    kinds: tuple[Kind, ...]
    key: tuple[str, ...]

    @property
    def has_rowid(self) -> bool:
        return self.names[0] == "rowid"


# What a PostgreSQL column type holds; `tsvector` (search) is not copied.
_KINDS = {"text": Kind.TEXT, "jsonb": Kind.JSON, "timestamptz": Kind.TIME, "integer": Kind.INT,
          "bigint": Kind.INT, "boolean": Kind.BOOL, "vector": Kind.VECTOR, "double": Kind.FLOAT,
          "bytea": Kind.BYTES}
_NOT_COPIED = {"holders", "ops", "step_claims", "reembeds", "staged_vectors", "lexical_repos",
               "lexical_log", "lexical_epoch", "holder", "lease_until"}


def _tables() -> tuple[Table, ...]:
    """`tables.TABLES` and the later columns (`MAINTENANCE`) as PostgreSQL's columns name them,
    in creation order (a row's parents are copied before it: both backends check foreign keys)."""
    tables = []
    added = re.findall(r"ALTER TABLE (\w+) ADD COLUMN (\w+) (\w+)", ddl(True, MAINTENANCE))
    for name, body in re.findall(r"CREATE TABLE (\w+) \(\n(.*?)\n\)", ddl(postgres=True), re.S):
        columns: list[tuple[str, Kind]] = []
        key: tuple[str, ...] = ()
        for column, kind, *rest in (line.rstrip(",").split() for line in body.splitlines()):
            if column == "PRIMARY":  # PRIMARY KEY (a, b)
                key = tuple(re.findall(r"\w+", " ".join(rest)))
            elif kind.lower() in _KINDS and column not in _NOT_COPIED:
                columns.append((column, _KINDS[kind.lower()]))
                if "PRIMARY" in rest:
                    key = (column,)
        columns += [(column, _KINDS[kind.lower()]) for table, column, kind in added
                    if table == name]
        if name not in _NOT_COPIED:
            names, kinds = zip(*columns, strict=True)
            tables.append(Table(name, names, kinds, key))
    return tuple(tables)


TABLES = _tables()
NODES = next(t for t in TABLES if t.name == "nodes")
_NODE_TEXT = NODES.names.index("text")


class SqlDump(SqlStore):
    """One open store, read and written table by table in neutral values."""

    # Inserts `rows` in one transaction, skipping keys present; how many were inserted.
    write: Callable[[Table, Sequence[Row]], Awaitable[int]]

    def _load(self, table: Table, kind: Kind, value: object) -> object:
        """A stored value (not NULL) as a neutral one (a backend converts first the kinds it
        stores its own way)."""
        if kind is Kind.FLOAT:
            return float(value)  # type: ignore[arg-type]
        if kind is Kind.TIME:  # SQLite's ISO text, PostgreSQL's datetime: in UTC
            return utc(moment(value))  # type: ignore[arg-type]
        return bool(value) if kind is Kind.BOOL else value

    async def checksum(self) -> str:
        """sha256 over every node's id and text, in the order of the id's UTF-8 bytes."""
        return await self._driver.together(lambda sql: _checksum(sql.stream(
            f"SELECT id, text FROM nodes ORDER BY id{self.BYTE_ORDER}")))

    async def finish(self) -> None:
        """Brings what the copied rows need up to date (PostgreSQL's identity sequences and
        vector indexes; SQLite's FTS5 triggers indexed each row as it came)."""

    def _source(self, table: Table) -> tuple[str, tuple[str, ...]]:
        """`table`'s rows led by their ordering columns (its rowid, else its key), and those."""
        order = ("rowid",) if table.has_rowid else table.key
        return f'SELECT {quoted(order)}, {quoted(table.names)} FROM "{table.name}"', order

    async def read(self, table: Table, batch: int) -> AsyncIterator[list[Row]]:
        """Every row of `table` in batches of at most `batch`, by rowid or else key."""
        select, order = self._source(table)
        keys = ", ".join(name if "." in name else f'"{name}"' for name in order)
        width = len(order)
        last: tuple[object, ...] = ()
        while True:
            after = f" WHERE ({keys}) > ({marks(width)})" if last else ""
            raw = await self._rows(f"{select}{after} ORDER BY {keys} LIMIT ?", (*last, batch))
            if not raw:
                return
            last = tuple(raw[-1][:width])
            yield [tuple(None if value is None else self._load(table, kind, value)
                         for kind, value in zip(table.kinds, row[width:], strict=True))
                   for row in raw]
            if len(raw) < batch:
                return

    async def count(self, table: Table) -> int:
        [(count,)] = await self._rows(f'SELECT count(*) FROM "{table.name}"')
        return int(count)


def quoted(names: Sequence[str]) -> str:
    """Column names as a statement's list of quoted identifiers."""
    return ", ".join(f'"{name}"' for name in names)


async def _checksum(rows: AsyncIterator[Row]) -> str:
    """sha256 over the texts of each row (a node's id, then its text), each length-prefixed."""
    digest = hashlib.sha256()
    async for row in rows:
        for part in row:
            data = str(part).encode()
            digest.update(len(data).to_bytes(8, "big"))
            digest.update(data)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class TableCount:
    """One table after a transfer: rows in the source, copied by this run, in the target."""

    table: str
    source: int
    copied: int
    target: int


@dataclass(frozen=True, slots=True)
class TransferReport:
    """What `transfer` did, verified: counts per table and the nodes' checksum."""

    tables: tuple[TableCount, ...]
    checksum: str

    @property
    def copied(self) -> int:
        return sum(t.copied for t in self.tables)


# (table or CHECK/FINISH/VERIFY, rows done, rows in the source), before and after each batch.
Progress = Callable[[str, int, int], None]
CHECK = "check node ids"
FINISH = "build indexes"
VERIFY = "verify"


async def transfer(
    source: SqlDump, target: SqlDump, *, batch: int = 1000, progress: Progress = lambda *_: None
) -> TransferReport:
    """Copies every table of `source` into `target` (keys present skipped, each as the source
    holds it: `_held_as_in`), then verifies both stores' counts and node checksums. Raises
    `ConflictError` or `StorageError("mismatch")` naming what differs, before writing or after."""
    # The nodes first: a node id the target holds with another text is a conflict.
    for table in sorted(TABLES, key=lambda t: t is not NODES):
        await _held_as_in(source, target, table, batch, progress)
    inserted: dict[str, int] = {}
    for table in TABLES:
        total = await source.count(table)
        done = inserted[table.name] = 0
        progress(table.name, 0, total)
        async for rows in source.read(table, batch):
            inserted[table.name] += await target.write(table, rows)
            done += len(rows)
            progress(table.name, done, max(total, done))
    progress(FINISH, 0, 1)
    await target.finish()
    progress(FINISH, 1, 1)
    counts = []
    steps = len(TABLES) + 1  # each table's counts, then the checksums
    for done, table in enumerate(TABLES):
        progress(VERIFY, done, steps)
        have, held = await source.count(table), await target.count(table)
        if have != held:
            raise StorageError(
                "mismatch",
                f"the copy does not verify: table {table.name}: the source holds {have} rows,"
                f" the target {held}"
                " (the target held other rows, or the source changed during the copy)",
            )
        counts.append(TableCount(table.name, have, inserted[table.name], held))
    checksum = await source.checksum()
    if await target.checksum() != checksum:
        raise StorageError("mismatch", "the copy does not verify: table nodes: the node texts"
                           " differ (checksums of ids and texts)")
    progress(VERIFY, steps, steps)
    return TransferReport(tuple(counts), checksum)


async def _held_as_in(
    source: SqlDump, target: SqlDump, table: Table, batch: int, progress: Progress
) -> None:
    """Raises, before anything is copied, unless every row the target holds of `table` is the
    source's row of that key as it is now: `ConflictError` when a node id holds another text,
    else `StorageError("mismatch")`. A copy cut short is completed, but one the source has
    changed since (or another store's) is not mixed in."""
    nodes = table is NODES
    total = await source.count(table) if nodes else 0
    if nodes:
        progress(CHECK, 0, total)
    held = {_key(table, row): _digest(table, row)
            async for rows in target.read(table, batch) for row in rows}
    changed: dict[tuple[object, ...], object] = {}  # key -> a node's text
    done = 0
    if held:
        async for rows in source.read(table, batch):
            for row in rows:
                key = _key(table, row)
                digest = held.pop(key, None)
                if digest is not None and digest != _digest(table, row):
                    changed[key] = row[_NODE_TEXT] if nodes else None
            done += len(rows)
            if nodes:
                progress(CHECK, done, max(total, done))
    if nodes:
        progress(CHECK, total, total)
        theirs = await target.texts([str(key[0]) for key in changed])
        conflicts = [key[0] for key, text in changed.items()
                     if theirs.get(str(key[0]), text) != text]
        if conflicts:
            raise ConflictError(f"{len(conflicts)} node id(s) of the source hold another text"
                                f" in the target (e.g. {conflicts[0]!r}); nothing was copied")
    if changed or held:
        example = next(iter(changed or held))
        raise StorageError(
            "mismatch", f"table {table.name}: the target holds rows the source holds otherwise"
            f" or not at all (e.g. {example!r}), so it is no copy of the source as it is now;"
            " nothing was copied: migrate into an empty database")


def _key(table: Table, row: Row) -> tuple[object, ...]:
    return tuple(row[table.names.index(name)] for name in table.key or ("rowid",))


def _digest(table: Table, row: Row) -> bytes:
    """A row's values in one form on both backends (times in UTC, JSON with sorted keys,
    vectors as float16, as SQLite keeps a node's)."""
    digest = hashlib.blake2b(digest_size=16)
    for kind, value in zip(table.kinds, row, strict=True):
        if value is None:
            part = b"\x00"
        elif isinstance(value, datetime):
            part = value.astimezone(UTC).isoformat(timespec="microseconds").encode()
        elif kind is Kind.JSON:
            part = json.dumps(_numbers(value), sort_keys=True).encode()
        elif kind is Kind.VECTOR:
            part = np.asarray(value, dtype=np.float32).astype(np.float16).tobytes()
        elif isinstance(value, bytes | bytearray | memoryview):
            part = bytes(value)
        else:
            part = repr(value).encode()
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.digest()


def _numbers(value: object) -> object:
    """JSON `value` with each whole float the int of its written digits (jsonb gives 1e23 back
    as 100000000000000000000000, -0.0 as 0)."""
    if isinstance(value, float) and value.is_integer():
        return int(Decimal(repr(value)))
    if isinstance(value, dict):
        return {key: _numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_numbers(item) for item in value]
    return value


def same_store(a: str, b: str) -> bool:
    """Whether `a` and `b` name the same store: one file, or PostgreSQL URLs of the same
    host, address, port, database, service and options, whichever scheme they use."""
    if is_postgres(a) or is_postgres(b):
        return is_postgres(a) and is_postgres(b) and _database(a) == _database(b)
    first, second = Path(a), Path(b)
    if first.exists() and second.exists():
        return first.samefile(second)
    return first.resolve() == second.resolve()


def _database(url: str) -> tuple[object, ...]:
    """The server and database a PostgreSQL URL names (its text, where libpq cannot read it)."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        given = conninfo_to_dict(url)
    except Exception:  # no driver, or a URL libpq refuses (opening it says why)
        return (url.rstrip("/"),)
    # libpq's defaults: port 5432, the database named as the user.
    return (given.get("host"), given.get("hostaddr"), str(given.get("port") or 5432),
            given.get("dbname") or given.get("user"), given.get("service"), given.get("options"))


@asynccontextmanager
async def open_dump(store: str, *, must_exist: bool) -> AsyncIterator[SqlDump]:
    """The `SqlDump` of a SQLite file or `postgresql://` URL, opened and migrated; raises
    `StorageError("unavailable")` when `must_exist` and there is no mnemo store."""
    if is_postgres(store):
        from mnemo.storage.postgres.dump import open_postgres_dump

        async with open_postgres_dump(store, must_exist=must_exist) as dump:
            yield dump
    else:
        from mnemo.storage.sqlite.dump import open_sqlite_dump

        async with open_sqlite_dump(Path(store), must_exist=must_exist) as dump:
            yield dump
