"""The schema of mnemo's SQLite file, as migrations.

A migration that has been applied is never edited: add `m00N_<what>` below it instead.
"""

from __future__ import annotations

import sqlite3

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

MIGRATIONS = Migrations("mnemo")


def _execute_all(db: Database, script: str) -> None:
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
    _execute_all(
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
    _execute_all(
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
