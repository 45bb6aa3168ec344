"""`Database`: the one owner of mnemo's SQLite connection.

Every statement goes through `run` (in a worker thread) or `run_inline` (on the event loop
thread), both under one `CapacityLimiter(1)`, so the connection is never used by two threads
at once and a multi-statement write is never interleaved with another.

Why two paths: a hop to a worker thread costs about 120 µs here, ten times a durable
single-row insert (about 12 µs in WAL mode). Appends are the hot path, so their small writes
run inline; anything that scans, writes many rows or may wait on the disk (commits, recall,
restore, checkpoints) runs in the thread. See BENCHMARKS.md.

Durability: WAL with `synchronous=NORMAL` makes a commit durable against a killed process,
which is mnemo's promise; `synchronous="FULL"` also survives power loss, at an fsync a commit.

Checkpoints: SQLite's automatic checkpoint would run inside whichever write crosses the
threshold, on the event loop for an inline write, for 1.5 to 16 ms (BENCHMARKS.md). It is turned
off; `maintain` checkpoints from a second connection in a worker thread instead, which does not
hold up the writer.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread
from anyio.abc import TaskStatus
from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.ports import slot
from mnemo.storage.schema import MIGRATIONS

T = TypeVar("T")

CHECKPOINT_EVERY = 500

Work = Callable[[SqliteUtilsDatabase], T]


class Database:
    """The SQLite file (or `:memory:`) behind every store, with its one connection."""

    def __init__(self, path: str | Path = ":memory:", *, synchronous: str = "NORMAL") -> None:
        if synchronous.upper() not in {"NORMAL", "FULL", "EXTRA"}:
            raise ValueError(f"synchronous must be NORMAL, FULL or EXTRA, got {synchronous!r}")
        self.path = str(path)
        self._synchronous = synchronous.upper()
        self._slot = anyio.CapacityLimiter(1)
        self._db: SqliteUtilsDatabase | None = None
        self._checkpointer: sqlite3.Connection | None = None
        self._writes = 0
        self._checkpoint_due = anyio.Event()

    @property
    def db(self) -> SqliteUtilsDatabase:
        if self._db is None:
            raise RuntimeError("the database is not open")
        return self._db

    async def open(self) -> None:
        """Connects, enables WAL and applies pending migrations."""
        await anyio.to_thread.run_sync(self._open_sync, limiter=self._slot)

    def _open_sync(self) -> None:
        conn = sqlite3.connect(self.path, check_same_thread=False)
        db = SqliteUtilsDatabase(conn, execute_plugins=False)
        if self.path != ":memory:":
            db.enable_wal()
            conn.execute("PRAGMA wal_autocheckpoint=0")
            self._checkpointer = sqlite3.connect(self.path, check_same_thread=False)
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=5000")
        MIGRATIONS.apply(db)
        self._db = db

    async def close(self) -> None:
        if self._db is None:
            return
        db, self._db = self._db, None
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._close_sync, db, limiter=self._slot)

    def _close_sync(self, db: SqliteUtilsDatabase) -> None:
        if db.conn.in_transaction:
            db.conn.rollback()
        if not db.memory:
            db.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        db.conn.close()
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None

    async def run(self, work: Work[T]) -> T:
        """Runs `work(db)` in a worker thread, alone on the connection."""
        db = self.db
        self._wrote()
        return await anyio.to_thread.run_sync(work, db, limiter=self._slot)

    async def run_inline(self, work: Work[T]) -> T:
        """Runs a small `work(db)` on the event loop thread, alone on the connection.

        Only for statements that touch a handful of rows by key (see the module docstring).
        """
        db = self.db
        self._wrote()
        async with slot(self._slot):
            return work(db)

    def _wrote(self) -> None:
        # Counts calls, not pages: about one WAL frame each, so a checkpoint every
        # CHECKPOINT_EVERY calls keeps the WAL near SQLite's default 1000-page threshold.
        self._writes += 1
        if self._writes >= CHECKPOINT_EVERY:
            self._checkpoint_due.set()

    async def maintain(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Checkpoints the WAL whenever enough writes piled up; runs until cancelled."""
        task_status.started()
        while self._checkpointer is not None:
            await self._checkpoint_due.wait()
            self._checkpoint_due = anyio.Event()
            self._writes = 0
            await self.checkpoint()

    async def checkpoint(self) -> None:
        """Moves the WAL into the database file (PASSIVE: never blocks the writer)."""
        conn = self._checkpointer
        if conn is not None:
            await anyio.to_thread.run_sync(
                lambda: conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            )
