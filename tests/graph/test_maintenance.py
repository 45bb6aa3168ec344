"""Maintenance: consolidate, decay and validate_episodic, the value function, and that none of
them loses a commit that runs at the same time."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from hypothesis import given, strategies as st
from sqlite_utils import Database as SqliteUtilsDatabase

import mnemo
from mnemo.config import Config
from mnemo.graph import history, maintenance, model
from mnemo.graph.commit import CommitTarget
from mnemo.graph.maintenance import (
    ConsolidationReport,
    DecayReport,
    consolidate,
    decay,
    validate_episodic,
)
from mnemo.graph.model import (
    Changeset,
    CommitReceipt,
    Link,
    LinkType,
    NodeDraft,
    NodeType,
    Vector,
    node_value,
    normalise_label,
    now_utc,
)
from mnemo.graph.ports import GraphStore
from mnemo.storage.ports import Backend
from tests.backends import is_sqlite, link_end, links_table, open_stores, sql, vector_of
from tests.fakes import sqlite_database
from tests.graph._support import DIM, REPO, at_cosine, axis, draft, policy

N = NodeType
MEMBERSHIP, HIERARCHICAL = LinkType.MEMBERSHIP, LinkType.HIERARCHICAL
PROVENANCE, SIBLING = LinkType.PROVENANCE, LinkType.SIBLING
CONFIG = Config()
T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def commit(graph: GraphStore, name: str, nodes: list[NodeDraft], links: list[Link]) -> None:
    await graph.apply(Changeset(name, REPO, nodes, links), intents=policy())


def fact(node_id: str, text: str, vector: Vector, confidence: float, *concepts: str) -> NodeDraft:
    return draft(
        node_id, N.SEMANTIC, text, vector, {"confidence": confidence, "concepts": list(concepts)}
    )


async def links_of(backend: Backend, node_id: str) -> list[tuple[str, str, str]]:
    rows = await sql(
        backend,
        f"SELECT src, dst, type FROM {links_table(backend)} WHERE src = ? OR dst = ?"
        " ORDER BY src, dst, type",
        node_id,
        node_id,
    )
    return [(src, dst, kind) for src, dst, kind in rows]


async def ids(backend: Backend) -> set[str]:
    return {row[0] for row in await sql(backend, "SELECT id FROM nodes")}


# ---- the value function ---------------------------------------------------------------------


def test_value_of_a_new_node_is_floor_times_reward() -> None:
    """Never recalled and brand new: frequency floor x the type's softened reward."""
    value = node_value(
        N.EPISODIC,
        {"reward": 1.0},
        created_at=T0,
        last_access=None,
        access_count=0,
        now=T0,
        config=CONFIG,
    )
    assert value == pytest.approx(0.5)
    failed = node_value(
        N.EPISODIC,
        {"reward": 0.0},
        created_at=T0,
        last_access=None,
        access_count=0,
        now=T0,
        config=CONFIG,
    )
    assert failed == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("kind", "data", "expected"),
    [
        (N.EPISODIC, {"reward": 0.6}, 0.8),
        (N.PROCEDURAL, {"return_score": 8}, 0.9),
        (N.SEMANTIC, {"confidence": 0.2}, 0.6),
        (N.SEMANTIC, {}, 0.75),
        (N.EPISODIC, {"reward": None}, 0.75),
        (N.TAG, {}, 1.0),
        (N.SEMANTIC, {"confidence": 7.0}, 1.0),
    ],
)
def test_reward_per_type(kind: NodeType, data: dict[str, Any], expected: float) -> None:
    """Reward: step reward, return score / 10, confidence; 0.5 when missing; clamped."""
    assert model.reward(kind, data) == pytest.approx(expected)


def test_recency_halves_per_half_life_and_restarts_at_access() -> None:
    """One half-life later a node is worth half; an access restarts the clock, and ten
    accesses lift the frequency factor to 1."""
    later = T0 + timedelta(days=CONFIG.recency_half_life_days)

    def value(last: datetime | None, count: int, now: datetime = later) -> float:
        return node_value(
            N.TAG, {}, created_at=T0, last_access=last, access_count=count, now=now, config=CONFIG
        )

    assert value(None, 0) == pytest.approx(0.25)
    assert value(later, 0) == pytest.approx(0.5)
    assert value(later, 10) == pytest.approx(1.0)
    assert value(later, 1) == pytest.approx(0.5)  # log2 / log 11 < the floor
    assert value(None, 0, now=later.replace(tzinfo=None)) == pytest.approx(0.25)


