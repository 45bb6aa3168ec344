"""The schema of mnemo's SQLite file, as migrations.

A migration that has been applied is never edited: add the next one in `migrations.py`, which
holds the migrations from m017 on; import `MIGRATIONS` from there, where every one is
registered.
"""

from __future__ import annotations

import sqlite3

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from mnemo.storage.lexical import LOG_KEEP

MIGRATIONS = Migrations("mnemo")


def execute_all(db: Database, script: str) -> None:
    # executescript() would COMMIT the migration's transaction, so run statement by statement;
    # complete_statement() keeps a trigger's body, semicolons and all, in one statement.
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            db.execute(pending)
            pending = ""
    if pending.strip():
        db.execute(pending)


@MIGRATIONS()
def m001_sessions(db: Database) -> None:
    execute_all(
        db,
        """
        CREATE TABLE repos (
            name TEXT PRIMARY KEY,
            config TEXT NOT NULL,
            dim INTEGER NOT NULL,
            embedder TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            repo TEXT NOT NULL REFERENCES repos(name),
            state TEXT NOT NULL,
            config TEXT NOT NULL,
            episode_id TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            ended INTEGER NOT NULL DEFAULT 0
        );
        CREATE INDEX sessions_live ON sessions(ended, repo);
        CREATE TABLE episodes (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id),
            goal TEXT NOT NULL,
            status TEXT NOT NULL,
            started_at TEXT NOT NULL,
            closed_at TEXT
        );
        CREATE INDEX episodes_by_session ON episodes(session_id, started_at);
        CREATE TABLE steps (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            episode_id TEXT NOT NULL REFERENCES episodes(id),
            idx INTEGER NOT NULL,
            trajectory_id TEXT NOT NULL,
            observation TEXT NOT NULL,
            action TEXT NOT NULL,
            state_summary TEXT NOT NULL,
            subgoal TEXT NOT NULL,
            subgoal_vec BLOB NOT NULL,
            reward REAL,
            metadata TEXT,
            committed_in TEXT,
            recorded_at TEXT NOT NULL,
            UNIQUE (episode_id, idx)
        );
        CREATE TABLE changesets (
            id TEXT PRIMARY KEY,
            repo TEXT NOT NULL,
            session_id TEXT,
            episode_id TEXT,
            payload TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE INDEX changesets_by_session ON changesets(session_id);
        """,
    )


@MIGRATIONS()
def m002_graph(db: Database) -> None:
    execute_all(
        db,
        """
        CREATE TABLE nodes (
            rowid INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            repo TEXT NOT NULL,
            type TEXT NOT NULL,
            text TEXT NOT NULL,
            data TEXT NOT NULL,
            key TEXT,
            source_id TEXT,
            created_at TEXT NOT NULL,
            access_count INTEGER NOT NULL DEFAULT 0,
            last_access TEXT
        );
        CREATE INDEX nodes_by_type ON nodes(repo, type, created_at);
        CREATE UNIQUE INDEX nodes_by_key ON nodes(repo, type, key) WHERE key IS NOT NULL;
        CREATE INDEX nodes_by_source ON nodes(repo, source_id) WHERE source_id IS NOT NULL;
        CREATE TABLE links (
            repo TEXT NOT NULL,
            src TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
            dst TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
            type TEXT NOT NULL,
            PRIMARY KEY (src, dst, type)
        ) WITHOUT ROWID;
        CREATE INDEX links_by_dst ON links(dst, type);
        CREATE TABLE vectors (
            node_id TEXT PRIMARY KEY REFERENCES nodes(id) ON DELETE CASCADE,
            repo TEXT NOT NULL,
            vec BLOB NOT NULL
        );
        CREATE INDEX vectors_by_repo ON vectors(repo);
        CREATE TABLE applied_changesets (
            id TEXT PRIMARY KEY,
            repo TEXT NOT NULL,
            receipt TEXT NOT NULL,
            applied_at TEXT NOT NULL
        );
        CREATE VIRTUAL TABLE nodes_fts USING fts5(
            text, content='nodes', content_rowid='rowid', tokenize='porter unicode61'
        );
        CREATE TRIGGER nodes_fts_insert AFTER INSERT ON nodes BEGIN
            INSERT INTO nodes_fts(rowid, text) VALUES (new.rowid, new.text);
        END;
        CREATE TRIGGER nodes_fts_delete AFTER DELETE ON nodes BEGIN
            INSERT INTO nodes_fts(nodes_fts, rowid, text) VALUES ('delete', old.rowid, old.text);
        END;
        CREATE TRIGGER nodes_fts_update AFTER UPDATE OF text ON nodes BEGIN
            INSERT INTO nodes_fts(nodes_fts, rowid, text) VALUES ('delete', old.rowid, old.text);
            INSERT INTO nodes_fts(rowid, text) VALUES (new.rowid, new.text);
        END;
        """,
    )


