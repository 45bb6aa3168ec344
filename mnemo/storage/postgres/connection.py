"""`Postgres`: the owner of mnemo's connections to one PostgreSQL database (psycopg 3's pool).

Connections run in autocommit: a statement outside `transaction()` is its own transaction, and
every other one is opened explicitly, so none is ever left open by accident.

Waiting for another writer: `busy_timeout` becomes the server's `lock_timeout`, the bound on
how long a statement waits for a row or table lock (SQLite's busy timeout, same meaning), and
the bound on waiting for a free pooled connection. A statement may also be given a
`statement_timeout`; none by default, since a large commit or an index build legitimately runs
for longer than any lock wait should. The driver waits in the event loop's I/O selector, never
blocking the loop.

Errors: whatever the driver or the pool raises becomes a `StorageError` where it enters mnemo,
in `storage_error`: `"busy"` for a lock or statement timeout, a serialization failure or a
deadlock (retrying may succeed), `"extension_missing"` when pgvector is absent, else
`"unavailable"`. The driver's exception is the `__cause__`.
"""

from __future__ import annotations

import functools
import select
import struct
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

import anyio
import numpy as np
import numpy.typing as npt
import psycopg
from anyio.lowlevel import checkpoint
from psycopg.adapt import Dumper, Loader
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types import TypeInfo
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from mnemo.errors import StorageError
from mnemo.storage.row import Row, loads
from mnemo.storage.sql import Work

Connection = psycopg.AsyncConnection[tuple[object, ...]]

T = TypeVar("T")

# A lazy read (`Statements.stream`) fetches this many rows at a time from a server-side
# cursor, so a bounded read of a long table is never read whole.
PAGE = 64

# SQLSTATEs that mean "another transaction was in the way; try again later": lock_not_available
# (lock_timeout), query_canceled (statement_timeout), serialization_failure, deadlock_detected.
_BUSY_STATES = {"55P03", "57014", "40001", "40P01"}

# Every session searches HNSW indexes with this ef_search: at least the candidates a query
# asks for (Config.recall_candidates, 50; an HNSW scan returns at most ef_search rows), and
# twice that for recall at scale (docs/DECISIONS.md).
HNSW_EF_SEARCH = 100


def storage_error(exc: BaseException, reason: str | None = None) -> StorageError:
    """The `StorageError` for a driver or pool error (it becomes the `__cause__`); `reason`
    overrides the one read from the error."""
    message = str(exc)
    error = StorageError(reason or _reason_of(getattr(exc, "sqlstate", None), message),
                         f"PostgreSQL: {message.strip()}")
    error.__cause__ = exc
    return error


def _reason_of(state: str | None, message: str) -> str:
    if state in _BUSY_STATES:
        return "busy"
    if _names_missing_vector(state, message):
        return "extension_missing"
    return "unavailable"


def _names_missing_vector(state: str | None, message: str) -> bool:
    # 42704 undefined_object: `type "vector" does not exist` (the extension is not created);
    # 58P01 undefined_file: the server has no pgvector to create it from.
    if state == "58P01":
        return "vector" in message
    return state == "42704" and '"vector"' in message


def conninfo(url: str, *, busy_timeout: float, statement_timeout: float | None,
             ef_search: int) -> str:
    """`url` (a libpq URL or key=value string, e.g. `postgresql://me@/mnemo?host=/run/pg`) with
    mnemo's session settings appended to its own `options`, which it keeps.

    Raises:
        StorageError: "unavailable": libpq cannot read the URL (as for a server it cannot
            reach: no store can be opened there).
    """
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise StorageError("unavailable", f"PostgreSQL: the URL cannot be read: {exc}") from exc
    settings = [
        f"-c lock_timeout={_ms(busy_timeout)}",
        f"-c statement_timeout={_ms(statement_timeout) if statement_timeout else 0}",
        # Placeholders until pgvector loads in the session, which then adopts them. A filtered
        # HNSW scan (a recall of some node types) goes on past ef_search until it has its
        # rows, in roughly distance order (the caller sorts what it gets).
        f"-c hnsw.ef_search={ef_search}",
        "-c hnsw.iterative_scan=relaxed_order",
        # timestamptz values come back in UTC, as every time mnemo hands out is.
        "-c timezone=UTC",
        # mnemo's reads are small (a recall hop joins a hundred links): starting parallel
        # workers costs more than the read (a 1M-node hop took four times as long with two).
        "-c max_parallel_workers_per_gather=0",
    ]
    options = str(params.get("options") or "").strip()
    params["options"] = " ".join([*([options] if options else []), *settings])
    params.setdefault("application_name", "mnemo")
    return make_conninfo("", **params)


