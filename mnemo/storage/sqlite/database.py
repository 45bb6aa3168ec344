"""`Database`: the one owner of mnemo's SQLite connection, used only from its worker thread.
A transaction takes the write lock when it begins (`BEGIN IMMEDIATE`), waiting at most
`busy_timeout`; SQLite's errors become `StorageError` ("busy", "unavailable", "corrupt") with
nothing of the failed transaction written. WAL with `synchronous=NORMAL` is durable against a
killed process, "FULL" also against power loss."""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import time
from collections.abc import AsyncGenerator, Callable, Generator, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import anyio
from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.cpu import Queued, Worker
from mnemo.errors import StorageError
from mnemo.graph.model import now_utc
from mnemo.storage.clock import elapsed
from mnemo.storage.row import Row
from mnemo.storage.sql import Work as StatementsWork, drive
from mnemo.storage.sqlite.schema import MIGRATIONS, migrate

T = TypeVar("T")

Work = Callable[[SqliteUtilsDatabase], T]

WAL_SIZE_LIMIT = 16 * 1024 * 1024

_BUSY_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
_CORRUPT_CODES = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}

# Not the global generator, which is the application's.
_JITTER = random.Random()


class _Connection(SqliteUtilsDatabase):
    """sqlite-utils' `Database` whose outermost `atomic()` takes the write lock up front and
    commits only while the file opened (`opened`: its path, device and inode) is still there."""

    opened: tuple[str, int, int] | None = None

    @contextlib.contextmanager
    def atomic(self) -> Generator[SqliteUtilsDatabase, None, None]:
        if self.conn.in_transaction:
            with super().atomic() as db:  # a savepoint inside the running transaction
                yield db
            return
        # A deferred BEGIN could fail with SQLITE_BUSY_SNAPSHOT; IMMEDIATE waits instead.
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self
            self.still_there()
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.rollback()
            raise

    def still_there(self) -> None:
        """`_Gone` when the file opened was removed or replaced: SQLite would write on into the
        unlinked file, which nothing reads again."""
        if self.opened is None:
            return
        path, device, inode = self.opened
        try:
            now = os.stat(path)
        except OSError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (device, inode):
            raise _Gone(
                f"the database file {path} was removed or replaced while open: nothing more can"
                " be stored in it (open it again)")


class _Gone(sqlite3.OperationalError):
    """The file a connection opened was removed or replaced ("unavailable", whatever its path
    says)."""


