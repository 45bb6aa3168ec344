"""Graph maintenance's SQL on PostgreSQL (`mnemo.storage.postgres.graph.PgMaintenance`)
against its SQLite twin: the same small graph on both, the same operation, equal results and
equal rows."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import anyio
import numpy as np
import pytest
from sqlite_utils import Database as SqliteUtilsDatabase

from mnemo.config import Config
from mnemo.graph.maintenance import ConsolidationReport, DecayReport, ValidationReport
from mnemo.graph.model import NodeType
from mnemo.storage.maintenance import SqlMaintenance
from mnemo.storage.postgres.connection import PgStatements, Postgres
from mnemo.storage.postgres.graph import PgMaintenance
from mnemo.storage.sql import Statements
from mnemo.storage.sqlite.database import Database
from mnemo.storage.sqlite.graph import SqliteMaintenance
from tests.pg import until_a_lock_wait

T = TypeVar("T")
N = NodeType
REPO = "r"
DIM = 8
T0 = datetime(2026, 1, 1, tzinfo=UTC)
CONFIG = Config()


@dataclass(frozen=True, slots=True)
class Row:
    """One node to insert, with its vector (None: no vector row; a wrong size is allowed)."""

    id: str
    type: NodeType
    text: str
    data: dict[str, Any] = field(default_factory=dict)
    vec: list[float] | None = None
    repo: str = REPO
    access_count: int = 0
    last_access: datetime | None = None
    created_at: datetime = T0
    consolidated: bool = False


def axis(i: int, dim: int = DIM) -> list[float]:
    """The unit vector along axis `i`."""
    return [1.0 if j == i else 0.0 for j in range(dim)]


@dataclass(frozen=True, slots=True)
class Dump:
    """Every graph row, backend-neutral: node rows, links, vectors as float lists."""

    nodes: list[tuple[Any, ...]]
    links: list[tuple[str, str, str, str]]
    vectors: list[tuple[str, str, list[float]]]


@dataclass
class Twins:
    """The same graph in a SQLite file and a PostgreSQL database."""

    sqlite: Database
    pg: Postgres

    async def insert(self, rows: list[Row], links: list[tuple[str, str, str]]) -> None:
        """Inserts the nodes (in order, so rowids agree), their vectors and the links."""
        await self.sqlite.run(lambda db: _insert_sqlite(db, rows, links))
        async with self.pg.transaction() as conn:
            for row in rows:
                await conn.execute(
                    "INSERT INTO nodes (id, repo, type, text, data, created_at, access_count,"
                    " last_access, consolidated) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    (row.id, row.repo, row.type.value, row.text, json.dumps(row.data),
                     row.created_at, row.access_count, row.last_access, row.consolidated),
                )
                if row.vec is not None:
                    await conn.execute(
                        "INSERT INTO vectors (node_id, repo, vec) VALUES (%s, %s, %s)",
                        (row.id, row.repo, np.array(row.vec, dtype=np.float32)),
                    )
            for src, dst, kind in links:
                await conn.execute(
                    "INSERT INTO links (repo, src, dst, type) VALUES (%s, %s, %s, %s)",
                    (REPO, src, dst, kind),
                )

    async def sql(self, statement: str, *, sqlite: str | None = None) -> None:
        """Runs one statement (written in the SQL both dialects share) on both; `sqlite`, a
        statement of SQLite's own instead."""

        def run(db: SqliteUtilsDatabase) -> None:
            with db.atomic():
                db.conn.execute(statement if sqlite is None else sqlite)

        await self.sqlite.run(run)
        async with self.pg.transaction() as conn:
            await conn.execute(statement)

    async def both(
        self, work: Callable[[SqlMaintenance, Statements], Coroutine[Any, Any, T]]
    ) -> tuple[T, T]:
        """One operation on each backend, each in a transaction as its graph store runs it."""
        from_sqlite = await self.sqlite.write(lambda sql: work(SqliteMaintenance(), sql))
        from_pg = await self.pg.write(lambda sql: work(PgMaintenance(), sql))
        return from_sqlite, from_pg

    async def dumps(self) -> tuple[Dump, Dump]:
        """Both graphs' rows."""
        from_sqlite = await self.sqlite.run(_dump_sqlite)
        async with self.pg.connection() as conn:
            cur = await conn.execute(
                "SELECT id, repo, type, text, data, created_at, access_count, last_access,"
                " consolidated FROM nodes ORDER BY rowid"
            )
            nodes = [
                (i, repo, kind, text, data, created, count, last, bool(done))
                for i, repo, kind, text, data, created, count, last, done in await cur.fetchall()
            ]
            cur = await conn.execute("SELECT repo, src, dst, type FROM links")
            links = sorted((str(r), str(s), str(d), str(k)) for r, s, d, k in await cur.fetchall())
            cur = await conn.execute("SELECT node_id, repo, vec FROM vectors ORDER BY node_id")
            # As SQLite keeps them: float16.
            vectors = [(str(n), str(r), np.asarray(v).astype(np.float16).astype(np.float32)
                        .tolist()) for n, r, v in await cur.fetchall()]
        return from_sqlite, Dump(nodes, links, vectors)

    async def assert_same_rows(self) -> Dump:
        """Both graphs hold equal rows; returns them."""
        from_sqlite, from_pg = await self.dumps()
        assert from_pg == from_sqlite
        return from_pg

    async def pg_search(self, words: str) -> list[str]:
        """Ids of the PostgreSQL nodes whose search column matches `words`."""
        async with self.pg.connection() as conn:
            cur = await conn.execute(
                "SELECT id FROM nodes WHERE search @@ plainto_tsquery('mnemo_english', %s)"
                " ORDER BY rowid",
                (words,),
            )
            return [str(node_id) for (node_id,) in await cur.fetchall()]


