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
    # Which holder is extracting which uncommitted steps of an auto-commit session (a
    # boundary's background commit, a flush, a close): another Memory leaves them to it
    # instead of asking the model about them again. A claim lasts while its holder lives.
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
    # SQLite 3.40's `PRAGMA integrity_check` reads a WITHOUT ROWID table's NOT NULL column
    # that is declared before a key column at the wrong place, and reported "NULL value in
    # links.repo" for every link (no row is NULL). The key's columns come first now.
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
    # A commit's record (its node ids and links as JSON, about 1 KB for an ingest) was longer
    # than a WITHOUT ROWID row keeps in its page (about 1,000 bytes of a 4 KB page), so each
    # spilled into an overflow page of its own, mostly empty: 4.7 KB a record at 10,000
    # ingests. An ordinary table keeps rows of up to 4 KB in their page, and its rows, in
    # rowid order, fill their pages (keyed by the random changeset id, WITHOUT ROWID pages
    # were a fifth empty and the index by seq held the id: 0.1 KB an ingest more). Its lists
    # are packed now (`rows.pack_text`: about 200 bytes).
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
    # A node's vector as float16 (`rows.half_blob`), keyed by its node's rowid: 768 bytes for
    # 384 dimensions instead of 1,536 and five rows to a 4 KB page instead of two, with no
    # index beside the table (the node's id and repo are the node's; measured: 10.6 KB of
    # vectors and their indexes per ingested message at 10,000, five vectors each). In
    # memory the vectors are float32 as before (`rows.vector_of_half`).
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
    # A changeset's receipt (its node ids as JSON), packed as new ones are (`rows.pack_text`:
    # 300 -> 150 bytes an ingest's).
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
    # What a repo's models learned of their servers (a structured mode refused, how many
    # requests one serves at once): the next Memory starts from it. IF NOT EXISTS: a store
    # written by a development build holds the table under an earlier migration's name.
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
    # A link names its ends by their nodes' rowids, not their ids (about 40 characters each,
    # held twice: in the table and in links_by_dst), and no longer holds a repo (its ends'):
    # an ingest's seven links took 1.56 KB, now 0.33 (2,000 ingests). Recall's hop reads the
    # other end's id and type from the node's row, found by rowid, so the (id, type) index goes;
    # nodes_by_type drops created_at, which no query reads through it (its entries end with
    # the rowid, the order every read by type asks for). A link whose end is no node (written
    # with foreign keys off) is not carried over.
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
    # A repo's vectors can be made again with another embedder (`Memory.reembed`): each node's
    # new vector is staged beside its old one, then one transaction puts the staged vectors in
    # place and records the embedder. `vectors_generation` counts those switches, so that
    # whatever holds the repo's vectors in memory (any process's) knows they were replaced;
    # `reembeds` holds the re-embedding under way (its embedder, its dimension, and the node
    # log's sequence it has seen every change up to).
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
    # (`conversation.drafts.history_hash`): a save checks that its history extends the stored
    # one without reading the stored messages. Unknown (NULL) for a thread saved before: its
    # next save compares the stored messages one by one, then records the hash.
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
    # reading at one moment of the host's current boot, read by every process that opens the
    # file, so that leases and heartbeats are stamped and judged on a clock no wall clock
    # step moves.
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
    # A fact or instruction committed again joins the node that holds it (mnemo.graph.shares):
    # `owners` lists the contributions of a node that several commits are evidence for; a link
    # counts the commits that made it, so that withdrawing one leaves what another made; a
    # commit names the nodes it joined, and a revert is a record of its own (`reverts`) that
    # the reverted one names (`reverted_by`).
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
    # A step is stored before it is annotated (its trajectory_id empty until then): the steps
    # still waiting for their annotation, which another Memory takes over when their holder
    # is gone (`Coordination.unannotated`), are found without reading every step.
    execute_all(
        db,
        "CREATE INDEX steps_unannotated ON steps(session_id) WHERE trajectory_id = '';",
    )


@MIGRATIONS()
def m028_scopes(db: Database) -> None:
    # Who a memory belongs to (`mnemo.graph.scope`): a node's, a session's and a message's
    # metadata as sorted JSON (NULL: none), and each node's (key, value) pairs in an index that
    # a `where` reads, so that a filtered recall or search reads its scope, never the repo.
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