_MOMENTS = st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2030, 1, 1),
                       timezones=st.sampled_from([UTC, None]))


@given(kind=st.sampled_from(list(N)), created=_MOMENTS, last=st.none() | _MOMENTS,
       now=_MOMENTS, count=st.integers(-2, 50),
       data=st.dictionaries(st.sampled_from(["reward", "confidence", "return_score"]),
                            st.none() | st.integers(-5, 20) | st.floats(allow_nan=True)))
def test_value_is_recency_times_frequency_times_reward(
    kind: NodeType, created: datetime, last: datetime | None, now: datetime, count: int,
    data: dict[str, Any],
) -> None:
    """`node_value` is its definition to the last bit: recency from the later of creation
    and last access in whole hours, times the frequency factor, times the reward (naive times
    as UTC)."""
    def utc(moment: datetime) -> datetime:
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment

    seen = utc(created) if last is None else max(utc(created), utc(last))
    age = (utc(now) - seen).total_seconds() // 3600 / 24
    recency = 2.0 ** (-max(age, 0.0) / CONFIG.recency_half_life_days)
    frequency = max(CONFIG.frequency_floor, min(1.0, math.log1p(max(count, 0)) / math.log1p(10)))
    expected = recency * frequency * model.reward(kind, data)
    found = node_value(kind, data, created_at=created, last_access=last, access_count=count,
                       now=now, config=CONFIG)
    assert found == expected or (math.isnan(found) and math.isnan(expected))


# ---- consolidate ----------------------------------------------------------------------------


@pytest.fixture
async def kitchen(graph: GraphStore, backend: Backend) -> GraphStore:
    """A (older, surer) and B (cos 0.9 to A) say the same; C differs; "lonely" links nothing."""
    await commit(
        graph,
        "c1",
        [
            fact("A", "the kettle is in the kitchen", axis(0), 0.9, "kitchen"),
            draft("T1", N.TAG, "kitchen"),
            draft("E1", N.EPISODIC, "looked in the kitchen", axis(5), {"reward": 1.0}),
        ],
        [Link("T1", "A", MEMBERSHIP), Link("A", "E1", PROVENANCE)],
    )
    await commit(
        graph,
        "c2",
        [
            fact(
                "B", "kettle sits in the kitchen cupboard", at_cosine(0.9), 0.6, "kettle", "kitchen"
            ),
            draft("T2", N.TAG, "kettle"),
            draft("T1b", N.TAG, "Kitchen"),
            fact("C", "the garden has a shed", axis(3), 0.7, "garden"),
            draft("E2", N.EPISODIC, "opened the cupboard", axis(6), {"reward": 1.0}),
        ],
        [
            Link("T2", "B", MEMBERSHIP),
            Link("T1b", "B", MEMBERSHIP),
            Link("B", "E2", PROVENANCE),
            Link("B", "C", SIBLING),
            Link("C", "A", SIBLING),
            Link("B", "A", SIBLING),
        ],
    )
    await commit(graph, "c3", [draft("lonely", N.TAG, "lonely")], [])
    await sql(
        backend, "UPDATE nodes SET access_count = 2, last_access = ? WHERE id = 'A'", T0.isoformat()
    )
    await sql(
        backend,
        "UPDATE nodes SET access_count = 3, last_access = ? WHERE id = 'B'",
        (T0 + timedelta(days=1)).isoformat(),
    )
    return graph


async def test_consolidate_never_merges_nodes_of_two_scopes(
    graph: GraphStore, backend: Backend
) -> None:
    """Two near-duplicate facts of two scopes (metadata) both stay (of one scope, the second
    already joined the first when committed)."""
    for name, node, user in (("s1", "A", "alice"), ("s2", "B", "bob"), ("s3", "C", "bob")):
        vector = axis(0) if node == "A" else at_cosine(0.9)
        await graph.apply(Changeset(name, REPO, [fact(node, "the kettle is blue", vector, 0.9)],
                                    metadata={"user_id": user}), intents=policy())
    assert {"A", "B", "C"} & await ids(backend) == {"A", "B"}
    report = await consolidate(graph, REPO, CONFIG)
    assert report.merged == 0
    assert {"A", "B", "C"} & await ids(backend) == {"A", "B"}