def _insert_sqlite(
    db: SqliteUtilsDatabase, rows: list[Row], links: list[tuple[str, str, str]]
) -> None:
    with db.atomic():
        for row in rows:
            db.conn.execute(
                "INSERT INTO nodes (id, repo, type, text, data, created_at, access_count,"
                " last_access, consolidated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (row.id, row.repo, row.type.value, row.text, json.dumps(row.data, sort_keys=True),
                 row.created_at.isoformat(), row.access_count,
                 None if row.last_access is None else row.last_access.isoformat(),
                 int(row.consolidated)),
            )
            if row.vec is not None:
                db.conn.execute(
                    "INSERT INTO vectors (node, vec) SELECT rowid, ? FROM nodes WHERE id = ?",
                    (np.array(row.vec, dtype=np.float16).tobytes(), row.id),
                )
        db.conn.executemany(
            "INSERT INTO links (src, dst, type) SELECT a.rowid, b.rowid, ? FROM nodes a, nodes b"
            " WHERE a.id = ? AND b.id = ?",
            [(kind, src, dst) for src, dst, kind in links],
        )


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _dump_sqlite(db: SqliteUtilsDatabase) -> Dump:
    conn = db.conn
    nodes = [
        (i, repo, kind, text, json.loads(data), _time(created), count, _time(last), bool(done))
        for i, repo, kind, text, data, created, count, last, done in conn.execute(
            "SELECT id, repo, type, text, data, created_at, access_count, last_access,"
            " consolidated FROM nodes ORDER BY rowid"
        )
    ]
    links = sorted(conn.execute(
        "SELECT a.repo, a.id, b.id, l.type FROM links l JOIN nodes a ON a.rowid = l.src"
        " JOIN nodes b ON b.rowid = l.dst").fetchall())
    vectors = [
        (n, r, np.frombuffer(v, dtype=np.float16).astype(np.float32).tolist())
        for n, r, v in conn.execute(
            "SELECT n.id, n.repo, v.vec FROM vectors v JOIN nodes n ON n.rowid = v.node"
            " ORDER BY n.id")
    ]
    return Dump(nodes, [tuple(link) for link in links], vectors)


