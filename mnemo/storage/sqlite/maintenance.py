"""`SqliteMaintenance`: graph maintenance on SQLite (links by rowid, FTS5 search index)."""

from __future__ import annotations

import sqlite3

from mnemo.storage.maintenance import SqlMaintenance
from mnemo.storage.sql import Statements


class SqliteMaintenance(SqlMaintenance):
    """Graph maintenance on SQLite."""

    # Neither end in another repo (links have no repo: it is their ends').
    DANGLING = (
        "(NOT EXISTS (SELECT 1 FROM nodes n WHERE n.rowid = links.src)"
        " OR NOT EXISTS (SELECT 1 FROM nodes n WHERE n.rowid = links.dst))"
        " AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.rowid IN (links.src, links.dst)"
        " AND n.repo != ?)"
    )

    async def _bad_vectors(self, sql: Statements, repo: str, dim: int) -> int:
        # Half floats: two bytes a number.
        row = await sql.row(
            "SELECT count(*) FROM nodes n JOIN vectors v ON v.node = n.rowid"
            " WHERE n.repo = ? AND length(v.vec) != ?", (repo, 2 * dim),
        )
        return int(row[0]) if row else 0

    async def _search_rebuilt(self, sql: Statements, repo: str) -> bool:
        try:
            # rank = 1: also compare the index with its content table (the nodes).
            await sql.run("INSERT INTO nodes_fts(nodes_fts, rank) VALUES ('integrity-check', 1)")
            return False
        except sqlite3.DatabaseError:
            await sql.run("INSERT INTO nodes_fts(nodes_fts) VALUES ('rebuild')")
            return True
