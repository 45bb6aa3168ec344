"""The SQL of a repo's re-embedding (`graph.reembed`), once for both backends: new vectors
staged in `staged_vectors`, then put in place in one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from mnemo.errors import StorageError
from mnemo.graph.model import NODE_TYPES, Vector
from mnemo.graph.reembed import Staging, Unstaged
from mnemo.storage import vector_log
from mnemo.storage.graph_base import GraphBase
from mnemo.storage.lexical.source import STATE, state_of
from mnemo.storage.sql import Dialect, Statements, number


class SqlReembeds(Dialect):
    # The rows of `staged_vectors` or `vectors` of the repo (one parameter: the repo).
    OF_REPO = "node IN (SELECT rowid FROM nodes WHERE repo = ?)"
    STAGED = "s.node = n.rowid"
    STAGE = (
        "INSERT OR REPLACE INTO staged_vectors (node, vec) SELECT rowid, ? FROM nodes"
        " WHERE rowid = ? AND id = ?"
    )
    UNSTAGE_LOGGED = (
        "DELETE FROM staged_vectors WHERE node IN (SELECT node FROM lexical_log"
        " WHERE repo = ? AND seq > ? AND seq <= ?)"
    )
    VECTOR_COLUMNS = "node, vec"

    async def begin(self, sql: Statements, repo: str, embedder: str, dim: int) -> Staging:
        found = await sql.row(f"SELECT embedder, dim FROM reembeds WHERE repo = ?{self.LOCK}",
                              (repo,))
        resumed = found is not None and tuple(found) == (embedder, dim)
        if not resumed:
            await sql.run(f"DELETE FROM staged_vectors WHERE {self.OF_REPO}", (repo,))
            await sql.run(
                "INSERT INTO reembeds (repo, embedder, dim, seq, started_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (repo) DO UPDATE SET"
                " embedder = excluded.embedder, dim = excluded.dim, seq = excluded.seq,"
                " started_at = excluded.started_at",
                (repo, embedder, dim, state_of(await sql.rows(STATE, (repo,)))[0],
                 self._stamp(datetime.now(UTC))),
            )
        total = await number(sql, "SELECT count(*) FROM nodes WHERE repo = ?", repo)
        staged = await number(
            sql, f"SELECT count(*) FROM staged_vectors WHERE {self.OF_REPO}", repo
        )
        return Staging(embedder, dim, staged, total, resumed)

    async def unstaged(self, sql: Statements, repo: str, after: int, limit: int,
                       upto: int | None) -> list[Unstaged]:
        rows = await sql.rows(
            "SELECT n.rowid, n.id, n.type, n.text FROM nodes n WHERE n.repo = ?"
            f" AND n.rowid > ? AND n.rowid <= ? AND NOT EXISTS (SELECT 1 FROM staged_vectors s"
            f" WHERE {self.STAGED}) ORDER BY n.rowid LIMIT ?",
            (repo, after, 2**63 - 1 if upto is None else upto, limit),  # largest rowid: no bound
        )
        return [Unstaged(int(rowid), node_id, NODE_TYPES[kind], text)
                for rowid, node_id, kind, text in rows]

    async def stage(self, sql: Statements, nodes: Sequence[Unstaged], vectors: Vector) -> None:
        await sql.run_many(self.STAGE, [(self._vector(vector), node.rowid, node.id)
                                        for node, vector in zip(nodes, vectors, strict=True)])

    async def unstage_changed(self, sql: Statements, repo: str) -> None:
        found = await sql.row(f"SELECT seq FROM reembeds WHERE repo = ?{self.LOCK}", (repo,))
        if found is None:
            raise StorageError("unavailable", f"repo {repo!r} is not being re-embedded")
        seen = int(found[0])
        seq, horizon = state_of(await sql.rows(STATE, (repo,)))
        try:
            if vector_log.moved(seen, seq, horizon):
                await sql.run(self.UNSTAGE_LOGGED, (repo, seen, seq))
        except vector_log.Reload:
            await sql.run(f"DELETE FROM staged_vectors WHERE {self.OF_REPO}", (repo,))
        await sql.run("UPDATE reembeds SET seq = ? WHERE repo = ?", (seq, repo))

    async def switch(self, sql: Statements, repo: str) -> tuple[int, int]:
        found = await sql.row(f"SELECT embedder, dim FROM reembeds WHERE repo = ?{self.LOCK}",
                              (repo,))
        if found is None:
            raise StorageError("unavailable", f"repo {repo!r} is not being re-embedded")
        embedder, dim = found
        missing = await number(
            sql,
            "SELECT count(*) FROM nodes n WHERE n.repo = ?"
            f" AND NOT EXISTS (SELECT 1 FROM staged_vectors s WHERE {self.STAGED})",
            repo,
        )
        if missing:
            raise StorageError(
                "unavailable", f"{missing} nodes of repo {repo!r} have no new vector yet"
            )
        await sql.run(f"DELETE FROM vectors WHERE {self.OF_REPO}", (repo,))
        moved = await sql.run(
            f"INSERT INTO vectors ({self.VECTOR_COLUMNS}) SELECT {self.VECTOR_COLUMNS}"
            f" FROM staged_vectors WHERE {self.OF_REPO}",
            (repo,),
        )
        await sql.run(f"DELETE FROM staged_vectors WHERE {self.OF_REPO}", (repo,))
        recorded = await sql.row(
            "UPDATE repos SET embedder = ?, dim = ?, vectors_generation = vectors_generation + 1"
            " WHERE name = ? RETURNING vectors_generation",
            (embedder, dim, repo),
        )
        if recorded is None:
            raise StorageError("unavailable", f"repo {repo!r} has no record")
        await sql.run("DELETE FROM reembeds WHERE repo = ?", (repo,))
        return int(recorded[0]), moved


class ReembeddedGraph(GraphBase):
    """`graph.ports.Reembedding`: the backend's `REEMBEDS` run by its driver."""

    REEMBEDS: SqlReembeds

    async def begin_reembed(self, repo: str, embedder: str, dim: int) -> Staging:
        return await self._driver.write(
            lambda sql: self.REEMBEDS.begin(sql, repo, embedder, dim)
        )

    async def unstaged(
        self, repo: str, after: int, limit: int, upto: int | None = None
    ) -> list[Unstaged]:
        return await self._driver.read(
            lambda sql: self.REEMBEDS.unstaged(sql, repo, after, limit, upto)
        )

    async def last_rowid(self, repo: str) -> int:
        return await self._driver.read(lambda sql: number(
            sql, "SELECT coalesce(max(rowid), 0) FROM nodes WHERE repo = ?", repo))

    async def stage(self, repo: str, nodes: Sequence[Unstaged], vectors: Vector) -> None:
        await self._driver.write(lambda sql: self.REEMBEDS.stage(sql, nodes, vectors))

    async def unstage_changed(self, repo: str) -> None:
        await self._driver.write(lambda sql: self.REEMBEDS.unstage_changed(sql, repo))

    async def switch_vectors(self, repo: str) -> tuple[int, int]:
        return await self._driver.write(lambda sql: self.REEMBEDS.switch(sql, repo))