@asynccontextmanager
async def _twins(url: str, folder: Path) -> AsyncIterator[Twins]:
    sqlite = Database(folder / "g.db")
    await sqlite.open()
    pg = Postgres(url)
    await pg.open()
    try:
        yield Twins(sqlite, pg)
    finally:
        await pg.close()
        await sqlite.close()


@pytest.fixture
async def twins(pg_url: str, tmp_path: Path) -> AsyncIterator[Twins]:
    """An empty graph on each backend."""
    async with _twins(pg_url, tmp_path) as made:
        yield made


@pytest.fixture
async def own_twins(pg_own_url: str, tmp_path: Path) -> AsyncIterator[Twins]:
    """`twins` on a PostgreSQL database of the test's own, which it may change."""
    async with _twins(pg_own_url, tmp_path) as made:
        yield made


async def _during_uncommitted(
    twins: Twins, statement: str, work: Callable[[], Coroutine[Any, Any, None]]
) -> None:
    """Runs `work` while a PostgreSQL transaction that ran `statement` is open, and commits
    that transaction once `work` waits for its locks."""
    async with anyio.create_task_group() as tg:
        async with twins.pg.transaction() as other:
            await other.execute(statement)
            tg.start_soon(work)
            await until_a_lock_wait(twins.pg.url)


# ---- consolidate ----------------------------------------------------------------------------


async def test_merge_duplicates_moves_links_and_merges_data_as_sqlite_does(twins: Twins) -> None:
    """Groups fold into the most confident, oldest survivor: links moved without duplicates,
    concepts, confidence, access counts and latest access merged, orphan tags deleted and the
    examined nodes marked, with the same result and rows on both backends."""
    def fact(node_id: str, confidence: float, *concepts: str, **extra: Any) -> Row:
        return Row(node_id, N.SEMANTIC, f"fact {node_id}", {"confidence": confidence,
                   "concepts": list(concepts)}, axis(0), **extra)

    await twins.insert([
        fact("a", 0.9, "kettle", access_count=2, last_access=T0 + timedelta(days=3)),
        fact("b", 0.5, "kitchen", "kettle", access_count=5, last_access=T0 + timedelta(days=5)),
        fact("c", 0.9, "tea"),
        fact("d", 0.2, "water", access_count=1, last_access=T0 + timedelta(days=1)),
        fact("far", 0.7, "garden"),
        Row("tag_kettle", N.TAG, "kettle", vec=axis(1)),
        Row("tag_kitchen", N.TAG, "kitchen", vec=axis(2)),
        Row("lonely", N.TAG, "lonely", vec=axis(3)),
        Row("alone", N.TAG, "alone", vec=axis(3)),
        Row("step", N.EPISODIC, "boiled water", {"reward": 1.0}, axis(4)),
        fact("elsewhere", 0.9, repo="other"),
    ], [
        ("tag_kettle", "a", "membership"), ("tag_kettle", "b", "membership"),
        ("tag_kitchen", "b", "membership"), ("b", "step", "provenance"),
        ("a", "b", "sibling"), ("step", "b", "sibling"), ("d", "step", "provenance"),
        ("step", "a", "sibling"),
    ])
    before = await twins.both(
        lambda m, sql: m.unconsolidated(sql, REPO),
    )
    assert before == ({"a", "b", "c", "d", "far"},) * 2
    pairs = [("a", "b"), ("b", "c"), ("c", "d"), ("a", "elsewhere"), ("a", "ghost")]
    examined = ["a", "b", "c", "d"]
    results = await twins.both(
        lambda m, sql: m.merge_duplicates(sql, REPO, pairs, examined),
    )
    assert results[1] == results[0]
    assert results[1] == (["b", "d", "lonely", "alone"], ConsolidationReport(4, 2, 3, 2))
    rows = await twins.assert_same_rows()
    nodes = {node[0]: node for node in rows.nodes}
    assert nodes["a"][4] == {"confidence": 0.9, "concepts": ["kettle", "kitchen"],
                             "merged_from": ["b"]}
    assert nodes["a"][6:] == (7, T0 + timedelta(days=5), True)
    assert nodes["c"][6:] == (1, T0 + timedelta(days=1), True)
    assert nodes["far"][8] is False
    assert ("r", "a", "step", "provenance") in rows.links
    assert ("r", "tag_kitchen", "a", "membership") in rows.links
    assert ("r", "c", "step", "provenance") in rows.links
    assert [link for link in rows.links if "b" in link[1:3]] == []
    after = await twins.both(
        lambda m, sql: m.unconsolidated(sql, REPO),
    )
    assert after == ({"far"},) * 2


