"""Moving a memory from one store to another (`mnemo migrate`), backend-neutral: each
backend's `Dump` reads and writes `TABLES` as neutral values, skipping rows the target holds
(rerunnable), rowids kept. Work holders, leases, a re-embedding under way and search indexes
are not copied. Counts and `NodeChecksum` are verified after (`StorageError("mismatch")`)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from mnemo.errors import ConflictError, StorageError
from mnemo.storage.ports import is_postgres
from mnemo.storage.sql import Driver, marks

# A neutral row: one value per column of its table, in the table's column order.
Row = tuple[object, ...]

BATCH = 1000


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


def _tables(spec: str) -> tuple[Table, ...]:
    """Tables from lines of "name key,columns | column:kind ..." (a bare column is TEXT; an
    indented line goes on with the line before)."""
    tables = []
    for line in spec.replace("\n ", " ").strip().splitlines():
        head, _, columns = line.partition("|")
        name, key = head.split()
        parsed = [column.partition(":") for column in columns.split()]
        tables.append(Table(name, tuple(c for c, _, _ in parsed),
                            tuple(Kind(k or "text") for _, _, k in parsed), tuple(key.split(","))))
    return tuple(tables)


# In dependency order: a row's parents are copied before it (both backends check foreign keys).
TABLES = _tables("""
repos name | name config:json dim:int embedder created_at:time llm vectors_generation:int
sessions id | id repo state config:json episode_id created_at:time updated_at:time ended:bool
  model version:int active_at:time metadata:json
episodes id | rowid:int id session_id goal status started_at:time closed_at:time
steps id | id session_id episode_id idx:int trajectory_id observation action state_summary
  subgoal subgoal_vec:bytes reward:float metadata:json committed_in recorded_at:time
changesets id | id repo session_id episode_id payload:json created_at:time
nodes id | rowid:int id repo type text data:json key source_id created_at:time access_count:int
  last_access:time consolidated:bool valid_from:time valid_to:time recorded_at:time
  retired_at:time owners:json metadata:json
node_scopes repo,key,value,node | repo key value node:int
links src,dst,type | repo src dst type refs:int
vectors node_id | node_id repo vec:vector
applied_changesets id | id repo receipt:json applied_at:time
commits id | id repo seq:int committed_at:time session_id source_id nodes:json links:json
  retired:json reworded:json joined:json reverted_by reverts
threads id | id next_seq:int history_len:int boundary_seq:int created_at:time history_hash
messages id | rowid:int id thread_id seq:int role text content data:json tokens:int
  recorded_at:time metadata:json
message_vectors message_id | message_id thread_id vec:vector
compactions thread_id,start_seq | thread_id start_seq:int end_seq:int summary_text
  created_at:time
snapshots id | rowid:int id thread_id level:int start_seq:int end_seq:int text covered_by
  created_at:time
goals id | id thread_id description status created_at:time completed_at:time
pins message_id,goal_id | message_id goal_id thread_id created_at:time
ingests repo,source_id | repo source_id payload_hash changeset_id created_at:time
task_results episode_id,trajectory_id,task,digest | episode_id trajectory_id task digest
  reply:json cost:json created_at:time
server_profiles repo,model | repo model profile:json updated_at:time
""")

NODES = next(t for t in TABLES if t.name == "nodes")
_NODE_ID, _NODE_TEXT = NODES.names.index("id"), NODES.names.index("text")


class Dump(Protocol):
    """One open store, read and written table by table in neutral values."""

    async def count(self, table: Table) -> int:
        """How many rows `table` holds."""

    def read(self, table: Table, batch: int) -> AsyncIterator[list[Row]]:
        """Every row of `table` in batches of at most `batch`, by rowid or else key."""

    async def write(self, table: Table, rows: Sequence[Row]) -> int:
        """Inserts `rows` in one transaction, skipping keys present; how many were inserted."""

    async def node_texts(self, ids: Sequence[str]) -> dict[str, str]:
        """The text of each node among `ids` that this store holds."""

    async def checksum(self) -> str:
        """`NodeChecksum` over every node, in the order of its id's UTF-8 bytes."""

    async def finish(self) -> None:
        """Brings what the copied rows need up to date (identity sequences, vector indexes)."""