@MIGRATIONS()
def m003_conversation(db: Database) -> None:
    # Conversation memory. `threads.next_seq` is the per-thread counter that makes a
    # seq never reused, even after TTL expiry or `clear`; `history_len` is how much of the
    # caller's history is stored (`clear` resets it, the counter goes on). Message rows are
    # never updated; `text` is what search indexes (content plus tool calls) and `content`
    # is NULL when it equals `text`, so the common case stores the words once.
    execute_all(
        db,
        """
        CREATE TABLE threads (
            id TEXT PRIMARY KEY,
            next_seq INTEGER NOT NULL,
            history_len INTEGER NOT NULL,
            boundary_seq INTEGER NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE TABLE messages (
            rowid INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            thread_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            text TEXT NOT NULL,
            content TEXT,
            data TEXT NOT NULL,
            tokens INTEGER NOT NULL,
            recorded_at TEXT NOT NULL,
            UNIQUE (thread_id, seq)
        );
        CREATE INDEX messages_by_time ON messages(thread_id, recorded_at);
        CREATE TABLE message_vectors (
            message_id TEXT PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
            thread_id TEXT NOT NULL,
            vec BLOB NOT NULL
        );
        CREATE INDEX message_vectors_by_thread ON message_vectors(thread_id);
        CREATE TABLE compactions (
            thread_id TEXT NOT NULL,
            start_seq INTEGER NOT NULL,
            end_seq INTEGER NOT NULL,
            summary_text TEXT NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (thread_id, start_seq)
        ) WITHOUT ROWID;
        CREATE TABLE snapshots (
            rowid INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            thread_id TEXT NOT NULL,
            level INTEGER NOT NULL,
            start_seq INTEGER NOT NULL,
            end_seq INTEGER NOT NULL,
            text TEXT NOT NULL,
            covered_by TEXT,
            created_at TEXT NOT NULL
        );
        CREATE INDEX snapshots_by_thread ON snapshots(thread_id, level, start_seq);
        CREATE TABLE goals (
            id TEXT PRIMARY KEY,
            thread_id TEXT NOT NULL,
            description TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at TEXT NOT NULL,
            completed_at TEXT
        );
        CREATE INDEX goals_by_thread ON goals(thread_id, status);
        CREATE TABLE pins (
            message_id TEXT NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            goal_id TEXT NOT NULL REFERENCES goals(id) ON DELETE CASCADE,
            thread_id TEXT NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (message_id, goal_id)
        ) WITHOUT ROWID;
        CREATE INDEX pins_by_thread ON pins(thread_id);
        CREATE INDEX pins_by_goal ON pins(goal_id);
        CREATE VIRTUAL TABLE messages_fts USING fts5(
            text, content='messages', content_rowid='rowid', tokenize='porter unicode61'
        );
        CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
            INSERT INTO messages_fts(rowid, text) VALUES (new.rowid, new.text);
        END;
        CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, text)
                VALUES ('delete', old.rowid, old.text);
        END;
        CREATE TRIGGER messages_fts_update AFTER UPDATE OF text ON messages BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, text)
                VALUES ('delete', old.rowid, old.text);
            INSERT INTO messages_fts(rowid, text) VALUES (new.rowid, new.text);
        END;
        """,
    )