async def test_consolidate_merges_duplicates_keeping_links_and_metadata(
    kitchen: GraphStore, backend: Backend
) -> None:
    """B folds into A: A gets B's links (no duplicate, no self-link), the union of concepts,
    the higher confidence and summed accesses; B's row, vector and search entry go, and so
    does the tag nothing links."""
    graph = kitchen
    report = await consolidate(graph, REPO, CONFIG)
    assert report == ConsolidationReport(examined=3, merged=1, links_moved=2, tags_pruned=1)
    assert await ids(backend) == {"A", "C", "T1", "T2", "E1", "E2"}
    record = (await history.history(graph, REPO, 10))[0]
    assert (record.maintenance, record.removed, record.node_ids) == ("consolidate",
                                                                     ("B", "lonely"), ())
    assert await links_of(backend, "A") == [
        ("A", "E1", "provenance"),
        ("A", "E2", "provenance"),
        ("C", "A", "sibling"),
        ("T1", "A", "membership"),
        ("T2", "A", "membership"),
    ]
    [a] = await graph.get_nodes(REPO, ["A"])
    assert a.text == "the kettle is in the kitchen"
    assert a.data == {"concepts": ["kitchen", "kettle"], "confidence": 0.9, "merged_from": ["B"]}
    assert await sql(backend, "SELECT access_count, last_access FROM nodes WHERE id = 'A'") == [
        (5, (T0 + timedelta(days=1)).isoformat())
    ]
    assert [n for n, _ in await graph.search_text(REPO, "cupboard", 10)] == ["E2"]
    assert "B" not in {n for n, _ in await graph.search_vectors(REPO, at_cosine(0.9), 10)}
    left = await sql(backend, "SELECT count(*) FROM vectors WHERE " + vector_of("B", backend))
    assert left == [(0,)]


async def test_consolidate_compares_new_nodes_only_unless_full(
    kitchen: GraphStore, backend: Backend
) -> None:
    """A second run compares nothing; a new duplicate is compared and merged; `full`
    compares everything again."""
    graph = kitchen
    await consolidate(graph, REPO, CONFIG)
    records = len(await history.history(graph, REPO, 100))
    assert await consolidate(graph, REPO, CONFIG) == ConsolidationReport(0, 0, 0, 0)
    assert len(await history.history(graph, REPO, 100)) == records  # nothing changed
    await commit(
        graph, "c4", [fact("D", "a shed stands in the garden", at_cosine(0.95, 3, 4), 0.5)], []
    )
    assert await consolidate(graph, REPO, CONFIG) == ConsolidationReport(1, 1, 0, 0)
    assert "D" not in await ids(backend)
    assert (await consolidate(graph, REPO, CONFIG, full=True)).examined == 2


@pytest.mark.parametrize(("cos", "merged"), [(0.86, 1), (0.84, 0)])
async def test_consolidate_threshold(graph: GraphStore, cos: float, merged: int) -> None:
    """Raw cosine at or above 0.85 merges; below it does not."""
    await commit(
        graph, "c", [fact("X", "x", axis(0), 0.5), fact("Y", "y", at_cosine(cos), 0.5)], []
    )
    assert (await consolidate(graph, REPO, CONFIG)).merged == merged


@pytest.mark.parametrize(("other", "merged"), [
    ("Invoice 1043 was paid.", 0), ("Invoice 1042 was not paid.", 0),
    ("Invoice 1042 has been paid.", 1)])
async def test_consolidate_never_merges_facts_that_differ_in_a_number_or_a_negation(
    graph: GraphStore, other: str, merged: int
) -> None:
    """One vector apart is not one fact when a number or a negation differs (a cosine barely
    weighs them): those stay two nodes; a rewording merges."""
    await commit(graph, "c", [fact("X", "Invoice 1042 was paid.", axis(0), 0.5),
                              fact("Y", other, at_cosine(0.99), 0.5)], [])
    assert (await consolidate(graph, REPO, CONFIG)).merged == merged


async def test_survivor_is_the_most_confident_then_the_oldest(
    graph: GraphStore, backend: Backend
) -> None:
    """A younger but surer node survives; between equals the older one does."""
    await commit(graph, "c1", [fact("old", "o", axis(0), 0.4)], [])
    await commit(graph, "c2", [fact("sure", "s", at_cosine(0.9), 0.8)], [])
    await commit(graph, "c3", [fact("p", "p", axis(2), 0.5)], [])
    await commit(graph, "c4", [fact("q", "q", at_cosine(0.9, 2, 3), 0.5)], [])
    await consolidate(graph, REPO, CONFIG)
    assert await ids(backend) == {"sure", "p"}


