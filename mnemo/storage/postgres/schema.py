"""mnemo's PostgreSQL schema: SQLite's tables with PostgreSQL's types, words searched by a
generated `tsvector` column; `apply` runs `MIGRATIONS` in order under an advisory lock: a
baseline (`m020_scopes`, every table as 0.1.0 has it: the text search configuration,
`tables.py`'s tables, the lexical log's functions and triggers), then later ones. An applied
migration is never edited: a change is the next one at the end, here and in `sqlite/schema.py`
alike. `vectors.vec` is an untyped `vector` (repos differ in dimension), with one partial HNSW
index per repo on `vec::vector(dim)`, matched when a search names its repo as a literal."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import anyio
import psycopg
from psycopg import sql

from mnemo.errors import StorageError
from mnemo.graph.scope import MAX_INDEXED_CHARS
from mnemo.storage.lexical.index import LOG_KEEP
from mnemo.storage.postgres.connection import Connection, lock_key, storage_error
from mnemo.storage.postgres.text_search import SEARCH_VECTOR, TEXT_SEARCH_CONFIG
from mnemo.storage.tables import MAINTENANCE, SOURCE_CLAIMS, check_ledger, ddl, statements

SCHEMA_LOCK = lock_key("mnemo.schema")

# HNSW build parameters, pgvector's defaults (docs/DECISIONS.md); ef_search is a session
# setting (connection.HNSW_EF_SEARCH).
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64

MIN_VECTOR_VERSION = (0, 5)

_LEDGER = """CREATE TABLE IF NOT EXISTS mnemo_migrations (
    name text PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step: its name (recorded once applied) and its statements, in order."""

    name: str
    statements: tuple[str, ...]


# Words found as FTS5 finds them: a Snowball stemmer that keeps stop words, accents folded
# (`unaccent`, in its own schema, ahead of the stemmer, or of `simple` for words with digits).
_TEXT_SEARCH = (
    "CREATE TEXT SEARCH DICTIONARY mnemo_english_stem (TEMPLATE = snowball, LANGUAGE = english)",
    f"CREATE TEXT SEARCH CONFIGURATION {TEXT_SEARCH_CONFIG} (COPY = english)",
    f"ALTER TEXT SEARCH CONFIGURATION {TEXT_SEARCH_CONFIG}"
    " ALTER MAPPING FOR asciiword, asciihword, hword_asciipart WITH mnemo_english_stem",
    f"""DO $$ DECLARE place name := (SELECT n.nspname FROM pg_extension e
        JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'unaccent');
    BEGIN
        EXECUTE format('ALTER TEXT SEARCH CONFIGURATION {TEXT_SEARCH_CONFIG}'
            ' ALTER MAPPING FOR word, hword, hword_part'
            ' WITH %I.unaccent, mnemo_english_stem', place);
        EXECUTE format('ALTER TEXT SEARCH CONFIGURATION {TEXT_SEARCH_CONFIG}'
            ' ALTER MAPPING FOR numword, numhword, hword_numpart'
            ' WITH %I.unaccent, simple', place);
    END $$""",
)

# Every change of a node's text logged under a per-repo sequence in the writer's transaction
# (the locked `lexical_repos` row makes numbers commit in order); LOG_KEEP entries are kept.
_LEXICAL = (
    # Stored as written: keep it as every database holds it.
    f"""CREATE FUNCTION mnemo_lexical_log(changed_repo text, changed bigint[])
            RETURNS void LANGUAGE plpgsql AS $$
            DECLARE
                last bigint;
            BEGIN
                INSERT INTO lexical_repos AS l (repo, seq)
                    VALUES (changed_repo, cardinality(changed))
                    ON CONFLICT (repo) DO UPDATE SET seq = l.seq + cardinality(changed),
                        horizon = greatest(l.horizon, l.seq + cardinality(changed) - {LOG_KEEP})
                    RETURNING seq INTO last;
                INSERT INTO lexical_log (repo, seq, node)
                    SELECT changed_repo, last - cardinality(changed) + n.i, n.node
                    FROM unnest(changed) WITH ORDINALITY AS n(node, i);
                DELETE FROM lexical_log WHERE repo = changed_repo AND seq <= last - {LOG_KEEP};
            END $$""",
    """CREATE FUNCTION mnemo_lexical_rows() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE
                r record;
            BEGIN
                FOR r IN SELECT repo, array_agg(rowid ORDER BY rowid) AS nodes
                         FROM changed GROUP BY repo ORDER BY repo LOOP
                    PERFORM mnemo_lexical_log(r.repo, r.nodes);
                END LOOP;
                RETURN NULL;
            END $$""",
    """CREATE FUNCTION mnemo_lexical_row() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM mnemo_lexical_log(OLD.repo, ARRAY[OLD.rowid]);
                IF NEW.repo IS DISTINCT FROM OLD.repo OR NEW.rowid IS DISTINCT FROM OLD.rowid THEN
                    PERFORM mnemo_lexical_log(NEW.repo, ARRAY[NEW.rowid]);
                END IF;
                RETURN NULL;
            END $$""",
    "CREATE TRIGGER nodes_lexical_insert AFTER INSERT ON nodes"
    " REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION mnemo_lexical_rows()",
    "CREATE TRIGGER nodes_lexical_delete AFTER DELETE ON nodes"
    " REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION mnemo_lexical_rows()",
    "CREATE TRIGGER nodes_lexical_update AFTER UPDATE ON nodes FOR EACH ROW"
    " WHEN (OLD.text IS DISTINCT FROM NEW.text OR OLD.type IS DISTINCT FROM NEW.type"
    " OR OLD.id IS DISTINCT FROM NEW.id OR OLD.repo IS DISTINCT FROM NEW.repo)"
    " EXECUTE FUNCTION mnemo_lexical_row()",
)

BASELINE = Migration("m020_scopes", (
    *_TEXT_SEARCH, *statements(ddl(postgres=True).replace("SEARCH_VECTOR", SEARCH_VECTOR)),
    *_LEXICAL,
))

MIGRATIONS: tuple[Migration, ...] = (
    BASELINE, Migration("m021_maintenance", statements(ddl(True, MAINTENANCE))),
    Migration("m022_scope_digests", (
        "UPDATE node_scopes SET value = 'sha256:' || encode(sha256(convert_to(value, 'UTF8')),"
        f" 'hex') WHERE length(value) > {MAX_INDEXED_CHARS}",)),
    Migration("m023_null_keys", (
        "UPDATE threads SET history_hash = NULL WHERE id IN (SELECT thread_id FROM messages"
        " WHERE data -> 'content' = 'null' OR data -> 'tool_calls' = 'null') OR history_len >"
        " (SELECT count(*) FROM messages m WHERE m.thread_id = threads.id)",)),
    Migration("m024_source_claims", statements(ddl(True, SOURCE_CLAIMS))))


async def apply(conn: Connection, *, upgrade: bool = True) -> list[str]:
    """Creates the `vector` and `unaccent` extensions if needed and applies every pending
    migration in one transaction under the schema's advisory lock (concurrent callers all
    succeed); returns the names applied. `conn` must not be in a transaction. Raises
    `StorageError`: "extension_missing" (absent, pgvector older than 0.5, or not creatable by
    this role), "busy" past `lock_timeout`, "unavailable" for a pre-baseline schema or a newer
    mnemo's; "read_only" for an older one without `upgrade` (`tables.check_ledger`). A current
    store, and any store without `upgrade` (a look), is only read: no statement writes, so a
    read-only connection (a standby, a SELECT-only role) serves a look."""
    try:
        async with conn.transaction():
            # In the schema the tables go to (`current_schema()`), not the whole search_path.
            cur = await conn.execute("SELECT to_regclass(quote_ident(current_schema())"
                                     " || '.mnemo_migrations') IS NOT NULL")
            row = await cur.fetchone()
            done: set[str] = set()
            if row is not None and row[0]:
                cur = await conn.execute("SELECT name FROM mnemo_migrations")
                done = {str(name) for (name,) in await cur.fetchall()}
            known = {migration.name for migration in MIGRATIONS}
            check_ledger(done, known, BASELINE.name, upgrade=upgrade)
            if known <= done:
                return []
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            await _ensure_vector(conn)
            await _ensure_extension(conn, "unaccent", "the contrib module unaccent")
            await conn.execute(_LEDGER)
            cur = await conn.execute("SELECT name FROM mnemo_migrations")
            done = {str(name) for (name,) in await cur.fetchall()}
            check_ledger(done, known, BASELINE.name, upgrade=upgrade)
            pending = [migration for migration in MIGRATIONS if migration.name not in done]
            for migration in pending:
                for statement in migration.statements:
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO mnemo_migrations (name) VALUES (%s)", (migration.name,))
    except psycopg.Error as exc:
        raise storage_error(exc) from exc
    return [migration.name for migration in pending]


async def _ensure_vector(conn: Connection) -> None:
    await _ensure_extension(conn, "vector", "pgvector")
    cur = await conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
    row = await cur.fetchone()
    version = tuple(int(part) for part in str(row[0] if row else "").split(".") if part.isdigit())
    if version < MIN_VECTOR_VERSION:
        raise StorageError(
            "extension_missing",
            f"vector: pgvector {'.'.join(map(str, MIN_VECTOR_VERSION))} or newer is needed"
            f" (found {'.'.join(map(str, version))})",
        )


async def _ensure_extension(conn: Connection, name: str, package: str) -> None:
    """Creates the extension `name` unless present (`package`: what a server lacks)."""
    cur = await conn.execute("SELECT 1 FROM pg_extension WHERE extname = %s", (name,))
    if await cur.fetchone() is not None:
        return
    cur = await conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = %s", (name,))
    if await cur.fetchone() is None:
        raise StorageError(
            "extension_missing", f"{name}: {package} is not installed on the PostgreSQL server"
        )
    try:
        async with conn.transaction():  # a savepoint: a refusal leaves the rest usable
            await conn.execute(sql.SQL("CREATE EXTENSION IF NOT EXISTS {}").format(
                sql.Identifier(name)))
    except psycopg.errors.InsufficientPrivilege as exc:
        raise StorageError(
            "extension_missing",
            f"{name}: this role may not create it; a superuser must run"
            f" `CREATE EXTENSION {name}` in this database once (for a trusted extension,"
            " such as unaccent, granting this role CREATE on the database is enough)",
        ) from exc


def vector_index_name(repo: str) -> str:
    """The name of `repo`'s HNSW index: a digest (identifiers are at most 63 bytes)."""
    return "vectors_hnsw_" + hashlib.sha256(repo.encode()).hexdigest()[:24]


