"""The PostgreSQL side of `bench_sessions.py`'s baselines: the same rows without mnemo.

- `bare_inserts`: one transaction per `steps` row (optionally with the previous step's reward
  update), on one connection, as the SQLite baseline does with BEGIN/COMMIT.
- `graph_rows` / `raw_commit`: the node, vector and link rows mnemo wrote for a repo, read back
  and written again into a fresh database with mnemo's schema, in one transaction, by
  `executemany` and by binary `COPY`.
- `watch_connections`: samples the database's connection count while a case runs.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from statistics import median
from typing import Any

import anyio
import psycopg
from _bench import Latency
from _stores import POSTGRES, Stores
from psycopg.types.json import Jsonb

from mnemo.storage.postgres import schema
from mnemo.storage.postgres.connection import register_vector

Conn = psycopg.AsyncConnection[tuple[Any, ...]]

INSERT_STEP = (
    "INSERT INTO steps(id, session_id, episode_id, idx, trajectory_id, observation, action,"
    " state_summary, subgoal, subgoal_vec, reward, metadata, recorded_at)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
NODE_COLUMNS = ("id", "repo", "type", "text", "data", "key", "source_id", "created_at")
NODE_TYPES = ("text", "text", "text", "text", "jsonb", "text", "text", "timestamptz")
VECTOR_COLUMNS = ("node_id", "repo", "vec")
LINK_COLUMNS = ("repo", "src", "dst", "type")

# The other connections of a database, seen from the sampler's own (which is left out).
COUNT_CONNECTIONS = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


async def connect(url: str) -> Conn:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await register_vector(conn)
    return conn


async def bare_inserts(url: str, rows: Sequence[tuple[Any, ...]], warmup: int, dim: int,
                       *, with_reward_update: bool) -> Latency:
    """Times one transaction per row (after `warmup` rows) into mnemo's `steps`."""
    now = datetime.fromisoformat(str(rows[0][-1]))
    episode, session = rows[0][2], rows[0][1]
    rows = [(*row[:-1], datetime.fromisoformat(str(row[-1]))) for row in rows]
    samples: list[int] = []
    async with await connect(url) as conn:
        await conn.execute(
            "INSERT INTO repos(name, config, dim, embedder, created_at)"
            " VALUES ('bench', '{}', %s, 'FastEmbedder', %s)", (dim, now))
        await conn.execute(
            "INSERT INTO sessions(id, repo, state, config, episode_id, created_at, updated_at)"
            " VALUES (%s, 'bench', 'collecting', '{}', %s, %s, %s)", (session, episode, now, now))
        await conn.execute(
            "INSERT INTO episodes(id, session_id, goal, status, started_at)"
            " VALUES (%s, %s, 'goal', 'open', %s)", (episode, session, now))
        for i, row in enumerate(rows):
            start = time.perf_counter_ns()
            async with conn.transaction():
                await conn.execute(INSERT_STEP, row, prepare=True)
                if with_reward_update and i:
                    await conn.execute("UPDATE steps SET reward = %s WHERE id = %s",
                                       (0.5, rows[i - 1][0]), prepare=True)
            if i >= warmup:
                samples.append(time.perf_counter_ns() - start)
    return Latency.of(samples)


@dataclass(frozen=True, slots=True)
class GraphRows:
    nodes: list[tuple[Any, ...]]
    vectors: list[tuple[Any, ...]]
    links: list[tuple[Any, ...]]


async def graph_rows(url: str, repo: str) -> GraphRows:
    """The rows mnemo wrote for `repo`, in insertion order."""
    async with await connect(url) as conn, conn.cursor(binary=True) as cur:
        await cur.execute(
            f"SELECT {', '.join(NODE_COLUMNS)} FROM nodes WHERE repo = %s ORDER BY rowid", (repo,))
        nodes = [(*row[:4], Jsonb(row[4]), *row[5:]) for row in await cur.fetchall()]
        await cur.execute(
            "SELECT v.node_id, v.repo, v.vec FROM vectors v JOIN nodes n ON n.id = v.node_id"
            " WHERE v.repo = %s ORDER BY n.rowid", (repo,))
        vectors = list(await cur.fetchall())
        await cur.execute(
            f"SELECT {', '.join(LINK_COLUMNS)} FROM links WHERE repo = %s", (repo,))
        links = list(await cur.fetchall())
    return GraphRows(nodes, vectors, links)


async def raw_commit(stores: Stores, rows: GraphRows, repo: str, dim: int, how: str,
                     runs: int = 3, *, hnsw: bool = True) -> float:
    """Median seconds to write `rows` into a fresh database in one transaction, `how` being
    "executemany" or "copy"; the repo's HNSW index exists first, as in mnemo's database,
    unless `hnsw` is false (to show what maintaining it costs)."""
    times = []
    for run in range(runs):
        url = str(await stores.fresh(POSTGRES, f"raw_{how}_{run}"))
        async with await connect(url) as conn:
            if hnsw:
                await schema.ensure_vector_index(conn, repo, dim)
            gc.collect()
            start = time.perf_counter()
            async with conn.transaction(), conn.cursor(binary=True) as cur:
                if how == "executemany":
                    for table, columns, values in _tables(rows):
                        marks = ", ".join(["%s"] * len(columns))
                        await cur.executemany(
                            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", values)
                else:
                    for table, columns, values in _tables(rows):
                        async with cur.copy(f"COPY {table} ({', '.join(columns)})"
                                            " FROM STDIN (FORMAT BINARY)") as copy:
                            copy.set_types(_types(table))
                            for value in values:
                                await copy.write_row(value)
            times.append(time.perf_counter() - start)
    return median(times)


def _tables(rows: GraphRows) -> list[tuple[str, tuple[str, ...], list[tuple[Any, ...]]]]:
    return [("nodes", NODE_COLUMNS, rows.nodes), ("vectors", VECTOR_COLUMNS, rows.vectors),
            ("links", LINK_COLUMNS, rows.links)]


def _types(table: str) -> list[str]:
    return {"nodes": list(NODE_TYPES), "vectors": ["text", "text", "vector"],
            "links": ["text"] * 4}[table]


@dataclass(frozen=True, slots=True)
class Connections:
    """The database's connection count while a case ran (the sampler's own left out)."""

    samples: int
    peak: int
    at_end: int  # when the case's work ended, its Memory still open
    after_close: int  # right after its Memory closed
    gone_after_s: float | None  # until none was left (a backend ends after its client)


async def watch_connections(url: str, done: anyio.Event, found: list[int],
                            period: float = 0.01) -> None:
    """Appends the connection count to `found` every `period` seconds until `done`."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            found.append(await count_connections(conn))
            with anyio.move_on_after(period):
                await done.wait()
            if done.is_set():
                return


async def count_connections(conn: Conn) -> int:
    cur = await conn.execute(COUNT_CONNECTIONS)
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def count_connections_at(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await count_connections(conn)


async def connections_gone(url: str, limit: float = 5.0,
                           period: float = 0.01) -> tuple[int, float | None]:
    """The count right away, and the seconds from then until it reached 0 (None: not within
    `limit`). A server process outlives its client's goodbye by a moment, so a count taken at
    once may still show connections that are closing."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        first = count = await count_connections(conn)
        start = time.perf_counter()
        while count:
            if time.perf_counter() - start > limit:
                return first, None
            await anyio.sleep(period)  # a sampling period: nothing to wait on in the server
            count = await count_connections(conn)
    return first, time.perf_counter() - start
