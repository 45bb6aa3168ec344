"""SQLite query plans that recall's speed depends on at a million nodes (BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mnemo.graph.model import Changeset, Link, LinkType, NodeDraft, NodeType
from mnemo.storage.sqlite.database import Database
from mnemo.storage.sqlite.graph import SqliteGraph
from tests.graph._support import DIM, policy


async def test_a_hop_reads_the_types_of_both_ends_from_an_index(tmp_path: Path) -> None:
    """`typed_links` (each recall hop) joins every link to the types of its two ends through
    the (id, type) index, never through the nodes' rows: at 1M nodes reading the rows took a
    hop's read of 283 links from 1.7 to 4.5 ms. Regression guard on the plan, which the
    planner does not choose by itself."""
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
        read = next(s for s in statements if "FROM links l" in s)

        def explain(db: Any) -> list[str]:
            return [row[3] for row in db.conn.execute("EXPLAIN QUERY PLAN " + read)]

        plan = await database.run(explain)
        joins = [step for step in plan if step.startswith(("SEARCH a", "SEARCH b"))]
        assert joins == [
            "SEARCH a USING COVERING INDEX nodes_id_type (id=?)",
            "SEARCH b USING COVERING INDEX nodes_id_type (id=?)",
        ]
    finally:
        await graph.aclose()
        await database.close()
