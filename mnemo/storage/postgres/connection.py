"""`Postgres`: mnemo's pool of autocommit connections to one PostgreSQL database (a
transaction is only ever opened explicitly). `busy_timeout` bounds a lock wait (the server's
`lock_timeout`) and the wait for a pooled connection; `statement_timeout` is off by default.
Driver and pool errors become `StorageError` (`storage_error`): "busy" for a lock or statement
timeout, serialization failure or deadlock, "extension_missing" without pgvector, else
"unavailable"; the driver's exception is the `__cause__`."""

from __future__ import annotations

import functools
import hashlib
import select
import struct
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, TypeVar, cast

import anyio
import numpy as np
import numpy.typing as npt
import psycopg
from anyio.lowlevel import checkpoint
from psycopg.adapt import Dumper, Loader
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types import TypeInfo
from psycopg.types.json import Jsonb, set_json_loads
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from mnemo.errors import StorageError
from mnemo.graph.model import Vector
from mnemo.storage.row import Row, loads
from mnemo.storage.sql import Dialect, Statements, Work

Connection = psycopg.AsyncConnection[tuple[object, ...]]

T = TypeVar("T")

# lock_not_available, query_canceled (statement_timeout), serialization_failure, deadlock.
_BUSY_STATES = {"55P03", "57014", "40001", "40P01"}

# At least Config.recall_candidates (an HNSW scan returns at most ef_search rows), twice it
# for recall at scale (docs/DECISIONS.md).
HNSW_EF_SEARCH = 100


def lock_key(name: str) -> int:
    """The key of the advisory lock `name`: 64 bits of a digest of it."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def claims_lock_key(session_id: str) -> int:
    return lock_key("mnemo.step_claims:" + session_id)


def storage_error(exc: BaseException, reason: str | None = None) -> StorageError:
    """The `StorageError` for a driver or pool error (module docstring); `reason` overrides."""
    message, state = str(exc), getattr(exc, "sqlstate", None)
    if reason is None:
        # 42704: the extension is not created; 58P01: the server has no pgvector.
        missing = ((state == "58P01" and "vector" in message)
                   or (state == "42704" and '"vector"' in message))
        reason = "busy" if state in _BUSY_STATES else (
            "extension_missing" if missing else "unavailable")
    error = StorageError(reason, f"PostgreSQL: {message.strip()}")
    error.__cause__ = exc
    return error


def conninfo(url: str, *, busy_timeout: float, statement_timeout: float | None = None) -> str:
    """`url` (libpq URL or key=value string) with mnemo's session settings appended to its
    `options`. Raises `StorageError("unavailable")` when libpq cannot read it."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise StorageError("unavailable", f"PostgreSQL: the URL cannot be read: {exc}") from exc
    settings = [
        f"-c lock_timeout={_ms(busy_timeout)}",
        f"-c statement_timeout={_ms(statement_timeout) if statement_timeout else 0}",
        # Adopted when pgvector loads; a filtered HNSW scan goes on past ef_search (the
        # caller sorts what it gets).
        f"-c hnsw.ef_search={HNSW_EF_SEARCH}",
        "-c hnsw.iterative_scan=relaxed_order",
        "-c timezone=UTC",
        # Parallel workers cost more than mnemo's small reads (BENCHMARKS.md).
        "-c max_parallel_workers_per_gather=0",
    ]
    options = str(params.get("options") or "").strip()
    params["options"] = " ".join([*([options] if options else []), *settings])
    params.setdefault("application_name", "mnemo")
    return make_conninfo("", **params)


def _ms(seconds: float) -> int:
    # 0 would mean "no timeout".
    return max(int(seconds * 1000), 1)


