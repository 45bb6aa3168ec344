"""The SQLite file's layout: an operator's `PRAGMA integrity_check` is clean, vectors are
float16 rows packed in their pages, commit records stay in their pages, and a store made
before these layouts is brought to them when opened, its rows intact."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np

import mnemo
from mnemo.storage.sqlite.rows import unpack_text
from tests.fakes import FakeEmbedder
from tests.storage.filled import NODE_WORD, REPO, fill

# The migrations that made today's layout, undone by `_as_before`.
LAYOUT = ("m017_links_key_first", "m018_commits_packed", "m019_half_vectors",
          "m020_receipts_packed", "m022_links_by_rowid", "m026_shared_knowledge")
COMMITS = ("SELECT id, repo, seq, committed_at, session_id, source_id, nodes, links, retired,"
           " reworded FROM commits")
VECTORS = "SELECT n.id, v.vec FROM vectors v JOIN nodes n ON n.rowid = v.node"
LINKS = ("SELECT a.repo, a.id, b.id, l.type FROM links l JOIN nodes a ON a.rowid = l.src"
         " JOIN nodes b ON b.rowid = l.dst")


def integrity(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        rows = [row[0] for row in conn.execute("PRAGMA integrity_check(1000)")]
    conn.close()
    return rows


async def test_integrity_check_is_clean_on_a_filled_store(tmp_path: Path) -> None:
    """`PRAGMA integrity_check` answers "ok" on a store with a row in every table (SQLite
    3.40 reported "NULL value in links.repo" for every link, where no row is NULL)."""
    path = tmp_path / "memory.db"
    await fill(path)
    with sqlite3.connect(path) as conn:
        (links,) = conn.execute("SELECT count(*) FROM links").fetchone()
    conn.close()
    assert links > 0
    assert integrity(path) == ["ok"]


async def test_vectors_are_float16_rows_and_commits_and_links_are_compact(
    tmp_path: Path,
) -> None:
    """A node's vector takes 2 bytes a dimension and not much more on disk (a float32 one
    took half a 4 KB page), an ingest's commit record, its lists packed, well under a
    kilobyte (it took an overflow page of its own, 4.7 KB), and a link, with its entry in
    links_by_dst, under 100 bytes (naming its ends by id, it took 220); no index of the
    nodes leads with the id but the id's own."""
    path = tmp_path / "memory.db"
    async with mnemo.Memory(path, embedder=mnemo.HashEmbedder(dim=384)) as mem:
        await mem.open_repo("chat")
        for i in range(60):
            step = mnemo.Step(f"Message {i}: the garden hose {i} leaks again.", "remember it")
            await mem.ingest("chat", mnemo.Trajectory("remember the chat", [step]),
                             source_id=f"m{i}")
    with sqlite3.connect(path) as conn:
        lengths = {n for (n,) in conn.execute("SELECT DISTINCT length(vec) FROM vectors")}
        disk = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
        (vectors,) = conn.execute("SELECT count(*) FROM vectors").fetchone()
        records = conn.execute("SELECT nodes, links FROM commits").fetchall()
        (links,) = conn.execute("SELECT count(*) FROM links").fetchone()
        by_id = [name for name, in conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'nodes'"
            " AND sql LIKE '%(id%'")]
    conn.close()
    assert links >= 6 * 60
    assert (disk["links"] + disk["links_by_dst"]) / links < 100
    assert by_id == []
    assert lengths == {2 * 384}
    assert disk["vectors"] / vectors < 1.12 * 2 * 384
    assert disk["commits"] / len(records) < 1024
    nodes, links = records[0]
    assert isinstance(links, bytes)
    assert json.loads(unpack_text(nodes))[0].startswith("source_")
    assert len(links) < len(unpack_text(links)) / 2


