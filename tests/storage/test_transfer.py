"""Moving a memory between stores (`mnemo.storage.transfer`): SQLite to
PostgreSQL and back, every table's rows equal, idempotent, refusing conflicts, verified."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest

import mnemo
from mnemo.storage.postgres.schema import vector_index_name
from mnemo.storage.sqlite.dump import _WITHOUT_ROWID
from mnemo.storage.transfer import (
    TABLES,
    Row,
    Table,
    TransferReport,
    open_dump,
    same_store,
    transfer,
)
from tests.fakes import FakeEmbedder
from tests.storage.filled import (
    MESSAGE_WORD,
    NODE_WORD,
    REPO,
    fill,
    nonempty_tables,
    postgres_rows,
    sqlite_rows,
)

# Not copied: each backend's bookkeeping, which process holds what, and search indexes.
# The lexical log is each store's own: the target's triggers write it as the nodes arrive.
LEXICAL = {"lexical_repos", "lexical_log", "lexical_epoch"}
# A re-embedding under way is the store's own too: it starts over on the copy.
REEMBEDDING = {"reembeds", "staged_vectors"}
SQLITE_SKIPPED = {"_sqlite_migrations", "sqlite_stat1", "store_clock", "holders", "ops",
                  "step_claims", "source_claims",
                  *LEXICAL, *REEMBEDDING}
POSTGRES_SKIPPED = {"mnemo_migrations", "holders", "ops", "step_claims", "source_claims",
                    *LEXICAL,
                    *REEMBEDDING}
HELD = {"holder", "lease_until"}  # columns of sessions
MESSAGES = next(t for t in TABLES if t.name == "messages")


@pytest.fixture
async def source(tmp_path: Path) -> Path:
    """A SQLite memory with rows in every copied table."""
    path = tmp_path / "memory.db"
    await fill(path)
    return path


async def move(src: str, dst: str, *, batch: int = 1000) -> TransferReport:
    async with open_dump(src, must_exist=True) as a, open_dump(dst, must_exist=False) as b:
        return await transfer(a, b, batch=batch)


async def test_tables_are_both_schemas_tables(tmp_path: Path, pg_url: str) -> None:
    """TABLES names every table of both schemas but bookkeeping and search, with their
    columns."""
    path = tmp_path / "empty.db"
    async with open_dump(str(path), must_exist=False):
        pass
    with sqlite3.connect(path) as conn:
        names = {name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
            " AND name NOT LIKE '%fts%'")}
        sqlite_columns = {
            name: tuple(c[1] for c in conn.execute(f"PRAGMA table_info({name})"))
            for name in names
        }
    conn.close()
    assert names - SQLITE_SKIPPED == {t.name for t in TABLES}
    with psycopg.connect(pg_url) as pg:
        rows = pg.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = 'public' AND column_name <> 'search'"
            " ORDER BY table_name, ordinal_position").fetchall()
    pg_columns: dict[str, tuple[str, ...]] = {}
    for table, column in rows:
        pg_columns[table] = (*pg_columns.get(table, ()), column)
    assert set(pg_columns) - POSTGRES_SKIPPED == {t.name for t in TABLES}
    for table in TABLES:
        assert set(pg_columns[table.name]) - HELD == set(table.names), table.name
        # SQLite's episodes keep their rowid implicit; a WITHOUT ROWID table has none.
        # SQLite keys a vector by its node's rowid, and names a link's ends by their nodes'
        # rowids (its dump reads and writes the nodes' ids and repo).
        expected = ({"node", "vec"} if table.name == "vectors"
                    else {"src", "dst", "type", "refs"} if table.name == "links"
                    else set(table.names) - {"rowid"})
        assert set(sqlite_columns[table.name]) - {"rowid"} - HELD == expected
        assert not (table.has_rowid and table.name in _WITHOUT_ROWID)


async def test_sqlite_to_postgres_copies_every_row(source: Path, pg_url: str) -> None:
    """Every table arrives with equal values; PostgreSQL's search columns, identity sequences
    and the repo's HNSW index are ready for the copied rows."""
    assert nonempty_tables(source) == {t.name for t in TABLES}
    report = await move(str(source), pg_url)
    for table in TABLES:
        assert postgres_rows(pg_url, table) == sqlite_rows(source, table), table.name
    assert {c.table: c.source for c in report.tables} == {
        t.name: len(sqlite_rows(source, t)) for t in TABLES}
    assert all(c.copied == c.source == c.target for c in report.tables)
    with psycopg.connect(pg_url) as pg:
        (found,) = pg.execute(
            "SELECT count(*) FROM nodes WHERE search @@ to_tsquery('mnemo_english', %s)",
            (NODE_WORD,)).fetchone() or (0,)
        assert found >= 1
        (top,) = pg.execute("SELECT max(rowid) FROM messages").fetchone() or (0,)
        (fresh,) = pg.execute(
            "INSERT INTO messages (id, thread_id, seq, role, text, data, tokens, recorded_at)"
            " VALUES ('new', 'x', 0, 'user', 'hi', '{}', 1, now()) RETURNING rowid"
        ).fetchone() or (0,)
        assert fresh > top
        assert pg.execute("SELECT 1 FROM pg_indexes WHERE indexname = %s",
                          (vector_index_name(REPO),)).fetchone() is not None