def _ms(seconds: float) -> int:
    # 0 would mean "no timeout" to PostgreSQL; a positive wait under a millisecond counts one.
    return max(int(seconds * 1000), 1)


def vector_bytes(vector: npt.ArrayLike) -> bytes:
    """pgvector's binary wire format of one vector: its dimension and an unused word (big-endian
    int16 each), then big-endian float32s."""
    values = np.asarray(vector, dtype=np.float32).reshape(-1)
    return struct.pack(">HH", values.shape[0], 0) + values.astype(">f4").tobytes()


def vector_from_bytes(data: bytes | bytearray | memoryview) -> npt.NDArray[np.float32]:
    """A vector read in pgvector's binary format, as native float32."""
    dim, _ = struct.unpack_from(">HH", data)
    return np.frombuffer(data, dtype=">f4", count=dim, offset=4).astype(np.float32)


async def register_vector(conn: Connection) -> None:
    """Teaches `conn` pgvector's `vector` in binary: numpy arrays are sent as vectors (a
    parameter that is an `np.ndarray` must be one) and vectors come back as float32 arrays;
    and `jsonb` is read by `mnemo.storage.row.loads` (node data, faster than the
    standard library's `json.loads`, psycopg's default). The vector is left out in a
    database without the extension (before the schema is applied)."""
    set_json_loads(loads, conn)
    info = await TypeInfo.fetch(conn, "vector")
    if info is None:
        return
    info.register(conn)
    vector_oid = info.oid

    class VectorDumper(Dumper):
        format = psycopg.pq.Format.BINARY
        oid = vector_oid

        def dump(self, obj: Any) -> bytes:
            return vector_bytes(obj)

    class VectorLoader(Loader):
        format = psycopg.pq.Format.BINARY

        def load(self, data: Any) -> npt.NDArray[np.float32]:
            return vector_from_bytes(data)

    class VectorTextLoader(Loader):
        def load(self, data: Any) -> npt.NDArray[np.float32]:
            text = bytes(data).decode("ascii").strip("[]")
            return np.array(text.split(",") if text else [], dtype=np.float32)

    conn.adapters.register_dumper(np.ndarray, VectorDumper)
    conn.adapters.register_loader(vector_oid, VectorLoader)
    conn.adapters.register_loader(vector_oid, VectorTextLoader)


def _has_input(conn: Connection) -> bool:
    """Whether an idle connection has something to read (mnemo listens for nothing: the
    server's goodbye, or the end of a closed stream), without waiting."""
    if conn.closed or conn.broken:
        return True
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)