async def test_merge_with_nothing_to_merge_only_marks_the_examined(twins: Twins) -> None:
    """No pairs: nothing merged or moved, the examined node marked, on both backends."""
    await twins.insert([Row("a", N.SEMANTIC, "fact a", {"confidence": 0.5}, axis(0))], [])
    results = await twins.both(
        lambda m, sql: m.merge_duplicates(sql, REPO, [], ["a"]),
    )
    assert results == (([], ConsolidationReport(1, 0, 0, 0)),) * 2
    rows = await twins.assert_same_rows()
    assert rows.nodes[0][8] is True


async def test_merge_counts_an_access_committed_while_it_waited(twins: Twins) -> None:
    """PostgreSQL: a recall that counted an access of a member, committed after the merge
    began, is in the survivor's sum (SQLite's write lock orders the two the same way)."""
    await twins.insert([
        Row("a", N.SEMANTIC, "fact a", {"confidence": 0.9}, axis(0), access_count=2),
        Row("b", N.SEMANTIC, "fact b", {"confidence": 0.5}, axis(0), access_count=5),
    ], [])
    results: list[tuple[list[str], ConsolidationReport]] = []

    async def merge() -> None:
        async with twins.pg.transaction() as conn:
            results.append(
                await PgMaintenance().merge_duplicates(
                    PgStatements(conn), REPO, [("a", "b")], ["a", "b"]))

    await _during_uncommitted(
        twins, "UPDATE nodes SET access_count = access_count + 1 WHERE id = 'b'", merge)
    assert results == [(["b"], ConsolidationReport(2, 1, 0, 0))]
    async with twins.pg.connection() as conn:
        cur = await conn.execute("SELECT id, access_count FROM nodes")
        assert await cur.fetchall() == [("a", 8)]


# ---- decay ----------------------------------------------------------------------------------


def _sorted(result: tuple[list[str], DecayReport]) -> tuple[object, ...]:
    """The memories deleted and the routing nodes pruned, each sorted, and the report."""
    deleted, report = result
    return sorted(deleted[:report.deleted]), sorted(deleted[report.deleted:]), report