async def test_second_run_copies_nothing(source: Path, pg_url: str) -> None:
    """Migrating twice copies nothing the second time and verifies alike."""
    first = await move(str(source), pg_url, batch=7)
    again = await move(str(source), pg_url, batch=7)
    assert first.copied == sum(len(sqlite_rows(source, t)) for t in TABLES)
    assert again.copied == 0
    assert again.checksum == first.checksum
    assert [c.target for c in again.tables] == [c.target for c in first.tables]


async def test_postgres_back_to_sqlite_is_the_original(
    source: Path, pg_own_url: str, tmp_path: Path
) -> None:
    """SQLite -> PostgreSQL -> a new SQLite file gives the original's rows, as stored, and
    the copy's search finds nodes and messages by a word."""
    with psycopg.connect(pg_own_url, autocommit=True) as pg:
        # Times come back in the session's time zone: the copy must still hold UTC text.
        name = pg.info.dbname
        pg.execute(f"ALTER DATABASE {name} SET timezone = 'Asia/Kolkata'")
    await move(str(source), pg_own_url, batch=5)
    copy = tmp_path / "copy.db"
    report = await move(pg_own_url, str(copy), batch=5)
    assert report.copied == sum(len(sqlite_rows(source, t)) for t in TABLES)
    for table in TABLES:
        assert sqlite_rows(copy, table, raw=True) == sqlite_rows(source, table, raw=True), (
            table.name)
    async with mnemo.Memory(copy, embedder=FakeEmbedder()) as mem:
        recalled = await mem.recall(REPO, NODE_WORD)
        assert any(NODE_WORD in m.node.text for m in recalled.memories)
        hits = await mem.search_messages(MESSAGE_WORD)
        assert hits
        assert all(MESSAGE_WORD in hit.snippet for hit in hits)


async def test_sqlite_to_sqlite(source: Path, tmp_path: Path) -> None:
    """A file copied through the same path holds the same rows, and again copies nothing."""
    copy = tmp_path / "copy.db"
    await move(str(source), str(copy), batch=3)
    again = await move(str(source), str(copy))
    assert again.copied == 0
    for table in TABLES:
        assert sqlite_rows(copy, table, raw=True) == sqlite_rows(source, table, raw=True)


async def test_a_node_with_another_text_is_refused(source: Path, tmp_path: Path) -> None:
    """A node id the target holds with another text is a conflict: nothing is copied."""
    copy = tmp_path / "copy.db"
    await move(str(source), str(copy))
    with sqlite3.connect(copy) as conn:
        conn.execute("UPDATE nodes SET text = 'changed' WHERE rowid = 1")
        conn.execute("DELETE FROM threads")
    conn.close()
    with pytest.raises(mnemo.ConflictError, match="1 node id"):
        await move(str(source), str(copy))
    assert sqlite_rows(copy, next(t for t in TABLES if t.name == "threads")) == []


