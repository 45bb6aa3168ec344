"""`Database`: the one owner of mnemo's SQLite connection.

Every statement runs in one worker thread that owns the connection (`mnemo.storage.worker`):
the event loop never waits on SQLite.

A transaction takes the write lock when it begins (`BEGIN IMMEDIATE`), so a writer waits in
SQLite's busy handler, in the worker thread, for at most `busy_timeout` seconds, and never
fails half-way because another writer slipped in after its first read. Whatever SQLite raises
becomes a `StorageError` here (`"busy"`, `"unavailable"` or `"corrupt"`), with nothing of the
failed transaction written.

WAL with `synchronous=NORMAL` is durable against a killed process; `"FULL"` also against power
loss. The automatic checkpoint runs inside the write that crosses it, and `journal_size_limit`
truncates the WAL after each one.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import time
from collections.abc import AsyncGenerator, Callable, Generator, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import anyio
from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.errors import StorageError
from mnemo.storage.clock import elapsed, host_now
from mnemo.storage.row import Row
from mnemo.storage.sql import Work as StatementsWork
from mnemo.storage.sql import drive
from mnemo.storage.sqlite.schema import MIGRATIONS, migrate
from mnemo.storage.worker import Queued, Worker

T = TypeVar("T")

Work = Callable[[SqliteUtilsDatabase], T]

# The WAL is truncated to this size after a checkpoint (it may grow past it between two).
WAL_SIZE_LIMIT = 16 * 1024 * 1024

_BUSY_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
_CORRUPT_CODES = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}

# mnemo's own random numbers: the global generator is the application's.
_JITTER = random.Random()


class _Connection(SqliteUtilsDatabase):
    """sqlite-utils' `Database` whose outermost `atomic()` takes the write lock up front."""

    @contextlib.contextmanager
    def atomic(self) -> Generator[SqliteUtilsDatabase, None, None]:
        if self.conn.in_transaction:
            with super().atomic() as db:  # a savepoint inside the running transaction
                yield db
            return
        # A deferred BEGIN fails at once with SQLITE_BUSY_SNAPSHOT when another writer
        # committed after its first read; IMMEDIATE waits in the busy handler instead.
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self
        except BaseException:
            if self.conn.in_transaction:
                self.conn.rollback()
            raise
        try:
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.rollback()
            raise


