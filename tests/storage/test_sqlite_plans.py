"""SQLite query plans that recall's speed depends on at a million nodes (BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mnemo.graph.model import Changeset, Link, LinkType, NodeDraft, NodeType
from mnemo.storage.sqlite.database import Database
from mnemo.storage.sqlite.graph import SqliteGraph
from tests.graph._support import DIM, policy


async def test_a_hop_reads_links_by_key_and_both_ends_by_rowid(tmp_path: Path) -> None:
    """`typed_links` (each recall hop) reads the asked nodes once through the id's index,
    their links through the links' key and links_by_dst, and each link's other end (its id
    and type) from the node's row by rowid: never a scan of links or nodes. Regression guard
    on the plan (a link names its ends by rowid, so no (id, type) index is kept for it)."""
    database = Database(tmp_path / "plans.db")
    await database.open()
    graph = SqliteGraph(database, lambda repo: DIM)
    try:
        vectors = np.eye(DIM, dtype=np.float32)
        nodes = [
            NodeDraft("t", NodeType.TAG, "tag", {}, vectors[0]),
            NodeDraft("f", NodeType.SEMANTIC, "fact", {}, vectors[1]),
        ]
        links = [Link("t", "f", LinkType.MEMBERSHIP)]
        await graph.apply(Changeset("c", "r", nodes, links), intents=policy())
        statements: list[str] = []

        def plans(db: Any) -> None:
            db.conn.set_trace_callback(statements.append)

        await database.run(plans)
        found = await graph.typed_links("r", ["t"])
        await database.run(lambda db: db.conn.set_trace_callback(None))
        assert found == [("t", NodeType.TAG, "f", NodeType.SEMANTIC, LinkType.MEMBERSHIP)]
        read = next(s for s in statements if "JOIN links l" in s)

        def explain(db: Any) -> list[str]:
            return [row[3] for row in db.conn.execute("EXPLAIN QUERY PLAN " + read)]

        plan = await database.run(explain)
        steps = [step for step in plan if step.startswith(("SEARCH", "SCAN"))]
        assert steps == [
            "SEARCH nodes USING INDEX sqlite_autoindex_nodes_1 (id=?)",
            "SCAN s",
            "SEARCH l USING PRIMARY KEY (src=?)",
            "SEARCH b USING INTEGER PRIMARY KEY (rowid=?)",
            "SCAN d",
            "SEARCH l USING COVERING INDEX links_by_dst (dst=?)",
            "SCAN asked",
            "SEARCH a USING INTEGER PRIMARY KEY (rowid=?)",
        ]
    finally:
        await graph.aclose()
        await database.close()
