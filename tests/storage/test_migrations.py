"""The schema's migrations on both backends: a new store records the baseline alone, a
migration added after it is applied once however many open the store at once, and a store whose
schema is older than the baseline (made by a development build before 0.1.0) is refused with
one line, nothing of it changed."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import anyio
import psycopg
import pytest
from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

import mnemo
from mnemo.conversation.drafts import history_hash, message_key
from mnemo.graph import scope as scopes
from mnemo.storage.postgres import schema as pg_schema
from mnemo.storage.sqlite import schema as sqlite_schema
from tests.backends import BACKENDS, open_stores
from tests.conversation._support import ManualClock
from tests.fakes import FakeEmbedder

# What each backend's schema is read as: its tables and columns, indexes and triggers.
_SQLITE_SHAPE = "SELECT type, name, sql FROM sqlite_master ORDER BY type, name"
_PG_SHAPE = (
    "SELECT table_name, column_name, data_type FROM information_schema.columns"
    " WHERE table_schema = 'public' UNION ALL"
    " SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
    " UNION ALL SELECT tgname, tgrelid::regclass::text, '' FROM pg_trigger"
    " WHERE NOT tgisinternal ORDER BY 1, 2, 3"
)


@pytest.fixture(params=BACKENDS)
def made(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store with today's schema, the test's own (a PostgreSQL database, not emptied)."""
    if request.param == "sqlite":
        path = tmp_path / "memory.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return str(path)
    return str(request.getfixturevalue("pg_own_url"))


def run(store: str, *statements: str) -> list[tuple[object, ...]]:
    """Runs the statements on the store (committed) and returns the last one's rows."""
    rows: list[tuple[object, ...]] = []
    if store.startswith("postgresql"):
        with psycopg.connect(store, autocommit=True) as pg:
            for statement in statements:
                cur = pg.execute(statement)
                rows = cur.fetchall() if cur.description else []
        return rows
    conn = sqlite3.connect(store, isolation_level=None)
    try:
        for statement in statements:
            rows = conn.execute(statement).fetchall()
    finally:
        conn.close()
    return rows


def ledger(store: str) -> list[object]:
    """The names of the migrations the store records, in the order they were applied."""
    if store.startswith("postgresql"):
        return [n for (n,) in run(store, "SELECT name FROM mnemo_migrations ORDER BY applied_at")]
    return [n for (n,) in run(store, "SELECT name FROM _sqlite_migrations ORDER BY id")]


def shape(store: str) -> list[tuple[object, ...]]:
    return run(store, _PG_SHAPE if store.startswith("postgresql") else _SQLITE_SHAPE)


def baseline(store: str) -> str:
    return pg_schema.BASELINE.name if store.startswith("postgresql") else (
        sqlite_schema.BASELINE)


def registered(store: str) -> list[str]:
    """The backend's migrations, the baseline first."""
    if store.startswith("postgresql"):
        return [migration.name for migration in pg_schema.MIGRATIONS]
    return list(sqlite_schema.NAMES)


def test_a_new_store_records_the_baseline_then_each_later_migration(made: str) -> None:
    """A store made by this version holds the baseline's tables and the later columns, and
    records the baseline, then each later migration, once."""
    assert ledger(made) == registered(made)
    assert registered(made)[0] == baseline(made)
    tables = run(made, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                 if made.startswith("postgresql") else
                 "SELECT name FROM sqlite_master WHERE type = 'table'")
    assert {"nodes", "commits", "node_scopes", "lexical_epoch"} <= {t for (t,) in tables}
    assert run(made, "SELECT count(*) FROM lexical_epoch") == [(1,)]
    assert run(made, "SELECT maintenance, removed FROM commits") == []