async def test_decay_sweep_deletes_as_sqlite_does(twins: Twins) -> None:
    """Sixty days on, a failed step and an unsure fact go with the routes only they used; a
    year later the rest goes; the same results and rows on both backends, search entries
    included."""
    now = T0 + timedelta(days=60)
    await twins.insert([
        Row("src", N.SOURCE, "episode goal", vec=axis(1)),
        Row("sg", N.SUBGOAL, "find the kettle", vec=axis(2)),
        Row("step", N.EPISODIC, "looked around", {"reward": 0.0}, axis(3)),
        Row("unsure", N.SEMANTIC, "maybe the kettle is blue", {"confidence": 0.0}, axis(4)),
        Row("colour", N.TAG, "colour", vec=axis(5)),
        Row("known", N.SEMANTIC, "the kettle is in the kitchen", {"confidence": 1.0}, axis(5),
            access_count=4, last_access=now - timedelta(days=2)),
        Row("kitchen", N.TAG, "kitchen", vec=axis(6)),
        Row("plain", N.SEMANTIC, "the kitchen has a window", {"confidence": True}, axis(0)),
        Row("proc", N.PROCEDURAL, "boil water first", {"return_score": 2}, axis(6),
            created_at=now - timedelta(days=1)),
        Row("intent", N.INTENT, "make tea", vec=axis(7)),
        Row("odd", N.EPISODIC, "odd reward", {"reward": {"nested": 1}}, axis(7),
            created_at=now - timedelta(days=1)),
        Row("other", N.SEMANTIC, "another repo's fact", {"confidence": 0.0}, axis(0),
            repo="other"),
    ], [
        ("sg", "step", "hierarchical"), ("step", "src", "provenance"),
        ("unsure", "step", "provenance"), ("colour", "unsure", "membership"),
        ("kitchen", "known", "membership"), ("intent", "proc", "hierarchical"),
    ])
    assert await twins.pg_search("blue") == ["unsure"]
    results = await twins.both(
        lambda m, sql: m.decay_sweep(sql, REPO, CONFIG, now),
    )
    assert _sorted(results[1]) == _sorted(results[0])
    assert _sorted(results[1]) == (["step", "unsure"], ["colour", "sg", "src"],
                                  DecayReport(6, 2, 3))
    rows = await twins.assert_same_rows()
    assert [node[0] for node in rows.nodes] == [
        "known", "kitchen", "plain", "proc", "intent", "odd", "other"]
    assert await twins.pg_search("blue") == []
    later = now + timedelta(days=365)
    results = await twins.both(
        lambda m, sql: m.decay_sweep(sql, REPO, CONFIG, later),
    )
    assert _sorted(results[1]) == _sorted(results[0])
    assert _sorted(results[1]) == (["known", "odd", "plain", "proc"], ["intent", "kitchen"],
                                  DecayReport(4, 4, 2))
    rows = await twins.assert_same_rows()
    assert [node[0] for node in rows.nodes] == ["other"]


async def test_decay_keeps_a_memory_recalled_while_it_waited(twins: Twins) -> None:
    """PostgreSQL: a step whose access was counted by a recall committed after the sweep
    began is valued with that access and kept."""
    now = T0 + timedelta(days=60)
    await twins.insert([
        Row("step", N.EPISODIC, "looked around", {"reward": 0.0}, axis(3)),
        Row("gone", N.EPISODIC, "looked again", {"reward": 0.0}, axis(4)),
    ], [])
    results: list[tuple[list[str], DecayReport]] = []

    async def sweep() -> None:
        async with twins.pg.transaction() as conn:
            results.append(await PgMaintenance().decay_sweep(PgStatements(conn), REPO, CONFIG, now))

    await _during_uncommitted(
        twins,
        "UPDATE nodes SET access_count = access_count + 1,"
        f" last_access = '{now.isoformat()}' WHERE id = 'step'",
        sweep,
    )
    assert results == [(["gone"], DecayReport(2, 1, 0))]
    async with twins.pg.connection() as conn:
        cur = await conn.execute("SELECT id FROM nodes")
        assert await cur.fetchall() == [("step",)]


# ---- validate -------------------------------------------------------------------------------


async def _trajectory(twins: Twins) -> None:
    """One episode "ep1": source, subgoal of trajectory "t1", two steps, all linked."""
    step = {"trajectory_id": "t1", "episode_id": "ep1", "reward": 1.0}
    await twins.insert([
        Row("source_ep1", N.SOURCE, "tidy the kitchen", vec=axis(1)),
        Row("subgoal_t1", N.SUBGOAL, "find the kettle", vec=axis(2)),
        Row("s1", N.EPISODIC, "walked to the kitchen", step, axis(3)),
        Row("s2", N.EPISODIC, "opened the cupboard", step, axis(4)),
    ], [
        ("subgoal_t1", "s1", "hierarchical"), ("subgoal_t1", "s2", "hierarchical"),
        ("s1", "source_ep1", "provenance"), ("s2", "source_ep1", "provenance"),
    ])