async def test_no_merge_chains(graph: GraphStore, backend: Backend) -> None:
    """X~Y and Y~Z but not X~Z: Y joins X, and Z stays (it is not similar to X)."""
    angle = math.radians(25)

    def at(theta: float) -> Vector:
        return np.array([math.cos(theta), math.sin(theta), 0, 0, 0, 0, 0, 0], dtype=np.float32)

    await commit(
        graph,
        "c",
        [
            fact("X", "x", at(0), 0.5),
            fact("Y", "y", at(angle), 0.5),
            fact("Z", "z", at(2 * angle), 0.5),
        ],
        [],
    )
    report = await consolidate(graph, REPO, CONFIG)
    assert report.merged == 1
    assert await ids(backend) == {"X", "Z"}


@pytest.mark.parametrize("seed", range(5))
def test_similar_pairs_blockwise_matches_brute_force(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Tiny blocks find exactly the pairs a double loop finds, each once, new rows only."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(4, 8))
    points = centres[rng.integers(0, 4, 60)] + 0.25 * rng.normal(size=(60, 8))
    matrix = (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)
    new = np.sort(rng.choice(60, size=25, replace=False)).astype(np.int64)
    monkeypatch.setattr(maintenance, "_BLOCK_CELLS", 130)
    found = maintenance._similar_pairs(matrix, new, 0.85)
    fresh = set(new.tolist())
    expected = {
        (i, j) if i in fresh else (j, i)
        for i in range(60)
        for j in range(i + 1, 60)
        if (i in fresh or j in fresh) and float(matrix[i] @ matrix[j]) >= 0.85
    }
    assert len(found) == len(set(found))
    assert set(found) == expected


# ---- decay ----------------------------------------------------------------------------------


async def test_decay_deletes_the_worthless_and_prunes_orphaned_routes(
    graph: GraphStore, backend: Backend
) -> None:
    """Sixty days on: a failed step and an unsure fact go, with the tag, subgoal and source
    that only they used; a recalled fact, a fresh procedure and its intent stay."""
    await commit(
        graph,
        "c",
        [
            draft("src", N.SOURCE, "episode goal", axis(1)),
            draft("sg", N.SUBGOAL, "find the kettle", axis(2)),
            draft("step", N.EPISODIC, "looked around", axis(3), {"reward": 0.0}),
            fact("unsure", "maybe the kettle is blue", axis(4), 0.0, "colour"),
            draft("colour", N.TAG, "colour"),
            fact("known", "the kettle is in the kitchen", axis(5), 1.0, "kitchen"),
            draft("kitchen", N.TAG, "kitchen"),
            fact("plain", "the kitchen has a window", axis(0), 1.0),
            draft("proc", N.PROCEDURAL, "boil water first", axis(6), {"return_score": 2}),
            draft("intent", N.INTENT, "make tea", axis(7)),
        ],
        [
            Link("sg", "step", HIERARCHICAL),
            Link("step", "src", PROVENANCE),
            Link("unsure", "step", PROVENANCE),
            Link("colour", "unsure", MEMBERSHIP),
            Link("kitchen", "known", MEMBERSHIP),
            Link("intent", "proc", HIERARCHICAL),
        ],
    )
    now = T0 + timedelta(days=60)
    await sql(backend, "UPDATE nodes SET created_at = ?", T0.isoformat())
    await sql(
        backend,
        "UPDATE nodes SET created_at = ? WHERE id = 'proc'",
        (now - timedelta(days=1)).isoformat(),
    )
    await sql(
        backend,
        "UPDATE nodes SET access_count = 4, last_access = ? WHERE id = 'known'",
        (now - timedelta(days=2)).isoformat(),
    )
    [(found_id, score)] = await graph.search_vectors(REPO, axis(3), 1)
    assert found_id == "step"
    assert score == pytest.approx(1.0)
    report = await decay(graph, REPO, CONFIG, now=now)
    assert report == DecayReport(examined=5, deleted=2, pruned=3)
    assert await ids(backend) == {"known", "kitchen", "plain", "proc", "intent"}
    assert "step" not in {n for n, _ in await graph.search_vectors(REPO, axis(3), 10)}
    assert await graph.search_text(REPO, "blue", 5) == []
    later = await decay(graph, REPO, CONFIG, now=now + timedelta(days=365))
    assert later == DecayReport(examined=3, deleted=3, pruned=2)
    assert await ids(backend) == set()


# ---- validate -------------------------------------------------------------------------------


@pytest.fixture
async def trajectory(graph: GraphStore) -> GraphStore:
    """One episode "ep1": source, subgoal of trajectory "t1", two steps."""
    return await _trajectory(graph)


async def _trajectory(graph: GraphStore) -> GraphStore:
    step = {"trajectory_id": "t1", "episode_id": "ep1", "reward": 1.0}
    await commit(
        graph,
        "c",
        [
            draft("source_ep1", N.SOURCE, "tidy the kitchen", axis(1)),
            draft("subgoal_t1", N.SUBGOAL, "find the kettle", axis(2)),
            draft("s1", N.EPISODIC, "walked to the kitchen", axis(3), step),
            draft("s2", N.EPISODIC, "opened the cupboard", axis(4), step),
        ],
        [
            Link("subgoal_t1", "s1", HIERARCHICAL),
            Link("subgoal_t1", "s2", HIERARCHICAL),
            Link("s1", "source_ep1", PROVENANCE),
            Link("s2", "source_ep1", PROVENANCE),
        ],
    )
    return graph


async def test_validate_a_healthy_graph(trajectory: GraphStore) -> None:
    """Nothing wrong, nothing done."""
    report = await validate_episodic(trajectory, REPO)
    assert report.ok
    assert report.episodic == 2
    assert [c.maintenance for c in await history.history(trajectory, REPO, 10)] == [None]


async def test_validate_relinks_steps(trajectory: GraphStore, backend: Backend) -> None:
    """A step without its subgoal link gets its sibling's subgoal; steps without a source get
    `source_<episode_id>`."""
    graph = trajectory
    await sql(backend, f"DELETE FROM links WHERE dst = {link_end('s2', backend)}"
              " AND type = 'hierarchical'")
    await sql(backend, "DELETE FROM links WHERE type = 'provenance'")
    report = await validate_episodic(graph, REPO)
    assert (report.missing_subgoal, report.missing_source, report.links_restored) == (1, 2, 3)
    assert not report.ok
    assert [c.maintenance for c in await history.history(graph, REPO, 10)] == [
        "validate_episodic", None]
    assert (await validate_episodic(graph, REPO)).ok
    assert ("subgoal_t1", "s2", "hierarchical") in await links_of(backend, "s2")
    assert ("s1", "source_ep1", "provenance") in await links_of(backend, "s1")


async def test_validate_removes_dangling_links(trajectory: GraphStore, backend: Backend) -> None:
    """A link to a node that does not exist (foreign keys were off) is counted and deleted."""
    graph = trajectory

    if is_sqlite(backend):

        def sneak(db: SqliteUtilsDatabase) -> None:
            db.conn.execute("PRAGMA foreign_keys=OFF")
            db.conn.execute("INSERT INTO links(src, dst, type)"
                            " SELECT rowid, 1000000, 'provenance' FROM nodes WHERE id = 's1'")
            db.conn.commit()
            db.conn.execute("PRAGMA foreign_keys=ON")

        await sqlite_database(backend).run(sneak)
    else:
        # PostgreSQL enforces the foreign key for anyone but a superuser replicating rows.
        await sql(backend, "SET LOCAL session_replication_role = replica;"
                  " INSERT INTO links VALUES ('r', 's1', 'ghost', 'provenance')")
    report = await validate_episodic(graph, REPO)
    assert report.dangling_links == 1
    assert (await validate_episodic(graph, REPO)).ok


async def test_validate_reports_missing_and_bad_vectors(
    trajectory: GraphStore, backend: Backend
) -> None:
    """Vectors cannot be made again here: missing and wrong-size ones are reported, each run."""
    graph = trajectory
    await sql(backend, "DELETE FROM vectors WHERE " + vector_of("s1", backend))
    wrong = "zeroblob(12)" if is_sqlite(backend) else "'[0, 0, 0]'"
    await sql(backend, f"UPDATE vectors SET vec = {wrong} WHERE " + vector_of("s2", backend))
    bad = 1
    for _ in range(2):
        report = await validate_episodic(graph, REPO)
        assert (report.missing_vectors, report.bad_vectors) == (1, bad)


async def test_validate_rebuilds_the_search_index(tmp_path: Path) -> None:
    """SQLite: a search entry that went missing (FTS5 keeps them in a table of their own)
    makes the integrity check fail: the index is rebuilt and the node can be found again. On
    PostgreSQL a node's search entry is a generated column of its row and cannot go missing.
    Without the lexical index, which would answer instead of FTS5."""
    async with open_stores(str(tmp_path / "g.db"), DIM, lexical_dir="") as backend:
        graph = await _trajectory(backend.graph)
        await sql(
            backend,
            "INSERT INTO nodes_fts(nodes_fts, rowid, text) SELECT 'delete',"
            " rowid, text FROM nodes WHERE id = 's2'",
        )
        assert await graph.search_text(REPO, "cupboard", 5) == []
        report = await validate_episodic(graph, REPO)
        assert report.fts_rebuilt
        assert [n for n, _ in await graph.search_text(REPO, "cupboard", 5)] == ["s2"]
        assert not (await validate_episodic(graph, REPO)).fts_rebuilt


# ---- no commit is lost ----------------------------------------------------------------------

DIM64 = 64


def random_unit(rng: random.Random) -> Vector:
    vector = np.array([rng.gauss(0, 1) for _ in range(DIM64)], dtype=np.float32)
    return vector / np.linalg.norm(vector)


def episode(k: int, topic: int, rng: random.Random, *, keep: bool) -> Changeset:
    """A step, its subgoal and source, and a fact tagged "Topic <topic>". A kept episode
    succeeded and is sure of its fact (worth 0.18 after 45 days); a doomed one failed and is
    unsure (worth 0.09: decay deletes it)."""
    label = f"Topic {topic}"
    score = 1.0 if keep else 0.0
    nodes = [
        NodeDraft(f"src{k}", N.SOURCE, f"goal {k}", {}, random_unit(rng)),
        NodeDraft(f"sg{k}", N.SUBGOAL, f"subgoal {k}", {}, random_unit(rng)),
        NodeDraft(f"e{k}", N.EPISODIC, f"step {k}", {"reward": score}, random_unit(rng)),
        NodeDraft(
            f"f{k}",
            N.SEMANTIC,
            f"fact {k}",
            {"confidence": score, "concepts": [label]},
            random_unit(rng),
        ),
        NodeDraft(f"t{k}", N.TAG, label, {}, random_unit(rng), key=normalise_label(label)),
    ]
    links = [
        Link(f"sg{k}", f"e{k}", HIERARCHICAL),
        Link(f"e{k}", f"src{k}", PROVENANCE),
        Link(f"f{k}", f"e{k}", PROVENANCE),
        Link(f"t{k}", f"f{k}", MEMBERSHIP),
    ]
    return Changeset(f"cs{k}", REPO, nodes, links)


@pytest.mark.slow
async def test_maintenance_never_loses_a_concurrent_commit(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Consolidate and decay (45 days on) run over and over while 80 episodes commit in waves
    of 8 sharing a topic, half of them doomed: decay keeps deleting the doomed facts and
    pruning the tag they leave, which the wave's other commits are resolving. Every kept
    episode is there afterwards with its links and its tag; every doomed one went.

    Without the lock this fails: a commit that found the tag links to it after decay pruned
    it (FOREIGN KEY constraint failed)."""
    async with open_stores(store, DIM64) as backend:
        await _never_lose_a_commit(backend, monkeypatch)


async def _never_lose_a_commit(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = backend.graph
    # Every graph store is also the commit procedure's target, which has `present`.
    lookup = cast(CommitTarget, graph).present

    async def slow_lookup(repo: str, node_ids: list[str]) -> set[str]:
        # Widens the gap between a commit's reads (tag owners) and its write, where
        # maintenance would slip in if it did not take the repo's lock.
        await anyio.sleep(0.002)
        return await lookup(repo, node_ids)

    monkeypatch.setattr(graph, "present", slow_lookup)
    rng = random.Random(7)
    for k in range(100, 120):
        await graph.apply(episode(k, k % 20, rng, keep=False), intents=policy())
    base = random_unit(rng)
    await graph.apply(
        Changeset(
            "dups",
            REPO,
            [
                NodeDraft(
                    f"dup{i}",
                    N.SEMANTIC,
                    f"the same fact, {word}",
                    {"confidence": 1.0},
                    base + 0.05 * random_unit(rng),
                )
                for i, word in enumerate(("alpha", "beta", "gamma", "delta"))
            ],
        ),
        intents=policy(),
    )
    receipts: list[CommitReceipt] = []
    committed = anyio.Event()
    order: list[str] = []
    # The last wave waits for a maintenance round that began after the first commit, so
    # maintenance runs between commits however the threads are scheduled.
    round_after_first_commit = anyio.Event()

    async def commit_one(k: int) -> None:
        wave = k // 8
        await anyio.sleep(0.02 * wave + rng.random() * 0.002)
        if wave == 9:
            await round_after_first_commit.wait()
        changeset = episode(k, wave, rng, keep=k % 2 == 0)
        receipts.append(await graph.apply(changeset, intents=policy()))
        order.append("commit")

    async def maintain() -> None:
        while not committed.is_set():
            after_a_commit = "commit" in order
            await consolidate(graph, REPO, CONFIG)
            order.append("consolidate")
            await decay(graph, REPO, CONFIG, now=now_utc() + timedelta(days=45))
            order.append("decay")
            if after_a_commit:
                round_after_first_commit.set()
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(maintain)
        async with anyio.create_task_group() as commits:
            for k in range(80):
                commits.start_soon(commit_one, k)
        committed.set()
    await consolidate(graph, REPO, CONFIG)
    await decay(graph, REPO, CONFIG, now=now_utc() + timedelta(days=45))

    assert len(receipts) == 80
    # Maintenance really ran between commits, not just before or after them all.
    first, last = order.index("commit"), len(order) - order[::-1].index("commit")
    assert {"consolidate", "decay"} <= set(order[first:last])
    present = await ids(backend)
    for k in range(0, 80, 2):
        assert {f"src{k}", f"sg{k}", f"e{k}", f"f{k}"} <= present
        assert set(await links_of(backend, f"e{k}")) >= {
            (f"sg{k}", f"e{k}", "hierarchical"),
            (f"e{k}", f"src{k}", "provenance"),
            (f"f{k}", f"e{k}", "provenance"),
        }
        tags = [src for src, dst, kind in await links_of(backend, f"f{k}") if kind == "membership"]
        [tag] = await graph.get_nodes(REPO, tags)
        assert normalise_label(tag.text) == f"topic {k // 8}"
    doomed = [*range(1, 80, 2), *range(100, 120)]
    assert not present & {f"{kind}{k}" for k in doomed for kind in ("src", "sg", "e", "f")}
    assert len(present & {f"dup{i}" for i in range(4)}) == 1
    assert (await validate_episodic(graph, REPO)).ok
    # Topics 10-19 were only ever used by doomed facts: their tags went with them.
    rows = await sql(backend, "SELECT key FROM nodes WHERE type = 'tag'")
    assert sorted(row[0] for row in rows) == sorted(f"topic {t}" for t in range(10))


# ---- through Memory -------------------------------------------------------------------------


async def test_memory_maintenance_methods(store: str) -> None:
    """`Memory.consolidate`, `decay` and `validate_episodic` work on an ingested trajectory,
    and raise NotFoundError for an unknown repo."""
    trajectory = mnemo.Trajectory(
        "make tea",
        [
            mnemo.Step("The kettle is in the kitchen.", "walk to the kitchen"),
            mnemo.Step("The kettle is full of water.", "switch the kettle on"),
        ],
    )
    async with mnemo.Memory(store) as mem:
        await mem.open_repo("r")
        receipt = await mem.ingest("r", trajectory, source_id="tea")
        assert (await mem.validate_episodic("r")).ok
        assert (await mem.consolidate("r")).examined >= 1
        far = datetime.now(UTC) + timedelta(days=3650)
        report = await mem.decay("r", now=far)
        assert report.deleted >= 2
        assert [n for n in receipt.node_ids if await mem.get_node("r", n)] == []
        decayed, ingested = await mem.history("r")
        assert (decayed.maintenance, ingested.source_id) == ("decay", "tea")
        assert set(receipt.node_ids) <= set(decayed.removed)
        assert len(decayed.removed) == report.deleted + report.pruned
        with pytest.raises(mnemo.ConflictError, match="maintenance"):
            await mem.revert("r", decayed.id)
        with pytest.raises(mnemo.NotFoundError):
            await mem.decay("nope")