async def register_vector(conn: Connection) -> None:
    """Teaches `conn` pgvector's `vector` in binary (an `np.ndarray` parameter sent as one,
    float32 arrays back; skipped without the extension), and `jsonb` read with `row.loads`."""
    set_json_loads(loads, conn)
    info = await TypeInfo.fetch(conn, "vector")
    if info is None:
        return
    info.register(conn)
    vector_oid = info.oid

    # pgvector's binary format: the dimension and an unused int16, then big-endian float32s.
    class VectorDumper(Dumper):
        format = psycopg.pq.Format.BINARY
        oid = vector_oid

        def dump(self, obj: Any) -> bytes:
            values = np.asarray(obj, dtype=np.float32).reshape(-1)
            return struct.pack(">HH", values.shape[0], 0) + values.astype(">f4").tobytes()

    class VectorLoader(Loader):
        format = psycopg.pq.Format.BINARY

        def load(self, data: Any) -> npt.NDArray[np.float32]:
            dim, _ = struct.unpack_from(">HH", data)
            return np.frombuffer(data, dtype=">f4", count=dim, offset=4).astype(np.float32)

    class VectorTextLoader(Loader):
        def load(self, data: Any) -> npt.NDArray[np.float32]:
            text = bytes(data).decode("ascii").strip("[]")
            return np.array(text.split(",") if text else [], dtype=np.float32)

    conn.adapters.register_dumper(np.ndarray, VectorDumper)
    conn.adapters.register_loader(vector_oid, VectorLoader)
    conn.adapters.register_loader(vector_oid, VectorTextLoader)


def as_array(vector: Vector) -> npt.NDArray[np.float32]:
    """One vector as the float32 array that `register_vector` sends as a pgvector `vector`."""
    return np.asarray(vector, dtype=np.float32).reshape(-1)


def _has_input(conn: Connection) -> bool:
    """Whether an idle connection has something to read (the server's goodbye), without waiting."""
    if conn.closed or conn.broken:
        return True
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)


# How long the pool retries a lost connection before the next call that waits starts anew.
RECONNECTING = 2.0


class Postgres:
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
        self.url = url
        self.max_size = max_size
        self.connect_timeout = connect_timeout
        self._conninfo = conninfo(
            url, busy_timeout=busy_timeout, statement_timeout=statement_timeout)
        self._pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            self._conninfo,
            connection_class=psycopg.AsyncConnection,
            kwargs={"autocommit": True},
            min_size=min_size,
            max_size=max_size,
            timeout=max(busy_timeout, 0.001),
            # A lost connection's reconnection backs off (1, 2, 4 s...) only this long, then
            # the next call that waits starts one at once: a server back after an outage
            # serves within seconds, not at the end of a backoff grown during the outage.
            reconnect_timeout=RECONNECTING,
            open=False,
            name="mnemo",
            configure=register_vector,
        )
        self._lent = 0  # connections in the callers' hands

    async def open(self, *, migrate: bool = False, upgrade: bool = True) -> None:
        """Opens the pool and waits for its first connections, after applying pending
        migrations on a connection of its own with `migrate` (`schema.apply`'s `upgrade`).
        Raises `StorageError` ("unavailable" past `connect_timeout`; as `schema.apply`)."""
        if migrate:
            from mnemo.storage.postgres import schema

            try:
                conn = await self._connect()
            except psycopg.Error as exc:
                raise storage_error(exc) from exc
            async with conn:
                await schema.apply(conn, upgrade=upgrade)
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
        """A pooled autocommit connection for the block (one of its own when the pool is
        still remaking connections a restarted server ended). Raises `StorageError`: "busy"
        when all stayed taken for `busy_timeout`, "unavailable", "closed" after `close`."""
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
        """A connection made as the pool's are, for a caller the pool made wait. Raises
        `StorageError`: "busy" when all are lent out or the server is full, else "unavailable"."""
        if self._lent >= self.max_size:
            raise storage_error(waited, "busy")
        try:
            conn = await self._connect()
        except psycopg.Error as exc:
            full = "too many clients" in str(exc) or exc.sqlstate == "53300"
            raise storage_error(exc, "busy" if full else "unavailable") from exc
        await register_vector(conn)
        return conn

    async def _connect(self) -> Connection:
        return await psycopg.AsyncConnection.connect(
            self._conninfo, autocommit=True, connect_timeout=max(1, int(self.connect_timeout)))

    async def _live_connection(self) -> Connection:
        """A pooled connection whose server is still there: one with input waiting (ended by
        the server) is tried with an empty statement and, failing, replaced, within the pool's
        wait (cheaper than the pool's `check`, a round trip per use)."""
        deadline = anyio.current_time() + self._pool.timeout
        for _ in range(self.max_size + 1):
            conn = await self._pool.getconn(timeout=max(deadline - anyio.current_time(), 0.001))
            try:
                if _has_input(conn):
                    await conn.execute("")
                return conn
            except psycopg.Error:
                await conn.close()
                await self._pool.putconn(conn)
        return await self._pool.getconn(timeout=max(deadline - anyio.current_time(), 0.001))

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """A connection in one transaction: committed when the block ends, rolled back when
        it raises or is cancelled. Raises `StorageError` as `connection`."""
        async with self.connection() as conn, conn.transaction():
            yield conn

    async def read(self, work: Work[T]) -> T:
        async with self.connection() as conn:
            return await work(PgStatements(conn))

    one = read  # in autocommit, a statement is its own transaction

    async def together(self, work: Work[T]) -> T:
        async with self.transaction() as conn:
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            return await work(PgStatements(conn))

    async def write(self, work: Work[T]) -> T:
        async with self.transaction() as conn:
            return await work(PgStatements(conn))

    side_write = write

    async def fetch_all(
        self, statement: Any, params: Any = None, *, binary: bool = False
    ) -> list[Row]:
        """The rows of one autocommit statement (vectors as float32 arrays with `binary`)."""
        async with self.connection() as conn, conn.cursor(binary=binary) as cur:
            await cur.execute(statement, params)
            return await rows_of(cur)


