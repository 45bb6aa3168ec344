"""`Postgres`, the connection owner: libpq URLs, session settings, errors as StorageError."""

from __future__ import annotations

import tempfile

import psycopg
import pytest
from anyio.lowlevel import checkpoint
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import mnemo
from mnemo import StorageError
from mnemo.storage.postgres import connection
from mnemo.storage.postgres.connection import HNSW_EF_SEARCH, Postgres, storage_error


def _socket_url(pg_url: str) -> str:
    """The same database as a `postgresql://user@/db?host=/socket/dir` URL."""
    params = conninfo_to_dict(pg_url)
    return f"postgresql://{params['user']}@/{params['dbname']}?host={params['host']}"


async def test_opens_a_socket_url_and_applies_session_settings(pg_url: str) -> None:
    """A `?host=/dir` URL connects; lock_timeout comes from busy_timeout; own options stay;
    no read starts parallel workers (their start costs more than mnemo's small reads)."""
    url = _socket_url(pg_url) + "&options=-c%20work_mem%3D7MB"
    async with Postgres(url, busy_timeout=0.25) as pg, pg.connection() as conn:
        cur = await conn.execute(
            "SELECT current_setting('lock_timeout'), current_setting('work_mem'),"
            " current_setting('statement_timeout'), current_setting('hnsw.ef_search'),"
            " current_setting('application_name'),"
            " current_setting('max_parallel_workers_per_gather')"
        )
        assert await cur.fetchone() == (
            "250ms", "7MB", "0", str(HNSW_EF_SEARCH), "mnemo", "0"
        )


async def test_a_held_lock_past_busy_timeout_is_busy(pg_url: str) -> None:
    """A writer that waits longer than busy_timeout for a row lock gets StorageError("busy").
    Both connections are made when the pool opens: made on demand, the second one could
    take longer than the 0.1 s pool timeout on a busy machine, which failed the test with a
    `PoolTimeout` before any lock was waited for."""
    async with Postgres(pg_url, busy_timeout=0.1, min_size=2, max_size=2) as pg:
        async with pg.connection() as setup:
            await setup.execute(
                "INSERT INTO threads VALUES ('t', 0, 0, 0, now())")
        async with pg.transaction() as holder:
            await holder.execute("SELECT * FROM threads WHERE id = 't' FOR UPDATE")
            with pytest.raises(StorageError) as caught:
                async with pg.transaction() as other:
                    await other.execute("UPDATE threads SET next_seq = 1 WHERE id = 't'")
    assert caught.value.reason == "busy"
    assert isinstance(caught.value.__cause__, psycopg.errors.LockNotAvailable)


async def test_a_failed_transaction_writes_nothing(pg_url: str) -> None:
    """An error inside `transaction()` rolls back its earlier statements and is a StorageError."""
    async with Postgres(pg_url) as pg:

        async def insert_twice() -> None:
            async with pg.transaction() as conn:
                await conn.execute("INSERT INTO threads VALUES ('a', 0, 0, 0, now())")
                await conn.execute("INSERT INTO threads VALUES ('a', 0, 0, 0, now())")

        with pytest.raises(StorageError) as caught:
            await insert_twice()
        async with pg.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM threads")
            assert await cur.fetchone() == (0,)
    assert caught.value.reason == "unavailable"
    assert isinstance(caught.value.__cause__, psycopg.errors.UniqueViolation)


async def test_statement_timeout_is_busy(pg_url: str) -> None:
    """A statement past its statement_timeout ends as StorageError("busy")."""
    async with Postgres(pg_url, statement_timeout=0.05) as pg:
        with pytest.raises(StorageError) as caught:
            async with pg.connection() as conn:
                await conn.execute("SELECT pg_sleep(5)")
    assert caught.value.reason == "busy"


async def test_an_exhausted_pool_is_busy(pg_url: str) -> None:
    """With every connection taken for longer than busy_timeout, a caller gets "busy"."""
    async with Postgres(pg_url, busy_timeout=0.1, min_size=1, max_size=1) as pg:
        async with pg.connection():
            with pytest.raises(StorageError) as caught:
                async with pg.connection():
                    pass
    assert caught.value.reason == "busy"


async def test_a_server_refusing_connections_is_unavailable(pg_url: str) -> None:
    """Once the server refuses new connections (here its database stops allowing them and
    the pool's are ended, as a restart does), every call is "unavailable", not "busy": the
    pool still counted the connections it was remaking, and that read as every connection
    taken. Once it takes them again, the next call gets one at once, though the pool waits
    seconds before it tries again (that wait was "busy")."""
    async with Postgres(pg_url, busy_timeout=0.3, min_size=1, max_size=2) as pg:
        async with pg.connection() as conn:
            await conn.execute("SELECT 1")
        # Another database's session: none may disallow connections to its own.
        with psycopg.connect(make_conninfo(pg_url, dbname="postgres"), autocommit=True) as admin:
            name = conninfo_to_dict(pg_url)["dbname"]
            database = sql.Identifier(str(name))
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(database))
            try:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                              " WHERE datname = %s", (name,))
                reasons = []
                for _ in range(4):
                    with pytest.raises(StorageError) as caught:
                        async with pg.connection() as conn:
                            await conn.execute("SELECT 1")
                    reasons.append(caught.value.reason)
            finally:
                admin.execute(
                    sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(database)
                )
        for _ in range(4):
            async with pg.connection() as conn:
                await conn.execute("SELECT 1")
    assert reasons == ["unavailable"] * 4


