"""The schema of mnemo's SQLite file: a baseline (`m028_scopes`, every table as 0.1.0 has it:
`tables.py`'s, FTS5 indexes, the lexical log's triggers), then later migrations, applied by
sqlite-utils' `Migrations`. An applied migration is never edited: a change is the next
`m0NN_<what>`."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from mnemo.graph.scope import MAX_INDEXED_CHARS, indexed
from mnemo.storage.lexical.index import LOG_KEEP
from mnemo.storage.tables import MAINTENANCE, SOURCE_CLAIMS, check_ledger, ddl

MIGRATIONS = Migrations("mnemo")
BASELINE = "m028_scopes"
# The registered migrations' names, in order (the ledger check needs them).
NAMES: list[str] = []


Migration = Callable[[Database], None]


def migration(name: str) -> Callable[[Migration], Migration]:
    """Registers a migration with `MIGRATIONS` under `name`."""
    NAMES.append(name)
    return MIGRATIONS(name=name)


def migrate(db: Database, *, upgrade: bool = True) -> None:
    """Applies the pending migrations in one IMMEDIATE transaction (a second process waits,
    then finds nothing pending). Raises `StorageError` as `tables.check_ledger`, whose
    `upgrade` it takes."""
    if _pending(db, upgrade):
        with db.atomic():
            if _pending(db, upgrade):
                MIGRATIONS.apply(db)


def _pending(db: Database, upgrade: bool) -> bool:
    """Whether a registered migration is not applied yet, the ledger read once and checked."""
    applied = {done.name for done in MIGRATIONS.applied(db)}
    check_ledger(applied, set(NAMES), BASELINE, upgrade=upgrade)
    return bool(set(NAMES) - applied)


def execute_all(db: Database, script: str) -> None:
    # Statement by statement: executescript() would COMMIT.
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            db.execute(pending)
            pending = ""
    if pending.strip():
        db.execute(pending)


@migration(BASELINE)
def baseline(db: Database) -> None:
    execute_all(db, ddl(postgres=False) + _searched("nodes") + _searched("messages") + _LEXICAL)
    # Planner statistics of the graph tables' usual shape, so reads by id seek rather than
    # scan until a real ANALYZE; `ANALYZE sqlite_schema` creates and reloads the table.
    db.execute("ANALYZE sqlite_schema")
    db.conn.executemany(
        "INSERT INTO sqlite_stat1(tbl, idx, stat) VALUES (?, ?, ?)",
        [
            ("nodes", "sqlite_autoindex_nodes_1", "1000000 1"),
            ("nodes", "nodes_by_key", "100000 100000 20000 1"),
            ("nodes", "nodes_by_source", "1000000 1000000 10"),
            ("nodes", "nodes_by_type", "1000000 1000000 150000"),
            ("links", "links", "3000000 5 2 1"),
            ("links", "links_by_dst", "3000000 5 3"),
        ],
    )
    db.execute("ANALYZE sqlite_schema")


@migration("m029_maintenance")
def maintenance(db: Database) -> None:
    execute_all(db, ddl(False, MAINTENANCE))


@migration("m030_scope_digests")
def scope_digests(db: Database) -> None:
    db.conn.create_function("mnemo_indexed", 1, indexed, deterministic=True)
    db.execute("UPDATE node_scopes SET value = mnemo_indexed(value)"
               f" WHERE length(value) > {MAX_INDEXED_CHARS}")


@migration("m031_null_keys")
def null_keys(db: Database) -> None:
    # A message key reads a None content or tool_calls as no key: the hash of a thread that
    # holds one, or held messages a ttl erased, is unknown until its next save
    # (`ThreadState.history_hash`).
    db.execute("UPDATE threads SET history_hash = NULL WHERE id IN (SELECT thread_id FROM"
               " messages WHERE json_type(data, '$.content') = 'null'"
               " OR json_type(data, '$.tool_calls') = 'null') OR history_len >"
               " (SELECT count(*) FROM messages m WHERE m.thread_id = threads.id)")


@migration("m032_source_claims")
def source_claims(db: Database) -> None:
    execute_all(db, ddl(False, SOURCE_CLAIMS))


def _searched(table: str) -> str:
    """`table`'s FTS5 index of its `text` (external content: the rows' own), kept by triggers."""
    index = f"{table}_fts"
    delete = f"INSERT INTO {index}({index}, rowid, text) VALUES ('delete', old.rowid, old.text);"
    insert = f"INSERT INTO {index}(rowid, text) VALUES (new.rowid, new.text);"
    return f"""
CREATE VIRTUAL TABLE {index} USING fts5(
    text, content='{table}', content_rowid='rowid', tokenize='porter unicode61'
);
CREATE TRIGGER {index}_insert AFTER INSERT ON {table} BEGIN {insert} END;
CREATE TRIGGER {index}_delete AFTER DELETE ON {table} BEGIN {delete} END;
CREATE TRIGGER {index}_update AFTER UPDATE OF text ON {table} BEGIN {delete} {insert} END;
"""


def _logged(row: str) -> str:
    """A trigger's statements that log a change of `row` ("new" or "old") in its repo."""
    return f"""\
    INSERT INTO lexical_repos (repo, seq) VALUES ({row}.repo, 1)
        ON CONFLICT (repo) DO UPDATE
        SET seq = seq + 1, horizon = max(horizon, seq + 1 - {LOG_KEEP});
    INSERT INTO lexical_log (repo, seq, node)
        SELECT {row}.repo, seq, {row}.rowid FROM lexical_repos WHERE repo = {row}.repo;
    DELETE FROM lexical_log WHERE repo = {row}.repo
        AND seq = (SELECT seq - {LOG_KEEP} FROM lexical_repos WHERE repo = {row}.repo);"""


_LEXICAL = f"""
CREATE TRIGGER nodes_lexical_insert AFTER INSERT ON nodes BEGIN
{_logged("new")}
END;
CREATE TRIGGER nodes_lexical_delete AFTER DELETE ON nodes BEGIN
{_logged("old")}
END;
CREATE TRIGGER nodes_lexical_update AFTER UPDATE OF text, type, id, repo ON nodes BEGIN
{_logged("old")}
{_logged("new")}
END;
"""