class Postgres:
    """A pool of connections to one database, opened by `open()` (or `async with`).

    Raises (from every method that touches the database):
        StorageError: see the module docstring for the reasons.
    """

    def __init__(
        self,
        url: str,
        *,
        busy_timeout: float = 5.0,
        statement_timeout: float | None = None,
        connect_timeout: float = 10.0,
        min_size: int = 1,
        max_size: int = 10,
    ) -> None:
        if busy_timeout < 0:
            raise ValueError(f"busy_timeout must be >= 0, got {busy_timeout}")
        self.url = url
        self.max_size = max_size
        self.busy_timeout = busy_timeout
        self.connect_timeout = connect_timeout
        self._pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            conninfo(url, busy_timeout=busy_timeout, statement_timeout=statement_timeout,
                     ef_search=HNSW_EF_SEARCH),
            connection_class=psycopg.AsyncConnection,
            kwargs={"autocommit": True},
            min_size=min_size,
            max_size=max_size,
            timeout=max(busy_timeout, 0.001),
            open=False,
            name="mnemo",
            configure=register_vector,
        )
        self._conninfo = conninfo(url, busy_timeout=busy_timeout,
                                  statement_timeout=statement_timeout, ef_search=HNSW_EF_SEARCH)
        self._lent = 0  # connections in the callers' hands

    async def open(self, *, migrate: bool = False) -> None:
        """Opens the pool and waits for its first connections. With `migrate`, first applies
        the schema's pending migrations on a connection of its own, so that every pooled
        connection finds pgvector's type.

        Raises:
            StorageError: `"unavailable"` when no connection could be made within
                `connect_timeout` seconds; as `schema.apply` for the migrations.
        """
        if migrate:
            from mnemo.storage.postgres import schema

            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True,
                    connect_timeout=max(1, int(self.connect_timeout)),
                )
            except psycopg.Error as exc:
                raise storage_error(exc) from exc
            async with conn:
                await schema.apply(conn)
        try:
            await self._pool.open(wait=True, timeout=self.connect_timeout)
        except (psycopg.Error, PoolTimeout) as exc:
            await self._pool.close()
            raise storage_error(exc) from exc

    async def close(self) -> None:
        """Closes every connection; a second call does nothing."""
        await self._pool.close()

    async def __aenter__(self) -> Postgres:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """A pooled connection (autocommit) for the block; driver errors raised in the block
        become `StorageError`. When the pool has none to give within `busy_timeout` while
        some of its connections are free (it is still remaking those a restarted server
        ended: psycopg_pool waits up to seconds between tries), a connection of the block's
        own is made.

        Raises:
            StorageError: `"busy"` when every connection stayed taken (the pool's, by this
                Memory's work, or the server's, by other clients) for `busy_timeout`
                seconds; `"unavailable"` when none could be made; `"closed"` after `close`.
        """
        try:
            try:
                conn, pooled = await self._live_connection(), True
            except PoolTimeout as exc:
                conn, pooled = await self._own_connection(exc), False
            self._lent += 1
            try:
                async with conn:  # as the pool's `connection()`: ends a transaction left open
                    yield conn
            finally:
                self._lent -= 1
                await (self._pool.putconn(conn) if pooled else conn.close())
        except PoolClosed as exc:
            raise StorageError("closed", "the database is not open") from exc
        except psycopg.Error as exc:
            raise storage_error(exc) from exc

    async def _own_connection(self, waited: PoolTimeout) -> Connection:
        """A connection of its own for a caller the pool made wait `waited`, made as the
        pool's are.

        Raises:
            StorageError: "busy" when every pooled connection is lent out, or the server has
                no connection left ("too many clients"); "unavailable" when none can be
                made.
        """
        if self._lent >= self.max_size:
            raise storage_error(waited, "busy")
        try:
            conn = await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True, connect_timeout=max(1, int(self.connect_timeout))
            )
        except psycopg.Error as exc:
            # libpq's connection errors carry no SQLSTATE: the message says it.
            full = "too many clients" in str(exc) or exc.sqlstate == "53300"
            raise storage_error(exc, "busy" if full else "unavailable") from exc
        await register_vector(conn)
        return conn

    async def _live_connection(self) -> Connection:
        """A pooled connection whose server is still there. A server that restarted (or
        ended the session) leaves its pooled connections closed at the other end, which the
        driver learns only at their next use: that use failed. An idle connection has
        nothing to read, so one that has (the server's goodbye, then the end of the stream)
        is tried with an empty statement and, failing it, dropped for another, as many times
        as the pool has connections, within the pool's wait. The pool's own `check` would
        cost a round trip at every use, and waits a second after a failed one."""
        deadline = anyio.current_time() + self._pool.timeout
        for _ in range(self.max_size + 1):
            left = max(deadline - anyio.current_time(), 0.001)
            conn = await self._pool.getconn(timeout=left)
            if not _has_input(conn):
                return conn
            try:
                await conn.execute("")
            except psycopg.Error:
                # Closed, the pool forgets it and opens another in its place.
                await conn.close()
                await self._pool.putconn(conn)
                continue
            return conn
        return await self._pool.getconn(timeout=max(deadline - anyio.current_time(), 0.001))

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """A pooled connection inside one transaction: committed when the block ends, rolled
        back (nothing written) when it raises or is cancelled.

        Raises:
            StorageError: as `connection`, and for any driver error of the block or the commit.
        """
        async with self.connection() as conn:
            try:
                async with conn.transaction():
                    yield conn
            except psycopg.Error as exc:
                raise storage_error(exc) from exc

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[Connection]:
        """A connection inside one read-only REPEATABLE READ transaction: every statement of
        the block sees the same snapshot, as a read "together" promises."""
        async with self.transaction() as conn:
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield conn

    async def read(self, work: Work[T]) -> T:
        """Runs `work` (`storage.sql`) on a pooled connection, in autocommit."""
        async with self.connection() as conn:
            return await work(PgStatements(conn))

    one = read  # in autocommit, a statement is its own transaction

    async def together(self, work: Work[T]) -> T:
        """Runs `work` (`storage.sql`) inside `reading`."""
        async with self.reading() as conn:
            return await work(PgStatements(conn))

    async def write(self, work: Work[T]) -> T:
        """Runs `work` (`storage.sql`) in one transaction."""
        async with self.transaction() as conn:
            return await work(PgStatements(conn))

    side_write = write

    async def fetch_all(
        self, statement: Any, params: Any = None, *, binary: bool = False
    ) -> list[Row]:
        """The rows of one statement (vectors as float32 arrays with `binary`), run on a
        pooled connection in autocommit.

        Raises:
            StorageError: as `connection`.
        """
        async with self.connection() as conn, conn.cursor(binary=binary) as cur:
            await cur.execute(statement, params)
            return await rows_of(cur)


