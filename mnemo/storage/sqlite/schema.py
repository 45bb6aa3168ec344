"""The schema of mnemo's SQLite file: a baseline (`m028_scopes`, every table as 0.1.0 has it),
then later migrations, applied by sqlite-utils' `Migrations`. An applied migration is never
edited: a change is the next `m0NN_<what>`."""

from __future__ import annotations

import sqlite3

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from mnemo.errors import StorageError
from mnemo.storage.lexical import LOG_KEEP

MIGRATIONS = Migrations("mnemo")
BASELINE = "m028_scopes"
# Why a store whose schema is older than the baseline is refused (as PostgreSQL says it).
PRE_RELEASE = ("the store was made by a development build of mnemo older than 0.1.0, whose"
               " schema this version does not upgrade: start a new store")


def migrate(db: Database) -> None:
    """Applies the pending migrations in one IMMEDIATE transaction (a second process waits,
    then finds nothing pending). Raises `StorageError("unavailable")` for a pre-baseline store."""
    if not MIGRATIONS.pending(db):
        return
    with db.atomic():
        applied = {migration.name for migration in MIGRATIONS.applied(db)}
        if applied and BASELINE not in applied:
            raise StorageError("unavailable", PRE_RELEASE)
        MIGRATIONS.apply(db)


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


@MIGRATIONS(name=BASELINE)
def baseline(db: Database) -> None:
    execute_all(db, _SESSIONS + _GRAPH + _searched("nodes") + _CONVERSATION
                + _searched("messages") + _WORK + _LEXICAL + _HISTORY)
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


# Repos, sessions and their work. `model`: the model an extraction started with (only a
# Memory with that model resumes it); `version`, compared and set by every transition;
# `active_at` drives the auto-commit timers. A repo counts its re-embeddings (`generation`).
_SESSIONS = """
CREATE TABLE repos (
    name TEXT PRIMARY KEY,
    config TEXT NOT NULL,
    dim INTEGER NOT NULL,
    embedder TEXT NOT NULL,
    created_at TEXT NOT NULL,
    llm TEXT,
    vectors_generation INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    repo TEXT NOT NULL REFERENCES repos(name),
    state TEXT NOT NULL,
    config TEXT NOT NULL,
    episode_id TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    ended INTEGER NOT NULL DEFAULT 0,
    model TEXT,
    version INTEGER NOT NULL DEFAULT 0,
    holder TEXT,
    lease_until TEXT,
    active_at TEXT,
    metadata TEXT
);
CREATE INDEX sessions_live ON sessions(ended, repo);
CREATE INDEX sessions_by_holder ON sessions(holder) WHERE holder IS NOT NULL;
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
CREATE INDEX steps_unannotated ON steps(session_id) WHERE trajectory_id = '';
CREATE TABLE changesets (
    id TEXT PRIMARY KEY,
    repo TEXT NOT NULL,
    session_id TEXT,
    episode_id TEXT,
    payload TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX changesets_by_session ON changesets(session_id);
CREATE TABLE ingests (
    repo TEXT NOT NULL,
    source_id TEXT NOT NULL,
    payload_hash TEXT NOT NULL,
    changeset_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (repo, source_id)
) WITHOUT ROWID;
"""

# The knowledge graph. `consolidated` is a mark, not a rowid watermark (SQLite reuses the
# largest rowid); the four times make facts bi-temporal; `owners`, the commits a shared node is
# evidence for; `metadata` is indexed in `node_scopes`. Links name their ends by rowid and count
# the commits that made them; vectors are float16 by node rowid.
_GRAPH = """
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
    last_access TEXT,
    consolidated INTEGER NOT NULL DEFAULT 0,
    valid_from TEXT,
    valid_to TEXT,
    recorded_at TEXT,
    retired_at TEXT,
    owners TEXT,
    metadata TEXT
);
CREATE UNIQUE INDEX nodes_by_key ON nodes(repo, type, key) WHERE key IS NOT NULL;
CREATE INDEX nodes_by_source ON nodes(repo, source_id) WHERE source_id IS NOT NULL;
CREATE INDEX nodes_unconsolidated ON nodes(repo) WHERE type = 'semantic' AND consolidated = 0;
CREATE INDEX nodes_by_type ON nodes(repo, type);
CREATE TABLE links (
    src INTEGER NOT NULL REFERENCES nodes(rowid) ON DELETE CASCADE,
    dst INTEGER NOT NULL REFERENCES nodes(rowid) ON DELETE CASCADE,
    type TEXT NOT NULL,
    refs INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (src, dst, type)
) WITHOUT ROWID;
CREATE INDEX links_by_dst ON links(dst, type);
CREATE TABLE vectors (
    node INTEGER PRIMARY KEY REFERENCES nodes(rowid) ON DELETE CASCADE,
    vec BLOB NOT NULL
);
CREATE TABLE node_scopes (
    repo TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    node INTEGER NOT NULL REFERENCES nodes(rowid) ON DELETE CASCADE,
    PRIMARY KEY (repo, key, value, node)
) WITHOUT ROWID;
CREATE INDEX node_scopes_by_node ON node_scopes(node);
CREATE TABLE applied_changesets (
    id TEXT PRIMARY KEY,
    repo TEXT NOT NULL,
    receipt TEXT NOT NULL,
    applied_at TEXT NOT NULL
);
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
"""

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


# Conversation memory. `threads.next_seq` never reuses a seq (even after expiry or `clear`);
# `history_len` is how much of the caller's history is stored. Messages are never updated;
# `text` is what search indexes, `content` NULL when equal to it.
_CONVERSATION = """
CREATE TABLE threads (
    id TEXT PRIMARY KEY,
    next_seq INTEGER NOT NULL,
    history_len INTEGER NOT NULL,
    boundary_seq INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    history_hash TEXT
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
    metadata TEXT,
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
"""

# Several Memory objects on one store: holders with heartbeats; extraction replies kept for a
# retry (`task_results`); operations accepted while another Memory holds the work (`ops`);
# step claims of auto-commit sessions; `store_clock` (`database.HostClock`).
_WORK = """
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
CREATE TABLE holders (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    seen_at TEXT NOT NULL
) WITHOUT ROWID;
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
CREATE TABLE step_claims (
    step_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    holder TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX step_claims_by_holder ON step_claims(holder);
CREATE INDEX step_claims_by_session ON step_claims(session_id);
CREATE TABLE server_profiles (
    repo TEXT NOT NULL,
    model TEXT NOT NULL,
    profile TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (repo, model)
);
CREATE TABLE store_clock (
    boot TEXT NOT NULL,
    wall TEXT NOT NULL,
    at REAL NOT NULL
);
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


# Every change of a node's text logged (rowids, never text) under a per-repo sequence, in the
# writer's transaction; the last LOG_KEEP entries per repo are kept (`horizon`).
_LEXICAL = f"""
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

# Every applied changeset is a commit to list, diff and revert. A record holds ids and counts,
# never text (erasure reaches history); `seq` is max + 1 under the repo's lock.
_HISTORY = """
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
    reworded TEXT NOT NULL,
    joined TEXT NOT NULL DEFAULT '[]',
    reverted_by TEXT,
    reverts TEXT
);
CREATE UNIQUE INDEX commits_by_repo ON commits(repo, seq);
CREATE INDEX commits_by_session ON commits(session_id) WHERE session_id IS NOT NULL;
"""
