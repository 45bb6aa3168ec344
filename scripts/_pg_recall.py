"""The PostgreSQL side of `bench_recall.py`: the synthetic graph written by COPY, and the build
of the repo's HNSW index, timed.

The repo is created through the public API (`mnemo.Memory(url).open_repo`); nodes and links
are then copied in text format (the server parses the JSON and the ISO times, and computes each
node's generated tsvector), vectors in pgvector's binary format. After `ANALYZE`, the repo's
partial HNSW index is built by `schema.ensure_vector_index`, as mnemo builds it, on the
server's own settings (`maintenance_work_mem` decides whether the graph is built in memory:
pgvector's notice that it no longer fits is kept and reported).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql

import mnemo
from mnemo.storage.postgres import schema
from mnemo.storage.postgres.connection import register_vector

NODE_COLUMNS = "id, repo, type, text, data, key, source_id, created_at"


@dataclass
class Prepared:
    """A database holding the graph, and the vectors it holds (for the exact scan)."""

    nodes: int
    prepare_s: float
    build_s: float
    ids: list[str]
    matrix: npt.NDArray[np.float32]
    notices: list[str] = field(default_factory=list)


async def prepare(
    url: str, repo: str, dim: int, embedder: mnemo.Embedder,
    nodes: Sequence[tuple[Any, ...]], links: Sequence[tuple[str, str, str, str]],
    vectors_from: Callable[[int], npt.NDArray[np.float32]], chunk: int,
    users: Sequence[str] | None = None,
) -> Prepared:
    """Writes `nodes` (id, type, text, data JSON, key, source, created ISO) with their vectors
    (`vectors_from(start)` gives the `chunk` from `start` on) and `links` (and, given `users`,
    each node's user as its metadata and in the scope index), then builds the HNSW index;
    returns the seconds of each."""
    started = time.perf_counter()
    async with mnemo.Memory(url, embedder=embedder) as mem:
        await mem.open_repo(repo)
    matrix = np.zeros((len(nodes), dim), dtype=np.float32)
    ids = [str(row[0]) for row in nodes]
    notices: list[str] = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await register_vector(conn)
        conn.add_notice_handler(lambda notice: notices.append(str(notice.message_primary)))
        async with conn.transaction(), conn.cursor() as cur:
            async with cur.copy(f"COPY nodes ({NODE_COLUMNS}, metadata) FROM STDIN") as copy:
                for i, (node_id, kind, text, data, key, source, created) in enumerate(nodes):
                    scope = None if users is None else json.dumps({"user_id": users[i]})
                    await copy.write_row(
                        (node_id, repo, kind, text, data, key, source, created, scope))
            if users is not None:  # mnemo's scope index (`mnemo.graph.scope`)
                await cur.execute(
                    "INSERT INTO node_scopes (repo, key, value, node) SELECT repo, 'user_id',"
                    " (metadata -> 'user_id')::text, rowid FROM nodes WHERE repo = %s", (repo,))
            async with cur.copy("COPY vectors (node_id, repo, vec) FROM STDIN (FORMAT BINARY)"
                                ) as copy:
                copy.set_types(["text", "text", "vector"])
                for start in range(0, len(nodes), chunk):
                    block = vectors_from(start)
                    matrix[start : start + len(block)] = block
                    for node_id, vector in zip(ids[start : start + chunk], block, strict=True):
                        await copy.write_row((node_id, repo, vector))
            async with cur.copy("COPY links (repo, src, dst, type) FROM STDIN") as copy:
                for link in dict.fromkeys(links):
                    await copy.write_row(link)
        await conn.execute("ANALYZE")
        prepare_s = time.perf_counter() - started
        started = time.perf_counter()
        await schema.ensure_vector_index(conn, repo, dim)
        build_s = time.perf_counter() - started
    return Prepared(len(nodes), prepare_s, build_s, ids, matrix, notices)


async def uses_index(url: str, repo: str, dim: int, probe: npt.NDArray[np.float32]) -> bool:
    """Whether the planner answers mnemo's dense search (the shape of `PgGraph._nearest`
    above its exact threshold) from the repo's HNSW index."""
    statement = sql.SQL(
        "EXPLAIN SELECT v.node_id FROM vectors v WHERE v.repo = {repo}"
        " ORDER BY v.vec::vector({dim}) <=> %s::vector({dim}) LIMIT 10"
    ).format(repo=sql.Literal(repo), dim=sql.Literal(dim))
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await register_vector(conn)
        cur = await conn.execute(statement, (probe,))
        plan = " ".join(str(row[0]) for row in await cur.fetchall())
    return schema.vector_index_name(repo) in plan


async def exists(admin_url: str, name: str) -> bool:
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
        return await cur.fetchone() is not None


async def holds(url: str, statement: str) -> bool:
    """Whether `statement` returns a row in the database at `url`."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await (await conn.execute(statement)).fetchone() is not None


async def create(admin_url: str, name: str) -> None:
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def reused(
    nodes: Sequence[tuple[Any, ...]], dim: int,
    vectors_from: Callable[[int], npt.NDArray[np.float32]], chunk: int,
) -> Prepared:
    """A database prepared by an earlier run (`--keep-pg`): the same vectors, made again for
    the exact scan; its copy and build times are not this run's (reported as nan)."""
    matrix = np.zeros((len(nodes), dim), dtype=np.float32)
    for start in range(0, len(nodes), chunk):
        block = vectors_from(start)
        matrix[start : start + len(block)] = block
    return Prepared(len(nodes), float("nan"), float("nan"), [str(r[0]) for r in nodes], matrix)