async def test_no_server_is_unavailable() -> None:
    """A URL whose server is not there fails to open with StorageError("unavailable")."""
    with tempfile.TemporaryDirectory() as nowhere:
        url = make_conninfo("", host=nowhere, dbname="mnemo", user="me")
        with pytest.raises(StorageError) as caught:
            async with Postgres(url, connect_timeout=0.3):
                pass
    assert caught.value.reason == "unavailable"


async def test_missing_vector_type_is_extension_missing(pg_empty_url: str) -> None:
    """Using `vector` in a database without pgvector is StorageError("extension_missing")."""
    async with Postgres(pg_empty_url) as pg:
        with pytest.raises(StorageError) as caught:
            async with pg.connection() as conn:
                await conn.execute("SELECT '[1,2]'::vector")
    assert caught.value.reason == "extension_missing"


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (psycopg.errors.SerializationFailure, "busy"),
        (psycopg.errors.DeadlockDetected, "busy"),
        (psycopg.errors.LockNotAvailable, "busy"),
        (psycopg.errors.QueryCanceled, "busy"),
        (psycopg.errors.AdminShutdown, "unavailable"),
        (psycopg.OperationalError, "unavailable"),
    ],
)
def test_driver_errors_map_to_reasons(error: type[psycopg.Error], reason: str) -> None:
    """Each class of driver error becomes its StorageError reason, with itself as the cause."""
    exc = error("boom")
    mapped = storage_error(exc)
    assert mapped.reason == reason
    assert mapped.__cause__ is exc


@pytest.mark.parametrize(
    "url", ["postgresql://[bad", "postgresql://me@/db?host=/tmp&bogus_option=1"]
)
async def test_a_url_libpq_cannot_read_is_a_storage_error(url: str) -> None:
    """A URL libpq cannot parse is StorageError("unavailable") (psycopg's ProgrammingError
    escaped from the Memory's constructor)."""
    with pytest.raises(mnemo.StorageError) as caught:
        async with mnemo.Memory(url):
            pass
    assert caught.value.reason == "unavailable"


async def _end_every_session(url: str) -> int:
    """Ends every other connection to the database, as a server restart does (each gets
    the server's goodbye and a closed socket), and returns once they are gone."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000))"
            " FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def test_connections_the_server_ended_are_replaced_before_use(pg_url: str) -> None:
    """After the server ended every connection of a Memory (as its restart does), the next
    reads and writes succeed at once: a pooled connection whose server went away is
    replaced before use, and so is the lexical index's own, instead of the first call
    failing on it."""
    trajectory = mnemo.Trajectory(
        "learn the garden", [mnemo.Step("the garden gate is green", "note it")]
    )
    async with mnemo.Memory(pg_url, config=mnemo.Config(max_text_chars=5000)) as mem:
        await mem.open_repo("r")
        await mem.ingest("r", trajectory, source_id="s1")
        assert (await mem.recall("r", "garden gate")).memories
        assert await _end_every_session(pg_url) >= 2
        assert await mem.list_repos() == ["r"]
        assert (await mem.recall("r", "garden gate")).memories
        await mem.ingest("r", mnemo.Trajectory("learn more", [mnemo.Step("a red door", "note")]),
                         source_id="s2")
        assert await _end_every_session(pg_url) >= 1
        assert await mem.forget("r", "s2") > 0


async def test_a_fetch_lets_the_loop_run_between_its_slices(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fetch_all` converts its rows `SLICE_ROWS` at a time (the driver decodes them on the
    event loop) and lets the loop run after a slice once the fetch has held it
    `SLICE_SECONDS`: with no time allowed, after every slice; the rows are all there, in
    order."""
    yields = 0
    async def counted() -> None:
        nonlocal yields
        yields += 1
        await checkpoint()

    monkeypatch.setattr(connection, "SLICE_SECONDS", -1.0)
    monkeypatch.setattr(connection, "checkpoint", counted)
    async with Postgres(pg_url) as pg:
        rows = await pg.fetch_all("SELECT g, repeat('x', 100) FROM generate_series(1, 200) g")
    assert [row[0] for row in rows] == list(range(1, 201))
    assert yields == -(-200 // connection.SLICE_ROWS)