def storage_error(exc: sqlite3.Error) -> StorageError:
    """The `StorageError` ("busy", "corrupt", else "unavailable") for a driver error, its cause."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    note = ""
    if not isinstance(exc, _Gone) and (
            primary in _BUSY_CODES or "locked" in str(exc) or "busy" in str(exc)):
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
    def __init__(
        self,
        path: str | Path = ":memory:",
        *,
        synchronous: str = "NORMAL",
        busy_timeout: float = 5.0,
        inspect: bool = False,
    ) -> None:
        """`inspect`: the file is only looked at: never upgraded (`schema.migrate`), its clock
        anchor and holders left as they are, no checkpoint of its own at close (SQLite's, as
        the last connection, may still fold the WAL into the file). `synchronous`: as
        `Memory` checked it."""
        self.path = str(path)
        self._synchronous = synchronous
        self.busy_timeout = max(busy_timeout, 0.0)
        self.inspect = inspect
        self._db: _Connection | None = None
        self._worker: Worker | None = None
        self.clock = HostClock()  # the store's time, anchored in the file when it opens
        self._scrub_due = False  # an erasure's rewrite of the file (`scrub`) still to do

    @property
    def db(self) -> _Connection:
        if self._db is None:
            raise StorageError("closed", "the database is not open")
        return self._db

    async def open(self) -> None:
        self._worker = Worker(f"mnemo-db:{Path(self.path).name}")
        try:
            await self._call(self._open_sync)
        except BaseException as exc:
            self._worker.stop()
            self._worker = None
            if isinstance(exc, StorageError) and self.path not in str(exc):
                detail = str(exc).removeprefix(f"{exc.reason}: ")
                raise StorageError(exc.reason, f"{self.path}: {detail}") from exc.__cause__
            raise

    def _open_sync(self) -> None:
        # Autocommit: every transaction is opened by `atomic()`.
        if self.inspect and self.path != ":memory:" and not os.path.exists(self.path):
            raise StorageError("read_only", f"no store at {self.path}, and a look makes none")
        # A look never creates the file (`mode=rw`, should it go meanwhile).
        target = (self.path if self.path == ":memory:"
                  else file_uri(self.path) + ("?mode=rw" if self.inspect else ""))
        conn = sqlite3.connect(target, check_same_thread=False, isolation_level=None, uri=True)
        try:
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
            db = _Connection(conn, execute_plugins=False)
            if self.path != ":memory:":
                path = os.path.abspath(self.path)  # what was opened, whatever the cwd becomes
                try:
                    opened = os.stat(path)
                except OSError as exc:
                    raise sqlite3.OperationalError(f"unable to open database file: {exc}") from exc
                db.opened = (path, opened.st_dev, opened.st_ino)
            deadline = time.monotonic() + self.busy_timeout
            while True:
                try:
                    self._set_up(db)
                    break
                except sqlite3.OperationalError as exc:
                    # Switching to WAL can be refused without the busy handler's wait.
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
        # Erasure: freed pages are zeroed.
        conn.execute("PRAGMA secure_delete=ON")
        migrate(db, upgrade=not self.inspect)
        self.clock.anchor(db, write=not self.inspect)

    async def close(self) -> None:
        if self._worker is None:
            return
        worker, self._worker = self._worker, None
        db, self._db = self._db, None
        try:
            if db is not None:
                with anyio.CancelScope(shield=True):
                    await worker.call(lambda: _close_sync(db, checkpoint=not self.inspect,
                                                          rewrite=self._scrub_due))
        except sqlite3.Error as exc:
            raise storage_error(exc) from exc
        finally:
            worker.stop()

    async def scrub(self, *, erased: bool = True) -> None:
        """After an erasure's transaction (`erased`), or while an earlier one's is due: rewrites
        the file and empties its WAL (`scrub`). One that fails (another process held the write
        lock past `busy_timeout`) stays due, for the next erasure or the close, and says so."""
        self._scrub_due = self._scrub_due or erased
        if not self._scrub_due:
            return
        try:
            await self.run(scrub)
        except StorageError as exc:
            raise StorageError(exc.reason, "the erasure is stored but the file is not rewritten"
                               f" yet (the next erasure or the close does it): {exc}") from exc
        self._scrub_due = False

    async def run(self, work: Work[T]) -> T:
        """Runs `work(db)` alone on the connection; raises `StorageError` (its transaction
        rolled back)."""
        return await self._call(_alone(self.db, work))

    async def read(self, work: StatementsWork[T]) -> T:
        """Runs `work` (`storage.sql`) outside a transaction."""
        return await self.run(lambda db: drive(work(SqliteStatements(db.conn))))

    together = read

    async def write(self, work: StatementsWork[T]) -> T:
        return await self.run(lambda db: _within(db.atomic(), db, work))

    one = write

    async def side_write(self, work: StatementsWork[T]) -> T:
        return await self.run(lambda db: _within(side_write(db), db, work))

    def post(self, work: Work[object], failed: Callable[[StorageError], object]) -> None:
        """Queues `work(db)`, run in call order (a later read sees its writes); a failure,
        rolled back, goes to `failed` in the thread. Raises `StorageError("closed")`."""
        alone = _alone(self.db, work)

        def job() -> None:
            try:
                alone()
            except sqlite3.Error as exc:
                failed(storage_error(exc))

        self._running().post(job)

    def start(self, work: Work[T]) -> Queued[T]:
        """Queues `work(db)` as `run` does and returns at once (it runs even if never
        awaited). Raises `StorageError("closed")`."""
        return Queued(self._running().start(_alone(self.db, work)), _translated)

    async def _call(self, fn: Callable[[], T]) -> T:
        queued = Queued(self._running().start(fn), _translated)
        with anyio.CancelScope(shield=True):
            result = await queued.result()
        return result

    def _running(self) -> Worker:
        if self._worker is None:
            raise StorageError("closed", "the database is not open")
        return self._worker


def _alone(db: _Connection, work: Work[T]) -> Callable[[], T]:
    """`work(db)` as a job; a transaction it leaves open is rolled back. Its answer is refused
    (`_Gone`) when the file was removed or replaced meanwhile: it may be the old file's."""

    def job() -> T:
        try:
            answer = work(db)
        finally:
            if db.conn.in_transaction:
                db.conn.rollback()
        db.still_there()
        return answer

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