def add_later_migration(store: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Registers, after the baseline, a migration that makes a table `later` and puts one
    row in it; returns its name."""
    if store.startswith("postgresql"):
        later = pg_schema.Migration(
            "m099_later", ("CREATE TABLE later (n integer)", "INSERT INTO later VALUES (1)"))
        monkeypatch.setattr(pg_schema, "MIGRATIONS", (*pg_schema.MIGRATIONS, later))
        return later.name
    migrations = Migrations("mnemo")
    for known in sqlite_schema.MIGRATIONS._migrations:
        migrations(name=known.name)(known.fn)

    @migrations(name="m099_later")
    def m099_later(db: Database) -> None:
        sqlite_schema.execute_all(db, "CREATE TABLE later (n INTEGER);\n"
                                      "INSERT INTO later VALUES (1);")

    monkeypatch.setattr(sqlite_schema, "MIGRATIONS", migrations)
    monkeypatch.setattr(sqlite_schema, "NAMES", [*sqlite_schema.NAMES, "m099_later"])
    return "m099_later"


async def test_a_migration_after_the_baseline_is_applied_once_by_concurrent_openers(
    made: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six stores opening a store of the baseline at once, with a migration added after it:
    all open, the migration ran once (one row), and it is recorded once, after the baseline;
    the next open applies nothing."""
    name = add_later_migration(made, monkeypatch)

    async def opener() -> None:
        async with open_stores(made, 8, lexical_dir=""):
            pass

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(opener)
    async with open_stores(made, 8, lexical_dir=""):
        pass
    assert run(made, "SELECT n FROM later") == [(1,)]
    assert ledger(made) == registered(made)
    assert ledger(made)[-1] == name


async def refusal(made: str) -> mnemo.StorageError:
    """The error a Memory opening `made` raises, checked to be one line of
    `StorageError("unavailable")` that left the store's schema and ledger as they were."""
    before = (shape(made), ledger(made))
    with pytest.raises(mnemo.StorageError) as refused:
        async with mnemo.Memory(made, embedder=FakeEmbedder()):
            pass
    assert refused.value.reason == "unavailable"
    assert "\n" not in str(refused.value)
    assert (shape(made), ledger(made)) == before
    return refused.value


async def test_a_store_older_than_the_baseline_is_refused_and_left_as_it_was(made: str) -> None:
    """A store whose recorded migrations do not reach the baseline (a development build's,
    before 0.1.0) is refused when a Memory opens it: `StorageError("unavailable")` in one line
    saying so, not a driver's error, and neither its schema nor its ledger changes."""
    table = "mnemo_migrations" if made.startswith("postgresql") else "_sqlite_migrations"
    run(made, f"DELETE FROM {table} WHERE name <> '{baseline(made)}'",
        f"UPDATE {table} SET name = 'm019_unannotated_steps'", "DROP TABLE node_scopes")
    refused = await refusal(made)
    assert "older than 0.1.0" in str(refused)
    assert refused.__cause__ is None


async def test_a_store_a_newer_mnemo_upgraded_is_refused_and_left_as_it_was(made: str) -> None:
    """A store that records a migration this version does not know (a newer mnemo applied
    it) is refused when a Memory opens it, `StorageError("unavailable")` naming the migration,
    and neither its schema nor its ledger changes: an older process must not write to a schema
    it does not know."""
    if made.startswith("postgresql"):
        run(made, "INSERT INTO mnemo_migrations (name) VALUES ('m999_future')",
            "CREATE TABLE future (n integer)")
    else:
        run(made, "INSERT INTO _sqlite_migrations (migration_set, name, applied_at)"
                  " VALUES ('mnemo', 'm999_future', '2030-01-01 00:00:00+00:00')",
            "CREATE TABLE future (n INTEGER)")
    refused = await refusal(made)
    assert "newer mnemo" in str(refused)
    assert "m999_future" in str(refused)


async def test_a_store_of_the_baseline_gets_the_maintenance_columns_its_commits_kept(
    made: str
) -> None:
    """A store of the baseline alone (0.1.0's), holding a commit, is upgraded when a Memory
    opens it: the commit reads as before, and maintenance is recorded from then on."""
    async with mnemo.Memory(made, embedder=FakeEmbedder()) as mem:
        await mem.open_repo("r")
        step = mnemo.Step("Dana lives in Lisbon.", "Note.")
        await mem.ingest("r", mnemo.Trajectory("Chat", [step]), source_id="a")
    table = "mnemo_migrations" if made.startswith("postgresql") else "_sqlite_migrations"
    run(made, f"DELETE FROM {table} WHERE name <> '{baseline(made)}'",
        "ALTER TABLE commits DROP COLUMN maintenance", "ALTER TABLE commits DROP COLUMN removed",
        "DROP TABLE source_claims")
    async with mnemo.Memory(made, embedder=FakeEmbedder()) as mem:
        [ingest] = await mem.history("r")
        assert (ingest.source_id, ingest.maintenance, ingest.removed) == ("a", None, ())
        decayed = await mem.decay("r", now=datetime(2200, 1, 1, tzinfo=UTC))
        record = (await mem.history("r"))[0]
        assert (record.maintenance, len(record.removed)) == ("decay", decayed.deleted
                                                             + decayed.pruned)
    assert ledger(made) == registered(made)


async def test_a_store_whose_scope_index_holds_long_values_whole_finds_them_by_digest(
    made: str
) -> None:
    """A store whose `node_scopes` holds a value past `MAX_INDEXED_CHARS` as it is (written
    before values were held by digest) is upgraded when a Memory opens it: `where` finds the
    node by that value, and no other."""
    long, other = "x" * 300, "x" * 299 + "y"
    async with mnemo.Memory(made, embedder=FakeEmbedder()) as mem:
        await mem.open_repo("r")
        for source, value in (("a", long), ("b", other)):
            step = mnemo.Step(f"The kettle of {source} is blue.", "Note.")
            await mem.ingest("r", mnemo.Trajectory("Chat", [step]), source_id=source,
                             metadata={"user_id": value})
    table = "mnemo_migrations" if made.startswith("postgresql") else "_sqlite_migrations"
    for value in (long, other):
        run(made, f"UPDATE node_scopes SET value = '{json.dumps(value)}'"
                  f" WHERE value = '{scopes.indexed(json.dumps(value))}'")
    run(made, f"DELETE FROM {table} WHERE name LIKE '%scope_digests'")
    assert run(made, "SELECT count(*) FROM node_scopes WHERE value LIKE 'sha256:%'") == [(0,)]
    async with mnemo.Memory(made, embedder=FakeEmbedder()) as mem:
        found = await mem.search_nodes("r", "kettle", where={"user_id": long})
        assert found
        assert all(node.metadata == {"user_id": long} for node in found)
    assert sorted(map(str, ledger(made))) == sorted(registered(made))


async def test_a_thread_hashed_with_none_keys_extends_after_the_upgrade(made: str) -> None:
    """A thread whose hash counted a None content or tool_calls as a key (written before a
    None was read as no key) takes the same history without those keys once a Memory opens it,
    and goes on; so does one whose such messages a ttl erased."""
    used = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    call: dict[str, object] = {"role": "assistant", "content": None, "refusal": None,
                               "tool_calls": [used]}
    dumped: list[dict[str, object]] = [{"role": "user", "content": "list it"}, call,
              {"role": "tool", "tool_call_id": "c1", "content": "a b"},
              {"role": "assistant", "content": "Two files.", "tool_calls": None}]
    later: dict[str, object] = {"role": "user", "content": "later"}
    clock = ManualClock()
    async with mnemo.Memory(made, embedder=FakeEmbedder()) as mem:
        await mem.conversation().save("t", dumped)
        erasing = mem.conversation(ttl=60, clock=clock)
        await erasing.save("e", dumped)
        clock.advance(seconds=120)
        await erasing.save("e", [*dumped, later])
        assert len(await erasing.raw("e")) == 1
    written = [message_key(m, 0) if len(m) == 2 else hashlib.sha256(json.dumps(
        {k: v for k, v in m.items() if k != "refusal"}, sort_keys=True).encode()).digest()
        for m in [*dumped, later]]  # role and content strings alone: not JSON
    table = "mnemo_migrations" if made.startswith("postgresql") else "_sqlite_migrations"
    run(made, f"UPDATE threads SET history_hash = '{history_hash(written[:4])}'"
              " WHERE id = 't'",
        f"UPDATE threads SET history_hash = '{history_hash(written)}' WHERE id = 'e'",
        f"DELETE FROM {table} WHERE name LIKE '%null_keys'")
    bare = [{k: v for k, v in m.items() if v is not None} for m in dumped]
    async with mnemo.Memory(made, embedder=FakeEmbedder()) as mem:
        chat = mem.conversation()
        assert [m.seq for m in await chat.save("t", [*bare, {"role": "user", "content": "ok"}])
                ] == [4]
        assert [m.seq for m in await chat.save("t", [*dumped, {"role": "user", "content": "ok"},
                                                     {"role": "user", "content": "bye"}])] == [5]
        erasing = mem.conversation(ttl=60, clock=clock)
        assert [m.seq for m in await erasing.save("e", [*bare, later, later])] == [5]
    assert sorted(map(str, ledger(made))) == sorted(registered(made))
