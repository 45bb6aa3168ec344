"""The schema's migrations from m016 on (`schema.py` holds m001 to m015, and `MIGRATIONS`
itself): import `MIGRATIONS` from here, so that every migration is registered, in order.

A migration that has been applied is never edited: add `m0NN_<what>` below it instead.
"""

from __future__ import annotations

from sqlite_utils import Database

from mnemo.storage.sqlite.rows import half_of_blob, pack_text, unpack_text
from mnemo.storage.sqlite.schema import MIGRATIONS, execute_all

__all__ = ["MIGRATIONS"]


@MIGRATIONS()
def m016_step_claims(db: Database) -> None:
    # Which holder is extracting which uncommitted steps of an auto-commit session (another
    # Memory leaves them to it); a claim lasts while its holder lives.
    execute_all(
        db,
        """
        CREATE TABLE step_claims (
            step_id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            holder TEXT NOT NULL
        ) WITHOUT ROWID;
        CREATE INDEX step_claims_by_holder ON step_claims(holder);
        CREATE INDEX step_claims_by_session ON step_claims(session_id);
        """,
    )


@MIGRATIONS()
def m017_links_key_first(db: Database) -> None:
    # A WITHOUT ROWID table's key columns first (SQLite 3.40's `integrity_check` misreads a
    # NOT NULL column declared before them).
    execute_all(
        db,
        """
        CREATE TABLE links_keyed (
            src TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
            dst TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
            type TEXT NOT NULL,
            repo TEXT NOT NULL,
            PRIMARY KEY (src, dst, type)
        ) WITHOUT ROWID;
        INSERT INTO links_keyed (src, dst, type, repo) SELECT src, dst, type, repo FROM links;
        DROP TABLE links;
        ALTER TABLE links_keyed RENAME TO links;
        CREATE INDEX links_by_dst ON links(dst, type);
        """,
    )
    _guessed_statistics(db, [
        ("links", "sqlite_autoindex_links_1", "3000000 5 2 1"),
        ("links", "links_by_dst", "3000000 5 3"),
    ])


@MIGRATIONS()
def m018_commits_packed(db: Database) -> None:
    # Commit records in an ordinary table (a record fits its page; rows fill their pages in
    # rowid order), their node and link lists packed (`rows.pack_text`).
    db.conn.create_function("mnemo_pack", 1, _packed, deterministic=True)
    execute_all(
        db,
        """
        CREATE TABLE commits_rows (
            id TEXT PRIMARY KEY,
            repo TEXT NOT NULL,
            seq INTEGER NOT NULL,
            committed_at TEXT NOT NULL,
            session_id TEXT,
            source_id TEXT,
            nodes TEXT NOT NULL,
            links TEXT NOT NULL,
            retired TEXT NOT NULL,
            reworded TEXT NOT NULL
        );
        INSERT INTO commits_rows SELECT id, repo, seq, committed_at, session_id, source_id,
            mnemo_pack(nodes), mnemo_pack(links), retired, reworded FROM commits
            ORDER BY repo, seq;
        DROP TABLE commits;
        ALTER TABLE commits_rows RENAME TO commits;
        CREATE UNIQUE INDEX commits_by_repo ON commits(repo, seq);
        CREATE INDEX commits_by_session ON commits(session_id) WHERE session_id IS NOT NULL;
        """,
    )


@MIGRATIONS()
def m019_half_vectors(db: Database) -> None:
    # A node's vector as float16 (`rows.half_blob`), keyed by its node's rowid, with no index
    # beside the table; float32 in memory (`rows.vector_of_half`).
    db.conn.create_function("mnemo_half", 1, half_of_blob, deterministic=True)
    execute_all(
        db,
        """
        CREATE TABLE vectors_half (
            node INTEGER PRIMARY KEY REFERENCES nodes(rowid) ON DELETE CASCADE,
            vec BLOB NOT NULL
        );
        INSERT INTO vectors_half (node, vec)
            SELECT n.rowid, mnemo_half(v.vec) FROM vectors v JOIN nodes n ON n.id = v.node_id;
        DROP TABLE vectors;
        ALTER TABLE vectors_half RENAME TO vectors;
        """,
    )


@MIGRATIONS()
def m020_receipts_packed(db: Database) -> None:
    # A changeset's receipt packed (`rows.pack_text`).
    db.conn.create_function("mnemo_pack", 1, _packed, deterministic=True)
    db.execute("UPDATE applied_changesets SET receipt = mnemo_pack(receipt)"
               " WHERE typeof(receipt) = 'text'")


def _packed(text: str | bytes) -> bytes:
    return pack_text(unpack_text(text))


def _guessed_statistics(db: Database, rows: list[tuple[str, str, str]]) -> None:
    """The planner's statistics of a table made again (dropping the old one dropped its
    rows): m006's guesses, loaded at once."""
    db.conn.executemany("INSERT INTO sqlite_stat1(tbl, idx, stat) VALUES (?, ?, ?)", rows)
    db.execute("ANALYZE sqlite_schema")


@MIGRATIONS()
def m021_server_profiles(db: Database) -> None:
    # What a repo's models learned of their servers (the next Memory starts from it). IF NOT
    # EXISTS: a development build's store may hold the table already.
    execute_all(
        db,
        """
        CREATE TABLE IF NOT EXISTS server_profiles (
            repo TEXT NOT NULL,
            model TEXT NOT NULL,
            profile TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (repo, model)
        );
        """,
    )