async def _validate(twins: Twins) -> ValidationReport:
    """Validates both; asserts equal reports and rows; returns the report."""
    reports = await twins.both(
        lambda m, sql: m.validate(sql, REPO, DIM),
    )
    assert reports[1] == reports[0]
    await twins.assert_same_rows()
    return reports[1]


async def test_validate_a_healthy_graph_as_sqlite_does(twins: Twins) -> None:
    """Nothing wrong: the same clean report on both backends."""
    await _trajectory(twins)
    report = await _validate(twins)
    assert report.ok
    assert report.episodic == 2


async def test_validate_relinks_steps_as_sqlite_does(twins: Twins) -> None:
    """A step without its subgoal link gets its sibling's subgoal, steps without a source get
    `source_<episode_id>`, a step whose trajectory has no subgoal stays unlinked; equal reports
    and rows on both backends, and a second run finds only the unrepairable step."""
    await _trajectory(twins)
    await twins.insert([
        Row("s3", N.EPISODIC, "gave up", {"trajectory_id": "t9", "episode_id": "ep1"}, axis(5)),
    ], [("s3", "source_ep1", "provenance")])
    await twins.sql("DELETE FROM links WHERE dst = 's2' AND type = 'hierarchical'",
                    sqlite="DELETE FROM links WHERE dst = (SELECT rowid FROM nodes"
                    " WHERE id = 's2') AND type = 'hierarchical'")
    await twins.sql("DELETE FROM links WHERE src IN ('s1', 's2') AND type = 'provenance'",
                    sqlite="DELETE FROM links WHERE src IN (SELECT rowid FROM nodes"
                    " WHERE id IN ('s1', 's2')) AND type = 'provenance'")
    report = await _validate(twins)
    assert (report.missing_subgoal, report.missing_source, report.links_restored) == (2, 2, 3)
    rows = await twins.assert_same_rows()
    assert ("r", "subgoal_t1", "s2", "hierarchical") in rows.links
    assert ("r", "s1", "source_ep1", "provenance") in rows.links
    again = await _validate(twins)
    assert (again.missing_subgoal, again.missing_source, again.links_restored) == (1, 0, 0)


async def test_validate_reports_missing_and_bad_vectors_as_sqlite_does(twins: Twins) -> None:
    """A node without a vector and a vector of the wrong dimension are reported on every run,
    equally on both backends."""
    await _trajectory(twins)
    await twins.insert([Row("short", N.SEMANTIC, "short vector", {}, [1.0, 0.0, 0.0])], [])
    await twins.sql("DELETE FROM vectors WHERE node_id = 's1'", sqlite=(
        "DELETE FROM vectors WHERE node = (SELECT rowid FROM nodes WHERE id = 's1')"))
    for _ in range(2):
        report = await _validate(twins)
        assert (report.missing_vectors, report.bad_vectors) == (1, 1)
        assert not report.ok


async def test_validate_recomputes_stale_search_columns(own_twins: Twins) -> None:
    """PostgreSQL only: once the text search configuration changed, stored search vectors
    disagree with their text; validate recomputes them, and the next run finds none."""
    await _trajectory(own_twins)
    assert await own_twins.pg_search("opened") == ["s2"]
    async with own_twins.pg.connection() as conn:
        await conn.execute(
            "ALTER TEXT SEARCH CONFIGURATION mnemo_english"
            " ALTER MAPPING FOR asciiword WITH simple"
        )
    assert await own_twins.pg_search("opened") == []
    async with own_twins.pg.transaction() as conn:
        report = await PgMaintenance().validate(PgStatements(conn), REPO, DIM)
    assert report.fts_rebuilt
    assert await own_twins.pg_search("opened") == ["s2"]
    async with own_twins.pg.transaction() as conn:
        assert not (await PgMaintenance().validate(PgStatements(conn), REPO, DIM)).fts_rebuilt
