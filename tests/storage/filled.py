"""A SQLite memory with a row in every table `mnemo migrate` copies, and the rows of a store
read back in one comparable form (for tests/storage/test_transfer.py and tests/cli)."""

from __future__ import annotations

import json
import sqlite3
import struct
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

import mnemo
from mnemo.storage.sqlite.rows import pack_text, unpack_text
from mnemo.storage.transfer import TABLES, Kind, Table
from tests.conversation._support import ScriptedEviction, assistant, user
from tests.fakes import FakeEmbedder

REPO = "ops"
THREAD = "t"
# Words the copies' search indexes must find: a node's and a message's.
NODE_WORD = "pgbouncer"
MESSAGE_WORD = "violin"


async def fill(path: Path) -> None:
    """Fills a new SQLite memory at `path` through the public API: a committed session, an
    ingest, a thread with vectors, a compaction, a goal, a pin and a snapshot; then one row
    each in the tables that hold rows only while work is under way (changesets,
    task_results), in server_profiles and a maintenance record."""
    llm = ScriptedEviction()
    async with mnemo.Memory(path, llm=llm, embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("Fix the blog deploy", repo=REPO,
                                      metadata={"user_id": "ops-team", "tier": 2})
        await mem.append(sid, "nginx returns 502: gunicorn listens on 8001.", "Bind it to 8000.")
        await mem.append(sid, "The blog answers 200 again.", "Close the ticket.")
        await mem.close_and_commit(sid)
        await mem.ingest(
            REPO,
            mnemo.Trajectory("Tune postgres", [mnemo.Step(
                "Postgres runs out of connections at 100 clients.",
                f"Put {NODE_WORD} in front of it with a pool of 20.",
            )]),
            source_id="doc-1",
        )
        conv = mem.conversation(retrieval=mnemo.Semantic(k=2))
        history = [
            user(f"step {i}: deploy the billing service to the staging cluster") if i % 2 == 0
            else assistant(f"done, step {i} is out; the {MESSAGE_WORD} case is packed")
            for i in range(12)
        ]
        await conv.save(THREAD, history, metadata={"user_id": "ops-team"})
        await conv.save_compaction(THREAD, 0, 1, "the first turn")
        goal = await mem.add_goal(THREAD, "ship billing")
        first = (await conv.raw(THREAD))[0].id
        llm.replies = [mnemo.LLMResponse(tool_calls=[
            mnemo.ToolCall("attach_messages_to_goals",
                           {"message_ids": [first], "goal_ids": [goal]}, "c1"),
            mnemo.ToolCall("save_snapshot", {"text": "Billing went to staging."}, "c2"),
            mnemo.ToolCall("everything_ok", {}, "c3"),
        ])]
        result = await mem.evict(THREAD, token_budget=200, eviction_fraction=0.5)
        assert result.snapshot is not None
        assert result.pinned
    now = datetime.now(UTC).isoformat()
    with sqlite3.connect(path) as conn:
        episode = conn.execute("SELECT id FROM episodes").fetchone()[0]
        conn.execute(
            "INSERT INTO changesets VALUES (?, ?, ?, ?, ?, ?)",
            ("cs-open", REPO, None, None, json.dumps(
                {"id": "cs-open", "links": [], "nodes": [], "repo": REPO, "step_ids": [],
                 "weight": 1.5}, sort_keys=True), now),
        )
        conn.execute(
            "INSERT INTO task_results VALUES (?, ?, ?, ?, ?, ?, ?)",
            (episode, "trajectory-1", "semantic", "d1",
             json.dumps({"facts": ["x"]}, sort_keys=True),
             json.dumps({"input_tokens": 3}, sort_keys=True), now),
        )
        # A maintenance record, its columns added after the baseline.
        conn.execute(
            "INSERT INTO commits(id, repo, seq, committed_at, nodes, links, retired, reworded,"
            " maintenance, removed) VALUES (?, ?, 99, ?, ?, ?, '[]', '[]', 'decay', ?)",
            ("maintenance-1", REPO, now, pack_text("[]"), pack_text("[]"),
             json.dumps(["semantic_gone"])),
        )
        # What a model learned of its server (the fake LLM learns nothing of one).
        conn.execute(
            "INSERT INTO server_profiles VALUES (?, ?, ?, ?)",
            (REPO, "openai-compatible:m@http://127.0.0.1:8080/v1",
             json.dumps({"concurrency": {"limit": 3, "slow_start": False}}, sort_keys=True),
             now),
        )
    conn.close()


def _normal(kind: Kind, value: Any) -> Any:
    """One stored value in a form both backends' rows share."""
    if value is None:
        return None
    if kind is Kind.TIME:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else value
        return moment.astimezone(UTC)
    if kind is Kind.JSON:
        if isinstance(value, bytes):  # a SQLite commit record's or receipt's, packed
            return json.loads(unpack_text(value))
        return json.loads(value) if isinstance(value, str) else value
    if kind is Kind.BOOL:
        return bool(value)
    if kind is Kind.VECTOR:
        if isinstance(value, bytes):
            return tuple(np.frombuffer(value, dtype=np.float32).tolist())
        if isinstance(value, str):  # pgvector's text form
            return tuple(np.array(value.strip("[]").split(","), dtype=np.float32).tolist())
        dim = struct.unpack_from(">H", value)[0]
        return tuple(np.frombuffer(value, dtype=">f4", count=dim, offset=4).tolist())
    if kind is Kind.BYTES:
        return bytes(value)
    if kind is Kind.FLOAT:
        return float(value)
    return value


def _sorted(table: Table, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    positions = [table.names.index(name) for name in table.key]
    return sorted(rows, key=lambda row: tuple(str(row[i]) for i in positions))


def sqlite_rows(path: Path, table: Table, *, raw: bool = False) -> list[tuple[Any, ...]]:
    """`table`'s rows in the SQLite file, by key (as stored when `raw`)."""
    columns = ", ".join(table.names)
    if table.name == "vectors":  # float16, keyed by the node's rowid
        select = "SELECT n.id, n.repo, v.vec FROM vectors v JOIN nodes n ON n.rowid = v.node"
    elif table.name == "links":  # its ends by their nodes' rowids
        select = ("SELECT a.repo, a.id, b.id, l.type, l.refs FROM links l"
                  " JOIN nodes a ON a.rowid = l.src JOIN nodes b ON b.rowid = l.dst")
    else:
        select = f"SELECT {columns} FROM {table.name}"
    with sqlite3.connect(path) as conn:
        rows = conn.execute(select).fetchall()
    conn.close()
    if table.name == "vectors" and not raw:
        rows = [(node_id, repo, np.frombuffer(vec, dtype=np.float16).astype(np.float32)
                 .tobytes()) for node_id, repo, vec in rows]
    if not raw:
        rows = [tuple(_normal(k, v) for k, v in zip(table.kinds, row, strict=True))
                for row in rows]
    return _sorted(table, rows)


def postgres_rows(url: str, table: Table) -> list[tuple[Any, ...]]:
    """`table`'s rows in the PostgreSQL database, by key, read with a plain psycopg
    connection."""
    columns = ", ".join(table.names)
    with psycopg.connect(url) as conn:
        rows = conn.execute(f"SELECT {columns} FROM {table.name}").fetchall()
    return _sorted(table, [tuple(_normal(k, v) for k, v in zip(table.kinds, row, strict=True))
                           for row in rows])


def nonempty_tables(path: Path) -> set[str]:
    """The copied tables that hold rows in the SQLite file."""
    return {t.name for t in TABLES if sqlite_rows(path, t, raw=True)}