class SqlDump:
    """What both backends' dumps read alike, over their `Driver`."""

    def __init__(self, driver: Driver) -> None:
        self._driver = driver

    async def _rows(self, statement: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return await self._driver.read(lambda sql: sql.rows(statement, params))

    async def count(self, table: Table) -> int:
        [(count,)] = await self._rows(f'SELECT count(*) FROM "{table.name}"')
        return int(count)

    async def node_texts(self, ids: Sequence[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for at in range(0, len(ids), 500):
            chunk = ids[at:at + 500]
            found.update((str(node_id), str(text)) for node_id, text in await self._rows(
                f"SELECT id, text FROM nodes WHERE id IN ({marks(len(chunk))})", chunk))
        return found


class NodeChecksum:
    """sha256 over each node's id and text, each length-prefixed."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def add(self, node_id: str, text: str) -> None:
        for part in (node_id, text):
            data = part.encode()
            self._hash.update(len(data).to_bytes(8, "big"))
            self._hash.update(data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


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
    source: Dump, target: Dump, *, batch: int = BATCH, progress: Progress = lambda *_: None
) -> TransferReport:
    """Copies every table of `source` into `target` (keys present skipped), then verifies both
    stores' counts and node checksums. Raises `ConflictError` before writing when a node id
    holds another text in the target; `StorageError("mismatch")` naming what differs after."""
    conflicts, example, checked = 0, "", 0
    nodes = await source.count(NODES)
    progress(CHECK, 0, nodes)
    async for rows in source.read(NODES, batch):
        pairs = {str(row[_NODE_ID]): str(row[_NODE_TEXT]) for row in rows}
        for node_id, text in (await target.node_texts(list(pairs))).items():
            if pairs[node_id] != text:
                conflicts += 1
                example = example or node_id
        checked += len(rows)
        progress(CHECK, checked, max(nodes, checked))
    if conflicts:
        raise ConflictError(
            f"{conflicts} node id(s) of the source hold another text in the target"
            f" (e.g. {example!r}); nothing was copied"
        )
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
                f"table {table.name}: the source holds {have} rows, the target {held}"
                " (the target held other rows, or the source changed during the copy)",
            )
        counts.append(TableCount(table.name, have, inserted[table.name], held))
    checksum = await source.checksum()
    if await target.checksum() != checksum:
        raise StorageError(
            "mismatch", "table nodes: the node texts differ (checksums of ids and texts)"
        )
    progress(VERIFY, steps, steps)
    return TransferReport(tuple(counts), checksum)


def same_store(a: str, b: str) -> bool:
    """Whether `a` and `b` name the same store (one file, or one PostgreSQL URL)."""
    if is_postgres(a) or is_postgres(b):
        return a.rstrip("/") == b.rstrip("/")
    first, second = Path(a), Path(b)
    if first.exists() and second.exists():
        return first.samefile(second)
    return first.resolve() == second.resolve()


@asynccontextmanager
async def open_dump(store: str, *, must_exist: bool) -> AsyncIterator[Dump]:
    """The `Dump` of a SQLite file or `postgresql://` URL, opened and migrated; raises
    `StorageError("unavailable")` when `must_exist` and there is no mnemo store."""
    if is_postgres(store):
        from mnemo.storage.postgres.dump import open_postgres_dump

        async with open_postgres_dump(store, must_exist=must_exist) as dump:
            yield dump
    else:
        from mnemo.storage.sqlite.dump import open_sqlite_dump

        async with open_sqlite_dump(Path(store), must_exist=must_exist) as dump:
            yield dump