# The driver converts the rows it fetches on the event loop: they are fetched `SLICE_ROWS` at a
# time, and the loop runs other work whenever a fetch has held it `SLICE_SECONDS` (a thousand
# rows of long texts take tens of milliseconds to decode).
SLICE_ROWS = 64
SLICE_SECONDS = 0.005


async def rows_of(cur: psycopg.AsyncCursor[Any]) -> list[Row]:
    """Every row of `cur`'s result, as `fetchall`, converted a slice at a time."""
    rows: list[Row] = []
    started = time.perf_counter()
    while part := await cur.fetchmany(SLICE_ROWS):
        rows += part
        if time.perf_counter() - started > SLICE_SECONDS:
            await checkpoint()
            started = time.perf_counter()
    return rows


@functools.lru_cache(maxsize=512)
def placeholders(query: str) -> str:
    """`query` with psycopg's `%s` for `storage.sql`'s `?` placeholders."""
    return query.replace("?", "%s")


class PgStatements:
    """`storage.sql.Statements` on one connection."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    async def rows(self, query: str, params: Sequence[Any] = ()) -> list[Row]:
        cur = await self.conn.execute(placeholders(query), params)
        return await rows_of(cur)

    async def row(self, query: str, params: Sequence[Any] = ()) -> Row | None:
        cur = await self.conn.execute(placeholders(query), params)
        return cast(Row | None, await cur.fetchone())

    async def run(self, query: str, params: Sequence[Any] = ()) -> int:
        cur = await self.conn.execute(placeholders(query), params)
        return max(cur.rowcount, 0)

    async def run_many(self, query: str, params: Sequence[Sequence[Any]]) -> None:
        if params:
            async with self.conn.cursor() as cur:
                await cur.executemany(placeholders(query), params)

    async def stream(self, query: str, params: Sequence[Any] = ()) -> AsyncGenerator[Row, None]:
        async with self.conn.cursor(name="mnemo_rows") as cur:
            cur.itersize = PAGE
            await cur.execute(placeholders(query), params)
            async for row in cur:
                yield row