@MIGRATIONS()
def m022_links_by_rowid(db: Database) -> None:
    # A link names its ends by their nodes' rowids and holds no repo (its ends'); the (id,
    # type) index goes and nodes_by_type ends with the rowid, the order every read by type
    # asks for. A link whose end is no node (written with foreign keys off) is dropped.
    execute_all(
        db,
        """
        CREATE TABLE links_rows (
            src INTEGER NOT NULL REFERENCES nodes(rowid) ON DELETE CASCADE,
            dst INTEGER NOT NULL REFERENCES nodes(rowid) ON DELETE CASCADE,
            type TEXT NOT NULL,
            PRIMARY KEY (src, dst, type)
        ) WITHOUT ROWID;
        INSERT INTO links_rows (src, dst, type)
            SELECT a.rowid, b.rowid, l.type FROM links l
            JOIN nodes a ON a.id = l.src JOIN nodes b ON b.id = l.dst
            ORDER BY 1, 2, 3;
        DROP TABLE links;
        ALTER TABLE links_rows RENAME TO links;
        CREATE INDEX links_by_dst ON links(dst, type);
        DROP INDEX nodes_id_type;
        DROP INDEX nodes_by_type;
        CREATE INDEX nodes_by_type ON nodes(repo, type);
        """,
    )
    _guessed_statistics(db, [
        ("links", "links", "3000000 5 2 1"),
        ("links", "links_by_dst", "3000000 5 3"),
        ("nodes", "nodes_by_type", "1000000 1000000 150000"),
    ])


@MIGRATIONS()
def m023_reembedding(db: Database) -> None:
    # Re-embedding (`Memory.reembed`): the new vectors staged beside the old, the count of
    # switches (`vectors_generation`, which tells the vectors in memory they were replaced),
    # and the re-embedding under way (embedder, dimension, the node log's sequence seen).
    execute_all(
        db,
        """
        ALTER TABLE repos ADD COLUMN vectors_generation INTEGER NOT NULL DEFAULT 0;
        CREATE TABLE reembeds (
            repo TEXT PRIMARY KEY,
            embedder TEXT NOT NULL,
            dim INTEGER NOT NULL,
            seq INTEGER NOT NULL,
            started_at TEXT NOT NULL
        );
        CREATE TABLE staged_vectors (
            node INTEGER PRIMARY KEY REFERENCES nodes(rowid) ON DELETE CASCADE,
            vec BLOB NOT NULL
        );
        """,
    )


@MIGRATIONS()
def m024_thread_history_hash(db: Database) -> None:
    # The hash of the history a thread's messages were saved from
    # (`conversation.drafts.history_hash`; NULL: unknown, the next save compares messages).
    execute_all(
        db,
        """
        ALTER TABLE threads ADD COLUMN history_hash TEXT;
        UPDATE threads SET history_hash = '' WHERE history_len = 0;
        """,
    )


@MIGRATIONS()
def m025_store_clock(db: Database) -> None:
    # The store's time (`sqlite.database.HostClock`): the wall time and the boot time clock's
    # reading at one moment of the host's boot, shared by every process that opens the file.
    execute_all(
        db,
        """
        CREATE TABLE store_clock (
            boot TEXT NOT NULL,
            wall TEXT NOT NULL,
            at REAL NOT NULL
        );
        """,
    )


@MIGRATIONS()
def m026_shared_knowledge(db: Database) -> None:
    # Knowledge several commits are evidence for (`owners`, mnemo.graph.shares), links counted
    # by the commits that made them, the nodes a commit joined, and reverts recorded.
    execute_all(
        db,
        """
        ALTER TABLE nodes ADD COLUMN owners TEXT;
        ALTER TABLE links ADD COLUMN refs INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE commits ADD COLUMN joined TEXT NOT NULL DEFAULT '[]';
        ALTER TABLE commits ADD COLUMN reverted_by TEXT;
        ALTER TABLE commits ADD COLUMN reverts TEXT;
        """,
    )


@MIGRATIONS()
def m027_unannotated_steps(db: Database) -> None:
    # The steps waiting for their annotation (trajectory_id empty until then), found without
    # reading every step (`Coordination.unannotated`).
    execute_all(
        db,
        "CREATE INDEX steps_unannotated ON steps(session_id) WHERE trajectory_id = '';",
    )


@MIGRATIONS()
def m028_scopes(db: Database) -> None:
    # Who a memory belongs to (`mnemo.graph.scope`): metadata as sorted JSON (NULL: none),
    # and each node's (key, value) pairs in an index that a `where` reads.
    execute_all(
        db,
        """
        ALTER TABLE nodes ADD COLUMN metadata TEXT;
        ALTER TABLE sessions ADD COLUMN metadata TEXT;
        ALTER TABLE messages ADD COLUMN metadata TEXT;
        CREATE TABLE node_scopes (
            repo TEXT NOT NULL,
            key TEXT NOT NULL,
            value TEXT NOT NULL,
            node INTEGER NOT NULL REFERENCES nodes(rowid) ON DELETE CASCADE,
            PRIMARY KEY (repo, key, value, node)
        ) WITHOUT ROWID;
        CREATE INDEX node_scopes_by_node ON node_scopes(node);
        """,
    )