class HostClock:
    """The store's time on SQLite: the anchor's wall time (`store_clock`, written by the first
    opener after boot) plus the boot clock elapsed since, the same in every process and never
    stepped by the wall clock. A new boot anchors again and forgets the old holders."""

    def __init__(self) -> None:
        self._anchor: tuple[datetime, float] | None = None

    def now(self) -> datetime:
        if self._anchor is None:
            return now_utc()
        wall, at = self._anchor
        return wall + timedelta(seconds=elapsed() - at)

    def anchor(self, db: SqliteUtilsDatabase, *, write: bool = True) -> None:
        """Reads the file's anchor, or (if of another boot) writes one, forgetting holders; with
        `write` false, keeps that new anchor to itself."""
        try:
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            boot = ""  # the kernel tells none
        row = _anchor_of(db)
        if not _this_boot(row, boot):
            row = (boot, now_utc().isoformat(timespec="microseconds"), elapsed())
            if write:
                row = _written(db, boot, row)
        assert row is not None
        self._anchor = (datetime.fromisoformat(str(row[1])), float(row[2]))


def _written(db: SqliteUtilsDatabase, boot: str, fresh: tuple[Any, ...]) -> tuple[Any, ...]:
    """The file's anchor of this boot: one another process wrote meanwhile, else `fresh`,
    written in place of the old one (its holders forgotten)."""
    with db.atomic():
        row = _anchor_of(db)
        if row is not None and _this_boot(row, boot):
            return row
        db.conn.execute("DELETE FROM store_clock")
        db.conn.execute("INSERT INTO store_clock(boot, wall, at) VALUES (?, ?, ?)", fresh)
        db.conn.execute("DELETE FROM holders")
    return fresh


def _anchor_of(db: SqliteUtilsDatabase) -> tuple[Any, ...] | None:
    row = db.conn.execute("SELECT boot, wall, at FROM store_clock").fetchone()
    return None if row is None else tuple(row)


def _this_boot(row: tuple[Any, ...] | None, boot: str) -> bool:
    return row is not None and row[0] == boot and elapsed() >= float(row[2])


def _translated(exc: BaseException) -> BaseException:
    return storage_error(exc) if isinstance(exc, sqlite3.Error) else exc


# A read's side write holds up the connection while it waits for the write lock.
SIDE_WRITE_WAIT = 0.1


@contextlib.contextmanager
def side_write(db: SqliteUtilsDatabase) -> Iterator[None]:
    """One `atomic` transaction waiting at most `SIDE_WRITE_WAIT` for the write lock (else
    sqlite3.OperationalError, "busy" once `run` translates it)."""
    conn = db.conn
    (before,) = conn.execute("PRAGMA busy_timeout").fetchone()
    conn.execute(f"PRAGMA busy_timeout={min(int(SIDE_WRITE_WAIT * 1000), int(before))}")
    try:
        with db.atomic():
            yield
    finally:
        conn.execute(f"PRAGMA busy_timeout={int(before)}")


def scrub(db: SqliteUtilsDatabase) -> None:
    """After an erasure: rewrites the file (`VACUUM`) and empties the WAL. `secure_delete`
    zeroes a deleted cell, but a page SQLite rebuilt keeps old images of the rows it moved in
    its unused space; only a rewrite leaves none."""
    if not db.memory:
        db.conn.execute("VACUUM")
    truncate_wal(db)


def truncate_wal(db: SqliteUtilsDatabase) -> None:
    """Checkpoints and empties the WAL, so no erased row's page image survives in it (frames a
    reader holds go at a later checkpoint)."""
    if not db.memory:
        db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def _close_sync(db: SqliteUtilsDatabase, *, checkpoint: bool, rewrite: bool = False) -> None:
    if db.conn.in_transaction:
        db.conn.rollback()
    with contextlib.suppress(sqlite3.Error):  # another process may hold the WAL
        if rewrite:
            scrub(db)
        elif checkpoint:
            truncate_wal(db)
    db.conn.close()


SQLITE_HEADER = b"SQLite format 3\x00"


def file_uri(path: str | Path, *, read_only: bool = False) -> str:
    """The URI SQLite opens the file at `path` by (so "file:a.db" is the file of that name)."""
    uri = Path(path).resolve().as_uri()
    return f"{uri}?mode=ro" if read_only else uri


def inspect_file(path: Path) -> tuple[bool, bool]:
    """(the file has tables, it has mnemo's migrations), read without changing the file.
    Raises `StorageError` ("corrupt", "unavailable")."""
    try:
        with contextlib.closing(
                sqlite3.connect(file_uri(path, read_only=True), uri=True)) as conn:
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
    except sqlite3.Error as exc:
        raise storage_error(exc) from exc