@MIGRATIONS()
def m004_ingests(db: Database) -> None:
    execute_all(
        db,
        """
        CREATE TABLE ingests (
            repo TEXT NOT NULL,
            source_id TEXT NOT NULL,
            payload_hash TEXT NOT NULL,
            changeset_id TEXT NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (repo, source_id)
        ) WITHOUT ROWID;
        """,
    )


@MIGRATIONS()
def m005_consolidation_marks(db: Database) -> None:
    # `consolidate` compares only the SEMANTIC nodes not yet compared with the rest (a mark,
    # not a rowid watermark: SQLite reuses the largest rowid after a delete).
    execute_all(
        db,
        """
        ALTER TABLE nodes ADD COLUMN consolidated INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX nodes_unconsolidated ON nodes(repo)
            WHERE type = 'semantic' AND consolidated = 0;
        """,
    )


@MIGRATIONS()
def m006_planner_statistics(db: Database) -> None:
    # The planner's statistics of the graph tables' usual shape (one repo holding most rows, a
    # type a seventh, ids unique, a few links per node), so that a read of nodes by id seeks
    # them rather than scan the repo; a later ANALYZE replaces them. `ANALYZE sqlite_schema`
    # creates the table, and again loads the rows.
    db.execute("ANALYZE sqlite_schema")
    db.conn.executemany(
        "INSERT INTO sqlite_stat1(tbl, idx, stat) VALUES (?, ?, ?)",
        [
            ("nodes", "sqlite_autoindex_nodes_1", "1000000 1"),
            ("nodes", "nodes_by_type", "1000000 1000000 150000 2"),
            ("nodes", "nodes_by_key", "100000 100000 20000 1"),
            ("nodes", "nodes_by_source", "1000000 1000000 10"),
            ("links", "sqlite_autoindex_links_1", "3000000 5 2 1"),
            ("links", "links_by_dst", "3000000 5 3"),
            ("vectors", "sqlite_autoindex_vectors_1", "1000000 1"),
            ("vectors", "vectors_by_repo", "1000000 1000000"),
        ],
    )
    db.execute("ANALYZE sqlite_schema")


@MIGRATIONS()
def m007_session_model(db: Database) -> None:
    # The model an extraction started with: work is resumed only by a Memory
    # whose model for the repo is that one, never by one that merely reads.
    db.execute("ALTER TABLE sessions ADD COLUMN model TEXT")


@MIGRATIONS()
def m008_repo_models(db: Database) -> None:
    # A repo records the URI of its LLM, so that a Memory opened without models runs the
    # repo's (NULL: the opening Memory's defaults).
    db.execute("ALTER TABLE repos ADD COLUMN llm TEXT")


@MIGRATIONS()
def m009_task_results(db: Database) -> None:
    # Each extraction task's validated reply, kept with its open episode so that a retry, a
    # reopened store or a takeover asks only what failed; deleted when the
    # episode is committed or discarded.
    execute_all(
        db,
        """
        CREATE TABLE task_results (
            episode_id TEXT NOT NULL,
            trajectory_id TEXT NOT NULL,
            task TEXT NOT NULL,
            digest TEXT NOT NULL,
            reply TEXT NOT NULL,
            cost TEXT NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (episode_id, trajectory_id, task, digest)
        ) WITHOUT ROWID;
        """,
    )


@MIGRATIONS()
def m010_many_processes(db: Database) -> None:
    # Several Memory objects (processes) on one store. Each open Memory is a
    # holder with a heartbeat; a session row carries a version that every transition
    # compares and sets, and the holder (and lease) of the background work it is in.
    execute_all(
        db,
        """
        ALTER TABLE sessions ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE sessions ADD COLUMN holder TEXT;
        ALTER TABLE sessions ADD COLUMN lease_until TEXT;
        CREATE INDEX sessions_by_holder ON sessions(holder) WHERE holder IS NOT NULL;
        CREATE TABLE holders (
            id TEXT PRIMARY KEY,
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,
            started_at TEXT NOT NULL,
            seen_at TEXT NOT NULL
        ) WITHOUT ROWID;
        """,
    )