def _as_before(path: Path) -> None:
    """Puts a store back in the layout of before `LAYOUT`: links by node id with `repo`
    first, nodes indexed by (repo, type, created_at) and (id, type), commit records and
    receipts as plain JSON (receipts in an ordinary table), vectors as float32; and forgets
    those migrations."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.create_function("f32", 1, lambda blob: np.frombuffer(blob, dtype=np.float16)
                         .astype(np.float32).tobytes())
    conn.create_function("plain", 1, unpack_text)
    conn.executescript(
        """
        PRAGMA foreign_keys = OFF;
        BEGIN;
        CREATE TABLE old_links (
            repo TEXT NOT NULL,
            src TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
            dst TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
            type TEXT NOT NULL,
            PRIMARY KEY (src, dst, type)
        ) WITHOUT ROWID;
        INSERT INTO old_links SELECT a.repo, a.id, b.id, l.type FROM links l
            JOIN nodes a ON a.rowid = l.src JOIN nodes b ON b.rowid = l.dst;
        DROP TABLE links;
        ALTER TABLE old_links RENAME TO links;
        CREATE INDEX links_by_dst ON links(dst, type);
        DROP INDEX nodes_by_type;
        CREATE INDEX nodes_by_type ON nodes(repo, type, created_at);
        CREATE INDEX nodes_id_type ON nodes(id, type);
        ALTER TABLE nodes DROP COLUMN owners;
        CREATE TABLE old_commits (
            id TEXT PRIMARY KEY, repo TEXT NOT NULL, seq INTEGER NOT NULL,
            committed_at TEXT NOT NULL, session_id TEXT, source_id TEXT, nodes TEXT NOT NULL,
            links TEXT NOT NULL, retired TEXT NOT NULL, reworded TEXT NOT NULL
        ) WITHOUT ROWID;
        INSERT INTO old_commits SELECT id, repo, seq, committed_at, session_id, source_id,
            plain(nodes), plain(links), retired, reworded FROM commits;
        DROP TABLE commits;
        ALTER TABLE old_commits RENAME TO commits;
        CREATE UNIQUE INDEX commits_by_repo ON commits(repo, seq);
        CREATE TABLE old_vectors (
            node_id TEXT PRIMARY KEY REFERENCES nodes(id) ON DELETE CASCADE,
            repo TEXT NOT NULL,
            vec BLOB NOT NULL
        );
        INSERT INTO old_vectors SELECT n.id, n.repo, f32(v.vec) FROM vectors v
            JOIN nodes n ON n.rowid = v.node;
        DROP TABLE vectors;
        ALTER TABLE old_vectors RENAME TO vectors;
        CREATE INDEX vectors_by_repo ON vectors(repo);
        CREATE TABLE old_applied (
            id TEXT PRIMARY KEY, repo TEXT NOT NULL, receipt TEXT NOT NULL,
            applied_at TEXT NOT NULL
        );
        INSERT INTO old_applied SELECT id, repo, plain(receipt), applied_at
            FROM applied_changesets;
        DROP TABLE applied_changesets;
        ALTER TABLE old_applied RENAME TO applied_changesets;
        """
    )
    conn.executemany("DELETE FROM _sqlite_migrations WHERE name = ?", [(m,) for m in LAYOUT])
    conn.execute("COMMIT")
    conn.close()


async def test_a_store_of_the_layout_before_is_migrated_with_its_rows(tmp_path: Path) -> None:
    """A store whose links, commit records and float32 vectors are in the layout of before
    opens: the migrations bring it to today's, every link, record and vector is still
    there (each vector within float16's precision), recall finds what it found, and
    integrity_check is clean."""
    path = tmp_path / "memory.db"
    await fill(path)
    with sqlite3.connect(path) as conn:
        links = sorted(conn.execute(LINKS).fetchall())
        commits = sorted(conn.execute(COMMITS).fetchall())
        receipts = sorted(conn.execute("SELECT * FROM applied_changesets").fetchall())
        vectors = dict(conn.execute(VECTORS).fetchall())
    conn.close()
    _as_before(path)

    async with mnemo.Memory(path, embedder=FakeEmbedder()) as mem:
        found = await mem.recall(REPO, NODE_WORD)
        assert any(NODE_WORD in m.node.text for m in found.memories)
    with sqlite3.connect(path) as conn:
        assert sorted(conn.execute(LINKS)) == links
        indexes = {name for (name,) in conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'nodes'")}
        assert sorted(conn.execute(COMMITS)) == commits
        assert sorted(conn.execute("SELECT * FROM applied_changesets")) == receipts
        after = dict(conn.execute(VECTORS).fetchall())
        applied = {name for (name,) in conn.execute("SELECT name FROM _sqlite_migrations")}
    conn.close()
    assert after == vectors
    assert set(LAYOUT) <= applied
    assert "nodes_id_type" not in indexes
    assert integrity(path) == ["ok"]