def storage_error(exc: sqlite3.Error) -> StorageError:
    """The `StorageError` for a driver error (it becomes the `__cause__`): "busy", "corrupt",
    else "unavailable", whose message says when the file or its folder is read-only."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    note = ""
    if primary in _BUSY_CODES or "locked" in str(exc) or "busy" in str(exc):
        reason = "busy"
    elif primary in _CORRUPT_CODES:
        reason = "corrupt"
    else:
        reason = "unavailable"
        if primary == sqlite3.SQLITE_READONLY:
            note = (" (read-only: mnemo writes the file, and its -wal and -shm files in its"
                    " folder, even to read it)")
    error = StorageError(reason, f"SQLite: {exc}{note}")
    error.__cause__ = exc
    return error


class Database:
    """The SQLite file (or `:memory:`) behind every store, with its one connection."""

    def __init__(
        self,
        path: str | Path = ":memory:",
        *,
        synchronous: str = "NORMAL",
        busy_timeout: float = 5.0,
    ) -> None:
        if synchronous.upper() not in {"NORMAL", "FULL", "EXTRA"}:
            raise ValueError(f"synchronous must be NORMAL, FULL or EXTRA, got {synchronous!r}")
        self.path = str(path)
        self._synchronous = synchronous.upper()
        self._busy_ms = max(int(busy_timeout * 1000), 0)
        self.busy_timeout = max(busy_timeout, 0.0)
        self._db: SqliteUtilsDatabase | None = None
        self._worker: Worker | None = None
        self.clock = HostClock()  # the store's time, anchored in the file when it opens

    @property
    def db(self) -> SqliteUtilsDatabase:
        if self._db is None:
            raise StorageError("closed", "the database is not open")
        return self._db

    async def open(self) -> None:
        """Connects, enables WAL and applies pending migrations.

        Raises:
            StorageError: the file cannot be opened or set up (`"busy"` when another process
                held its write lock for longer than the busy timeout).
        """
        self._worker = Worker(f"mnemo-db:{Path(self.path).name}")
        try:
            await self._call(self._open_sync)
        except BaseException:
            self._worker.stop()
            self._worker = None
            raise

    def _open_sync(self) -> None:
        # Autocommit mode: a statement outside `atomic()` is its own transaction, and
        # `atomic()` opens every other one explicitly (no implicit BEGIN left open).
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            # Before anything else: switching to WAL and migrating wait for other processes
            # opening the same new file.
            conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            db = _Connection(conn, execute_plugins=False)
            deadline = time.monotonic() + self._busy_ms / 1000
            while True:
                try:
                    self._set_up(db)
                    break
                except sqlite3.OperationalError as exc:
                    # Switching to WAL, or reading a schema being written, can be refused
                    # without the busy handler's wait: retry until the busy timeout is spent.
                    if storage_error(exc).reason != "busy" or time.monotonic() >= deadline:
                        raise
                    time.sleep(_JITTER.uniform(0.005, 0.03))
        except BaseException:
            conn.close()
            raise
        self._db = db

    def _set_up(self, db: SqliteUtilsDatabase) -> None:
        conn = db.conn
        if self.path != ":memory:":
            db.enable_wal()
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        # Erasure: whatever a delete or update frees is zeroed, so a forgotten word leaves no
        # copy in free space or on the freelist.
        conn.execute("PRAGMA secure_delete=ON")
        migrate(db)
        self.clock.anchor(db)

    async def close(self) -> None:
        if self._worker is None:
            return
        worker, self._worker = self._worker, None
        db, self._db = self._db, None
        try:
            if db is not None:
                with anyio.CancelScope(shield=True):
                    await worker.call(lambda: _close_sync(db))
        except sqlite3.Error as exc:
            raise storage_error(exc) from exc
        finally:
            worker.stop()

    async def run(self, work: Work[T]) -> T:
        """Runs `work(db)` in the connection's thread, alone on the connection.

        Raises:
            StorageError: SQLite failed (the transaction `work` opened is rolled back).
        """
        return await self._call(_alone(self.db, work))

    async def read(self, work: StatementsWork[T]) -> T:
        """Runs `work` (`storage.sql`) in the connection's thread, outside a transaction."""
        return await self.run(lambda db: drive(work(SqliteStatements(db.conn))))

    together = read

    async def write(self, work: StatementsWork[T]) -> T:
        """Runs `work` (`storage.sql`) in the connection's thread, in one `atomic()`."""
        return await self.run(lambda db: _within(db.atomic(), db, work))

    one = write

    async def side_write(self, work: StatementsWork[T]) -> T:
        """Runs `work` (`storage.sql`) in the connection's thread, in one `side_write`."""
        return await self.run(lambda db: _within(side_write(db), db, work))

    def post(self, work: Work[object], failed: Callable[[StorageError], object]) -> None:
        """Queues `work(db)` on the connection's thread and returns at once, without waiting
        for it: it runs after every call given before and before every call given after, so
        a later read through this `Database` sees what it wrote. A failure (its transaction
        rolled back) goes to `failed`, in that thread.

        Raises:
            StorageError: "closed", the database is not open.
        """
        db = self.db
        worker = self._worker
        if worker is None:
            raise StorageError("closed", "the database is not open")

        def job() -> None:
            try:
                work(db)
            except sqlite3.Error as exc:
                failed(storage_error(exc))
            finally:
                if db.conn.in_transaction:
                    db.conn.rollback()

        worker.post(job)

    def start(self, work: Work[T]) -> Queued[T]:
        """Queues `work(db)` as `run` does and returns at once: it runs whether or not its
        result is awaited (`Queued.result`).

        Raises:
            StorageError: "closed", the database is not open.
        """
        return Queued(self._queue(_alone(self.db, work)), _translated)

    async def _call(self, fn: Callable[[], T]) -> T:
        future = self._queue(fn)
        try:
            with anyio.CancelScope(shield=True):
                result = await future
        except sqlite3.Error as exc:
            raise storage_error(exc) from exc
        return result

    def _queue(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        worker = self._worker
        if worker is None:
            raise StorageError("closed", "the database is not open")
        # `Worker.call`'s hop, inlined (the append path).
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        worker.jobs.put((fn, future, loop))
        return future


def _alone(db: SqliteUtilsDatabase, work: Work[T]) -> Callable[[], T]:
    """`work(db)` as a job of the connection's thread: a transaction it leaves open (it
    failed inside one of its own) is rolled back."""

    def job() -> T:
        try:
            return work(db)
        finally:
            if db.conn.in_transaction:
                db.conn.rollback()

    return job


def _within(
    transaction: contextlib.AbstractContextManager[object], db: SqliteUtilsDatabase,
    work: StatementsWork[T],
) -> T:
    with transaction:
        return drive(work(SqliteStatements(db.conn)))


class SqliteStatements:
    """`storage.sql.Statements` on the connection, run at once in its thread."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    async def rows(self, query: str, params: Sequence[Any] = ()) -> list[Row]:
        return self._conn.execute(query, params).fetchall()

    async def row(self, query: str, params: Sequence[Any] = ()) -> Row | None:
        row: Row | None = self._conn.execute(query, params).fetchone()
        return row

    async def run(self, query: str, params: Sequence[Any] = ()) -> int:
        return max(self._conn.execute(query, params).rowcount, 0)

    async def run_many(self, query: str, params: Sequence[Sequence[Any]]) -> None:
        self._conn.executemany(query, params)

    async def stream(self, query: str, params: Sequence[Any] = ()) -> AsyncGenerator[Row, None]:
        cursor = self._conn.execute(query, params)
        try:
            for row in cursor:
                yield row
        finally:
            cursor.close()


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """This boot's id ("" where the kernel tells none)."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


class HostClock:
    """The store's time on SQLite: the same in every process of the host, and never stepped
    by a wall clock.

    The file keeps an anchor (`store_clock`): a wall time and the boot time clock's
    (`storage.clock.elapsed`) reading at one moment, written by the first Memory to open the
    file after boot. The store's time is the anchor's wall time plus the boot time elapsed
    since: the same in every process, and no wall clock step moves a lease or a heartbeat.
    A new boot (another boot id, or the boot clock below the anchor's) anchors again and
    forgets the holders recorded before it.
    """

    def __init__(self, wall: Callable[[], datetime] = host_now) -> None:
        self.wall = wall  # read to anchor a new boot, and before the file is open
        self._anchor: tuple[datetime, float] | None = None

    def now(self) -> datetime:
        if self._anchor is None:
            return self.wall()
        wall, at = self._anchor
        return wall + timedelta(seconds=elapsed() - at)

    def anchor(self, db: SqliteUtilsDatabase) -> None:
        """Reads the file's anchor, or writes one when it is of another boot (and forgets the
        holders of that boot). Runs in the connection's thread, when the file opens."""
        boot = boot_id()
        row = _anchor_of(db)
        if not _this_boot(row, boot):
            with db.atomic():
                row = _anchor_of(db)  # another process may have anchored meanwhile
                if not _this_boot(row, boot):
                    row = (boot, self.wall().isoformat(timespec="microseconds"), elapsed())
                    db.conn.execute("DELETE FROM store_clock")
                    db.conn.execute("INSERT INTO store_clock(boot, wall, at) VALUES (?, ?, ?)",
                                    row)
                    db.conn.execute("DELETE FROM holders")
        assert row is not None
        self._anchor = (datetime.fromisoformat(str(row[1])), float(row[2]))


def _anchor_of(db: SqliteUtilsDatabase) -> tuple[Any, ...] | None:
    row = db.conn.execute("SELECT boot, wall, at FROM store_clock").fetchone()
    return None if row is None else tuple(row)


def _this_boot(row: tuple[Any, ...] | None, boot: str) -> bool:
    return row is not None and row[0] == boot and elapsed() >= float(row[2])


def _translated(exc: BaseException) -> BaseException:
    return storage_error(exc) if isinstance(exc, sqlite3.Error) else exc


# How long a read's side write (access counts, message vectors) waits for another process's
# write lock: the wait holds up every call on the one connection; past it the write is dropped.
SIDE_WRITE_WAIT = 0.1


@contextlib.contextmanager
def side_write(db: SqliteUtilsDatabase) -> Iterator[None]:
    """A read's side write: one transaction (`atomic`) that waits at most `SIDE_WRITE_WAIT`
    (never past the busy timeout) for another process's write lock. Runs in the connection's
    thread.

    Raises:
        sqlite3.OperationalError: the lock could not be had meanwhile ("busy" once `run`
            makes it a StorageError).
    """
    conn = db.conn
    (before,) = conn.execute("PRAGMA busy_timeout").fetchone()
    conn.execute(f"PRAGMA busy_timeout={min(int(SIDE_WRITE_WAIT * 1000), int(before))}")
    try:
        with db.atomic():
            yield
    finally:
        conn.execute(f"PRAGMA busy_timeout={int(before)}")


def truncate_wal(db: SqliteUtilsDatabase) -> None:
    """Checkpoints the WAL and truncates it to nothing, so that no page image written before
    (an erased row's among them) survives in it: the end of an erasure. Another process
    reading meanwhile can keep frames from being dropped; they go at a later checkpoint.
    Runs in the connection's thread."""
    if not db.memory:
        db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def _close_sync(db: SqliteUtilsDatabase) -> None:
    if db.conn.in_transaction:
        db.conn.rollback()
    if not db.memory:
        with contextlib.suppress(sqlite3.Error):  # another process may hold the WAL
            db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    db.conn.close()


# The first 16 bytes of every SQLite database file.
SQLITE_HEADER = b"SQLite format 3\x00"


def inspect_file(path: Path) -> tuple[bool, bool]:
    """(the file has tables, it has mnemo's migrations), read through a read-only connection so
    that looking never changes the file (the CLI checks a path before `Memory` migrates it).

    Raises:
        StorageError: "corrupt", the file cannot be read as SQLite; "unavailable", it cannot
            be opened (a read-only folder: see `storage_error`). The driver's error is the
            cause.
    """
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {
                name
                for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            if "_sqlite_migrations" not in tables:
                return bool(tables), False
            (applied,) = conn.execute(
                "SELECT count(*) FROM _sqlite_migrations WHERE migration_set = ?",
                (MIGRATIONS.name,),
            ).fetchone()
            return True, applied > 0
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise storage_error(exc) from exc


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """`items` in slices of at most `size`: a statement's `IN (...)` list stays far below
    SQLite's limit on host parameters (32,766)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]