@MIGRATIONS()
def m011_stored_operations(db: Database) -> None:
    # An async operation accepted while another Memory holds the session's work is stored with
    # the session: whoever ends that work runs it, and the result waits here for the
    # Memory that accepted it, which calls back.
    execute_all(
        db,
        """
        CREATE TABLE ops (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            args TEXT NOT NULL,
            accepted_by TEXT NOT NULL,
            created_at TEXT NOT NULL,
            taken_by TEXT,
            result TEXT
        ) WITHOUT ROWID;
        CREATE INDEX ops_by_session ON ops(session_id, created_at);
        """,
    )



@MIGRATIONS()
def m012_lexical_log(db: Database) -> None:
    # Every change of a node's text logged (rowids, never text) under a per-repo sequence in
    # the writer's own transaction, for the lexical index (`mnemo.storage.lexical`). The log
    # keeps a repo's last LOG_KEEP entries (`horizon`); an index further behind rebuilds.
    execute_all(
        db,
        """
        CREATE TABLE lexical_repos (
            repo TEXT PRIMARY KEY,
            seq INTEGER NOT NULL,
            horizon INTEGER NOT NULL DEFAULT 0
        ) WITHOUT ROWID;
        CREATE TABLE lexical_log (
            repo TEXT NOT NULL,
            seq INTEGER NOT NULL,
            node INTEGER NOT NULL,
            PRIMARY KEY (repo, seq)
        ) WITHOUT ROWID;
        CREATE TABLE lexical_epoch (epoch TEXT NOT NULL);
        INSERT INTO lexical_epoch VALUES (lower(hex(randomblob(16))));
        INSERT INTO lexical_repos (repo, seq, horizon) SELECT DISTINCT repo, 1, 1 FROM nodes;
        CREATE TRIGGER nodes_lexical_insert AFTER INSERT ON nodes BEGIN
{new}
        END;
        CREATE TRIGGER nodes_lexical_delete AFTER DELETE ON nodes BEGIN
{old}
        END;
        CREATE TRIGGER nodes_lexical_update AFTER UPDATE OF text, type, id, repo ON nodes BEGIN
{old}
{new}
        END;
        """.format(new=_logged("new"), old=_logged("old")),
    )


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


@MIGRATIONS()
def m013_commit_history(db: Database) -> None:
    # Every applied changeset is a commit one can list, diff and revert. A record
    # holds ids and counts, never text, so that erasing a node erases it from history too.
    # `seq` orders a repo's commits (they take the repo's lock, so max + 1 is unique).
    # The four times make SEMANTIC and PROCEDURAL facts bi-temporal: when the fact held in the
    # world (valid_from, valid_to) and when mnemo learned and retired it.
    execute_all(
        db,
        """
        CREATE TABLE commits (
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
        ) WITHOUT ROWID;
        CREATE UNIQUE INDEX commits_by_repo ON commits(repo, seq);
        ALTER TABLE nodes ADD COLUMN valid_from TEXT;
        ALTER TABLE nodes ADD COLUMN valid_to TEXT;
        ALTER TABLE nodes ADD COLUMN recorded_at TEXT;
        ALTER TABLE nodes ADD COLUMN retired_at TEXT;
        UPDATE nodes SET recorded_at = created_at WHERE type IN ('semantic', 'procedural');
        """,
    )


@MIGRATIONS()
def m014_node_types(db: Database) -> None:
    # Recall's hop reads each link with the types of both its ends, from this index.
    execute_all(db, "CREATE INDEX nodes_id_type ON nodes(id, type);")


@MIGRATIONS()
def m015_session_activity(db: Database) -> None:
    # When a session was last used, through any Memory (the auto-commit timers).
    execute_all(
        db,
        """
        ALTER TABLE sessions ADD COLUMN active_at TEXT;
        UPDATE sessions SET active_at = updated_at;
        """,
    )