async def ensure_vector_index(conn: Connection, repo: str, dim: int) -> None:
    """Creates `repo`'s cosine HNSW index on `vec::vector(dim)` unless it exists, under the
    schema lock. `conn` must not be in a transaction. Raises `StorageError` as `apply`."""
    statement = _vector_index(repo, dim, concurrently=False)
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            if await _index_valid(conn, repo) is False:
                # A concurrent build (`build_vector_index`) cut short left it: never used.
                await conn.execute(sql.SQL("DROP INDEX {}").format(
                    sql.Identifier(vector_index_name(repo))))
            await conn.execute(statement)
    except psycopg.Error as exc:
        raise storage_error(exc) from exc


async def build_vector_index(conn: Connection, repo: str, dim: int) -> None:
    """`ensure_vector_index` by `CREATE INDEX CONCURRENTLY` (commits go on), after dropping an
    invalid leftover; waits for locks without limit. Raises `StorageError`."""
    name = sql.Identifier(vector_index_name(repo))
    try:
        valid = await _index_valid(conn, repo)
        if valid:
            return
        await conn.execute("SET lock_timeout = 0")
        try:
            if valid is False:
                await conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(name))
            await conn.execute(_vector_index(repo, dim, concurrently=True))
        finally:
            with anyio.CancelScope(shield=True):
                await conn.execute("RESET lock_timeout")
    except psycopg.Error as exc:
        raise storage_error(exc) from exc


async def _index_valid(conn: Connection, repo: str) -> bool | None:
    """Whether `repo`'s HNSW index can be used (None: there is none)."""
    cur = await conn.execute(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace",
        (vector_index_name(repo),),
    )
    row = await cur.fetchone()
    return None if row is None else bool(row[0])


def _vector_index(repo: str, dim: int, *, concurrently: bool) -> sql.Composed:
    if dim <= 0:
        raise ValueError(f"dim must be positive, got {dim}")
    return sql.SQL(
        "CREATE INDEX {how} IF NOT EXISTS {name} ON vectors"
        " USING hnsw ((vec::vector({dim})) vector_cosine_ops)"
        " WITH (m = {m}, ef_construction = {ef})"
        " WHERE repo = {repo}"
    ).format(
        how=sql.SQL("CONCURRENTLY" if concurrently else ""),
        name=sql.Identifier(vector_index_name(repo)),
        dim=sql.Literal(dim),
        m=sql.Literal(HNSW_M),
        ef=sql.Literal(HNSW_EF_CONSTRUCTION),
        repo=sql.Literal(repo),
    )