# Rows are decoded on the event loop: fetched `SLICE_ROWS` at a time, yielding the loop each
# `SLICE_SECONDS`.
SLICE_ROWS = 64
SLICE_SECONDS = 0.005


async def rows_of(cur: psycopg.AsyncCursor[Any]) -> list[Row]:
    rows: list[Row] = []
    started = time.perf_counter()
    while part := await cur.fetchmany(SLICE_ROWS):
        rows += part
        if time.perf_counter() - started > SLICE_SECONDS:
            await checkpoint()
            started = time.perf_counter()
    return rows


class PgDialect(Dialect):
    BYTE_ORDER = ' COLLATE "C"'
    LOCK = " FOR UPDATE"
    SHARE = " FOR SHARE"
    TEXT = "::text"
    ANY = " = ANY(?)"

    _vector = staticmethod(as_array)

    @staticmethod
    def _list(values: Sequence[str]) -> object:
        return list(values)

    @staticmethod
    def _json(value: object) -> object:
        return None if value is None else Jsonb(value)

    @staticmethod
    def _json_text(text: str) -> object:
        return Jsonb(text, dumps=str)  # already JSON (sort_keys): sent as it is

    def _stamp(self, at: datetime) -> object:
        return at  # the datetime itself

    @staticmethod
    def _time(text: str | None) -> object:
        return None if text is None else datetime.fromisoformat(text)

    @staticmethod
    async def _lock_claims(sql: Statements, session_id: str) -> None:
        await sql.run("SELECT pg_advisory_xact_lock(?)", (claims_lock_key(session_id),))


@functools.lru_cache(maxsize=512)
def placeholders(query: str) -> str:
    """`query` with psycopg's `%s` for `storage.sql`'s `?` placeholders."""
    return query.replace("?", "%s")


class PgStatements:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    async def rows(self, query: str, params: Sequence[Any] = ()) -> list[Row]:
        return await rows_of(await self.conn.execute(placeholders(query), params))

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
            cur.itersize = 64  # rows fetched at a time
            await cur.execute(placeholders(query), params)
            async for row in cur:
                yield row