async def test_a_target_with_other_rows_fails_verification(source: Path, pg_url: str) -> None:
    """A target holding rows the source lacks fails the count check, naming the table."""
    with psycopg.connect(pg_url) as pg:
        pg.execute("INSERT INTO threads VALUES ('other', 0, 0, 0, now())")
    with pytest.raises(mnemo.StorageError, match="table threads") as caught:
        await move(str(source), pg_url)
    assert caught.value.reason == "mismatch"


async def test_a_missing_source_is_refused(tmp_path: Path) -> None:
    """A source that is no mnemo database is refused before anything is created."""
    with pytest.raises(mnemo.StorageError, match="no mnemo database"):
        await move(str(tmp_path / "absent.db"), str(tmp_path / "copy.db"))
    assert not (tmp_path / "absent.db").exists()
    assert not (tmp_path / "copy.db").exists()


async def test_a_postgres_database_without_mnemo_is_no_source(
    pg_empty_url: str, tmp_path: Path
) -> None:
    """A PostgreSQL database without mnemo's schema is refused as a source, left as it was."""
    with pytest.raises(mnemo.StorageError, match="no mnemo store"):
        await move(pg_empty_url, str(tmp_path / "copy.db"))
    with psycopg.connect(pg_empty_url) as pg:
        assert pg.execute("SELECT to_regclass('mnemo_migrations')").fetchone() == (None,)
    assert not (tmp_path / "copy.db").exists()


class _Interrupted(Exception):
    """The copy stopped half-way (a killed process, a lost connection)."""


async def test_an_interrupted_copy_carries_on(source: Path, pg_url: str) -> None:
    """A copy stopped after some batches leaves whole batches only; running it again copies
    the rest, and the target verifies."""
    written = 0

    async with open_dump(str(source), must_exist=True) as a, \
            open_dump(pg_url, must_exist=False) as b:
        write = b.write

        async def failing(table: Table, rows: Sequence[Row]) -> int:
            nonlocal written
            if table.name == "messages" and written:
                raise _Interrupted
            done = await write(table, rows)
            written += done if table.name == "messages" else 0
            return done

        b.write = failing
        with pytest.raises(_Interrupted):
            await transfer(a, b, batch=4)
    assert len(postgres_rows(pg_url, MESSAGES)) == 4
    report = await move(str(source), pg_url, batch=4)
    expected = sum(len(sqlite_rows(source, t)) for t in TABLES)
    assert 0 < report.copied < expected
    for table in TABLES:
        assert postgres_rows(pg_url, table) == sqlite_rows(source, table), table.name


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("postgresql://me@db.example/mem", "postgres://me@db.example/mem", True),
        ("postgresql://db.example:5432/mem", "postgresql://db.example/mem?sslmode=require", True),
        ("postgresql://me:pw@/mem?host=/run/pg", "postgres://you@/mem?host=/run/pg", True),
        ("postgresql://db.example/mem", "postgresql://db.example/other", False),
        ("postgresql://db.example/mem", "postgresql://db.example:5433/mem", False),
        ("postgresql://one.example/mem", "postgresql://two.example/mem", False),
        ("postgresql://db.example/mem", "mem.db", False),
        ("postgresql://me@db.example", "postgresql://you@db.example", False),
        ("postgresql://?service=prod", "postgresql://?service=staging", False),
        ("postgresql://?hostaddr=10.0.0.1&dbname=m", "postgresql://?hostaddr=10.0.0.2&dbname=m",
         False),
        ("postgresql://h/m?options=-csearch_path%3Da", "postgresql://h/m?options=-csearch_path%3Db",
         False),
    ],
)
def test_one_database_is_the_same_store_however_its_urls_spell_it(
    a: str, b: str, same: bool
) -> None:
    """Two URLs of one database of one server are one store (`mnemo migrate` refuses to copy
    it onto itself), whichever scheme, default port, user or other parameters they have; another
    service, address or search path is another store."""
    assert same_store(a, b) is same
    assert same_store(b, a) is same
