"""The graph store, on each backend: idempotent durable commits, deduplication, deletes,
search and reads."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, cast

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mnemo.errors import StorageError
from mnemo.graph import commit
from mnemo.graph.model import (
    Changeset,
    CommitReceipt,
    Link,
    LinkType,
    NodeType,
    Vector,
    normalise_label,
    now_utc,
)
from mnemo.graph.ports import GraphStore, Neighbor, SourceRecorded
from mnemo.storage.ports import Backend
from mnemo.storage.sqlite.graph import fts_query
from mnemo.text import MAX_QUERY_TERMS
from tests.backends import is_sqlite, link_end, links_table, open_stores, sql
from tests.graph._support import DIM, REPO, Merger, at_cosine, axis, draft, policy, rounded

MEMBERSHIP, HIERARCHICAL = LinkType.MEMBERSHIP, LinkType.HIERARCHICAL


async def counts(backend: Backend, repo: str = REPO) -> dict[str, int]:
    """How many nodes, links, vectors and search entries the repo has, read with SQL."""

    async def one(statement: str) -> int:
        return int((await sql(backend, statement, repo))[0][0])

    # SQLite's search entries are FTS5 rows beside the nodes; PostgreSQL's are a column of
    # the node's row, so a node has one when its search vector holds a word.
    searched = (
        "SELECT count(*) FROM nodes_fts f JOIN nodes n ON n.rowid = f.rowid WHERE n.repo = ?"
        if is_sqlite(backend)
        else "SELECT count(*) FROM nodes WHERE repo = ? AND length(search) > 0"
    )
    return {
        "nodes": await one("SELECT count(*) FROM nodes WHERE repo = ?"),
        "links": await one(f"SELECT count(*) FROM {links_table(backend)} WHERE repo = ?"),
        "vectors": await one(
            "SELECT count(*) FROM vectors v JOIN nodes n ON n.rowid = v.node WHERE n.repo = ?"
            if is_sqlite(backend) else "SELECT count(*) FROM vectors WHERE repo = ?"),
        "fts": await one(searched),
    }


def fact_with_tag(prefix: str, fact: str, label: str, vector_axis: int = 0) -> Changeset:
    """A changeset of one SEMANTIC fact and one TAG linked to it by MEMBERSHIP."""
    return Changeset(
        f"{prefix}-cs",
        REPO,
        [
            draft(f"{prefix}-fact", NodeType.SEMANTIC, fact, axis(vector_axis)),
            draft(f"{prefix}-tag", NodeType.TAG, label),
        ],
        [Link(f"{prefix}-tag", f"{prefix}-fact", MEMBERSHIP)],
    )


def procedure_with_intent(prefix: str, intent: str, vector: Vector) -> Changeset:
    """A changeset of one PROCEDURAL node and its INTENT, linked by HIERARCHICAL."""
    return Changeset(
        f"{prefix}-cs",
        REPO,
        [
            draft(f"{prefix}-intent", NodeType.INTENT, intent, vector),
            draft(f"{prefix}-proc", NodeType.PROCEDURAL, f"steps for {prefix}", axis(7)),
        ],
        [Link(f"{prefix}-intent", f"{prefix}-proc", HIERARCHICAL)],
    )


def targets(neighbors: list[Neighbor]) -> set[str]:
    return {n.node_id for n in neighbors}


# Idempotence, atomicity, durability


async def test_apply_twice_returns_the_same_receipt_and_adds_nothing(
    graph: GraphStore, backend: Backend
) -> None:
    """Applying the same changeset again returns the first receipt and stores nothing more."""
    changeset = fact_with_tag("a", "nginx listens on port 8080", "nginx")
    first = await graph.apply(changeset, intents=policy())
    after_first = await counts(backend)
    second = await graph.apply(changeset, intents=policy())
    assert second == first
    assert first.node_ids == ["a-fact", "a-tag"]
    assert await graph.receipt(changeset.id) == first
    assert await counts(backend) == after_first == {"nodes": 2, "links": 1, "vectors": 2, "fts": 2}



async def test_a_stored_receipt_reads_back_with_the_steps_its_changeset_lacked(
    graph: GraphStore,
) -> None:
    """A receipt read back from the store is the one applied, its `missing` step ids kept."""
    changeset = replace(fact_with_tag("m", "redis listens on port 6379", "redis"),
                        missing=["step-9"])
    first = await graph.apply(changeset, intents=policy())
    assert first.missing == ["step-9"]
    assert await graph.receipt(changeset.id) == first
    assert await graph.apply(changeset, intents=policy()) == first

async def test_concurrent_applies_of_one_changeset_apply_it_once(
    graph: GraphStore, backend: Backend
) -> None:
    """Many concurrent applies of one changeset all get the same receipt; it is stored once."""
    changeset = fact_with_tag("a", "nginx listens on port 8080", "nginx")
    receipts: list[CommitReceipt] = []

    async def apply() -> None:
        receipts.append(await graph.apply(changeset, intents=policy()))

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(apply)
    assert len({r.to_json() for r in receipts}) == 1
    assert (await counts(backend))["nodes"] == 2


async def test_side_writes_land_with_the_changeset(graph: GraphStore, backend: Backend) -> None:
    """A side write (here an ingested source recorded) is stored together with the changeset."""
    changeset = fact_with_tag("a", "a fact", "tag")
    record = SourceRecorded(REPO, "src-1", "hash", changeset.id, "2026-11-22T00:00:00+00:00")
    await graph.apply(changeset, intents=policy(), also=[record])
    found = await graph.ingested(REPO, "src-1")
    assert found is not None
    assert (found[0], found[1].node_ids) == ("hash", ["a-fact", "a-tag"])


async def test_failing_side_write_stores_nothing_of_the_changeset(
    graph: GraphStore, backend: Backend
) -> None:
    """When a side write fails (a source recorded twice), neither the changeset nor earlier
    side writes are stored, and the failure is a StorageError."""
    changeset = fact_with_tag("a", "nginx listens on port 8080", "nginx")
    record = SourceRecorded(REPO, "src-1", "hash", changeset.id, "2026-11-22T00:00:00+00:00")
    with pytest.raises(StorageError):
        await graph.apply(changeset, intents=policy(), also=[record, record])
    assert await graph.receipt(changeset.id) is None
    assert await counts(backend) == {"nodes": 0, "links": 0, "vectors": 0, "fts": 0}
    assert await graph.ingested(REPO, "src-1") is None
    assert await graph.search_vectors(REPO, axis(0), 5) == []
    assert await graph.search_text(REPO, "nginx", 5) == []
    # Nothing half-applied is left behind: the same changeset applies fully afterwards.
    receipt = await graph.apply(changeset, intents=policy())
    assert receipt.node_ids == ["a-fact", "a-tag"]
    assert [i for i, _ in await graph.search_vectors(REPO, axis(0), 1)] == ["a-fact"]


async def test_wrong_dimension_stores_nothing(
    graph: GraphStore, backend: Backend, store: str
) -> None:
    """A vector of another dimension raises ValueError before anything is written."""
    bad = Changeset(
        "bad",
        REPO,
        [
            draft("ok", NodeType.SEMANTIC, "fine", axis(0)),
            draft("wrong", NodeType.SEMANTIC, "too long", np.ones(DIM + 1, dtype=np.float32)),
        ],
    )
    with pytest.raises(ValueError, match="wrong"):
        await graph.apply(bad, intents=policy())
    assert await graph.receipt("bad") is None
    assert (await counts(backend))["nodes"] == 0
    # The repo still loads: a fresh store over the same database can search it.
    async with open_stores(store, DIM) as other:
        assert await other.graph.search_vectors(REPO, axis(0), 5) == []


async def test_commit_survives_reopening(store: str) -> None:
    """After closing and reopening the store, nodes, links, vectors, search and receipts
    remain."""
    changeset = fact_with_tag("a", "nginx listens on port 8080", "nginx", vector_axis=2)
    async with open_stores(store, DIM) as first:
        receipt = await first.graph.apply(changeset, intents=policy())

    async with open_stores(store, DIM) as again:
        graph = again.graph
        nodes = await graph.get_nodes(REPO, ["a-fact", "a-tag"])
        assert [(n.id, n.type, n.text) for n in nodes] == [
            ("a-fact", NodeType.SEMANTIC, "nginx listens on port 8080"),
            ("a-tag", NodeType.TAG, "nginx"),
        ]
        assert await graph.neighbors(REPO, ["a-tag"]) == [Neighbor("a-tag", "a-fact", MEMBERSHIP)]
        assert rounded(await graph.search_vectors(REPO, axis(2), 1)) == [("a-fact", 1.0)]
        assert [i for i, _ in await graph.search_text(REPO, "port", 5)] == ["a-fact"]
        assert await graph.receipt(changeset.id) == receipt
        assert await graph.apply(changeset, intents=policy()) == receipt
        assert (await counts(again))["nodes"] == 2


async def test_reinforcement_is_committed(store: str) -> None:
    """Access counts written by `reinforce` are there for a store opened afterwards."""
    changeset = fact_with_tag("a", "nginx listens on port 8080", "nginx", vector_axis=2)
    async with open_stores(store, DIM) as first:
        await first.graph.apply(changeset, intents=policy())
        for _ in range(3):
            await first.graph.reinforce(REPO, ["a-fact", "a-fact"], now_utc())
    async with open_stores(store, DIM) as again:
        stats = await again.graph.access_stats(REPO, ["a-fact", "a-tag"])
        assert stats["a-fact"][0] == 3
        assert stats["a-fact"][1] is not None
        assert stats["a-tag"][0] == 0


# Tag deduplication


async def test_tags_deduplicate_within_a_batch(graph: GraphStore, backend: Backend) -> None:
    """Tags of one batch with the same normalised label become one node holding every link."""
    labels = ["Nginx", " nginx ", "NGINX"]
    changeset = Changeset(
        "cs",
        REPO,
        [draft(f"fact{i}", NodeType.SEMANTIC, f"fact {i}", axis(i)) for i in range(3)]
        + [draft(f"tag{i}", NodeType.TAG, label) for i, label in enumerate(labels)],
        [Link(f"tag{i}", f"fact{i}", MEMBERSHIP) for i in range(3)],
    )
    receipt = await graph.apply(changeset, intents=policy())
    assert receipt.node_ids == ["fact0", "fact1", "fact2", "tag0"]
    tags = await graph.get_nodes_by_type(REPO, [NodeType.TAG])
    assert [t.id for t in tags] == ["tag0"]
    assert targets(await graph.neighbors(REPO, ["tag0"], MEMBERSHIP)) == {"fact0", "fact1", "fact2"}


async def test_tags_deduplicate_against_the_graph(graph: GraphStore, backend: Backend) -> None:
    """A tag whose label normalises to an existing tag's adds no node; its links go there."""
    await graph.apply(fact_with_tag("a", "nginx listens on 8080", "nginx", 0), intents=policy())
    receipt = await graph.apply(
        fact_with_tag("b", "nginx serves static files", " Nginx ", 1), intents=policy()
    )
    assert receipt.node_ids == ["b-fact"]
    assert [t.id for t in await graph.get_nodes_by_type(REPO, [NodeType.TAG])] == ["a-tag"]
    assert await graph.get_nodes(REPO, ["b-tag"]) == []
    assert targets(await graph.neighbors(REPO, ["a-tag"], MEMBERSHIP)) == {"a-fact", "b-fact"}
    assert await graph.neighbors(REPO, ["b-fact"]) == [Neighbor("b-fact", "a-tag", MEMBERSHIP)]
    assert (await counts(backend))["nodes"] == 3


async def test_tags_are_per_repo(graph: GraphStore) -> None:
    """The same label in another repo is another tag."""
    await graph.apply(fact_with_tag("a", "fact", "nginx"), intents=policy())
    other = Changeset("o-cs", "other", [draft("o-tag", NodeType.TAG, "nginx")])
    assert (await graph.apply(other, intents=policy())).node_ids == ["o-tag"]


# Intent deduplication


@pytest.mark.parametrize("similarity", [1.0, 0.97, 0.95])
async def test_identical_intent_is_dropped_and_linked_to_the_existing_one(
    graph: GraphStore, similarity: float
) -> None:
    """An intent at or above the identity threshold is dropped; its procedure links the old one.
    Exactly at it too: float32 vectors put that cosine at 0.94999999."""
    merger = Merger(("never used", axis(5)))
    await graph.apply(
        procedure_with_intent("a", "restart the web server", axis(0)), intents=policy(merger)
    )
    receipt = await graph.apply(
        procedure_with_intent("b", "restart the webserver", at_cosine(similarity)),
        intents=policy(merger),
    )
    assert receipt.node_ids == ["b-proc"]
    assert merger.calls == []
    intents = await graph.get_nodes_by_type(REPO, [NodeType.INTENT])
    assert [(n.id, n.text) for n in intents] == [("a-intent", "restart the web server")]
    assert targets(await graph.neighbors(REPO, ["a-intent"], HIERARCHICAL)) == {"a-proc", "b-proc"}


async def test_a_commit_asks_all_its_intent_merges_at_once(graph: GraphStore) -> None:
    """Two new intents, each close to another existing one: one call to the merger holds
    both pairs (one call a pair before), and each existing intent takes its merged wording."""
    merger = Merger(None)
    await graph.apply(procedure_with_intent("a", "restart the web server", axis(0)),
                      intents=policy(merger))
    await graph.apply(procedure_with_intent("c", "rotate the log files", axis(3)),
                      intents=policy(merger))
    both = Changeset("b-cs", REPO, [
        *procedure_with_intent("b", "reload nginx config", at_cosine(0.9)).nodes,
        *procedure_with_intent("d", "rotate logs daily", at_cosine(0.9, base=3, other=4)).nodes,
    ])
    await graph.apply(both, intents=policy(merger))
    assert merger.batches == 1
    assert sorted(merger.calls) == [("restart the web server", "reload nginx config"),
                                    ("rotate the log files", "rotate logs daily")]


async def test_an_intent_saying_nothing_more_joins_without_a_merge(graph: GraphStore) -> None:
    """Between the thresholds, a new intent whose words are all the existing one's ("Noted."
    after "Noted", "rotate logs" after "rotate the log files") joins it as it is: the merger
    is not asked, the existing wording stays."""
    merger = Merger(None)
    await graph.apply(procedure_with_intent("a", "rotate the log files", axis(0)),
                      intents=policy(merger))
    await graph.apply(procedure_with_intent("b", "Rotate logs.", at_cosine(0.9)),
                      intents=policy(merger))
    assert merger.calls == []
    intents = await graph.get_nodes_by_type(REPO, [NodeType.INTENT])
    assert [n.text for n in intents] == ["rotate the log files"]


async def test_similar_intent_is_merged_into_the_existing_one(
    graph: GraphStore, store: str
) -> None:
    """Between the thresholds the merger gets both wordings; the old node takes the merged one."""
    merged_vector = at_cosine(0.3, base=0, other=3)
    merger = Merger(("reload or restart nginx", merged_vector))
    await graph.apply(
        procedure_with_intent("a", "restart the web server", axis(0)), intents=policy(merger)
    )
    receipt = await graph.apply(
        procedure_with_intent("b", "reload nginx config", at_cosine(0.9)), intents=policy(merger)
    )
    assert merger.calls == [("restart the web server", "reload nginx config")]
    assert receipt.node_ids == ["b-proc"]
    [intent] = await graph.get_nodes_by_type(REPO, [NodeType.INTENT])
    assert (intent.id, intent.text) == ("a-intent", "reload or restart nginx")
    assert targets(await graph.neighbors(REPO, ["a-intent"], HIERARCHICAL)) == {"a-proc", "b-proc"}
    # The merged wording replaced the old one in both indexes.
    found = await graph.search_vectors(REPO, merged_vector, 1, [NodeType.INTENT])
    assert rounded(found) == [("a-intent", 1.0)]
    assert (await graph.search_vectors(REPO, axis(0), 1, [NodeType.INTENT]))[0][1] < 0.5
    assert [i for i, _ in await graph.search_text(REPO, "reload", 5)] == ["a-intent"]
    assert await graph.search_text(REPO, "server", 5) == []
    # And it is durable: a fresh index, loaded from the rows, has the merged vector too.
    async with open_stores(store, DIM) as other:
        found = await other.graph.search_vectors(REPO, merged_vector, 1)
    assert rounded(found) == [("a-intent", 1.0)]


async def test_failed_merge_keeps_the_existing_wording(graph: GraphStore, backend: Backend) -> None:
    """When the merger answers None the existing intent keeps its text and vector."""
    merger = Merger(None)
    await graph.apply(
        procedure_with_intent("a", "restart the web server", axis(0)), intents=policy(merger)
    )
    receipt = await graph.apply(
        procedure_with_intent("b", "reload nginx config", at_cosine(0.85)), intents=policy(merger)
    )
    assert merger.calls == [("restart the web server", "reload nginx config")]
    assert receipt.node_ids == ["b-proc"]
    [intent] = await graph.get_nodes_by_type(REPO, [NodeType.INTENT])
    assert (intent.id, intent.text) == ("a-intent", "restart the web server")
    found = await graph.search_vectors(REPO, axis(0), 1, [NodeType.INTENT])
    assert rounded(found) == [("a-intent", 1.0)]
    assert targets(await graph.neighbors(REPO, ["a-intent"], HIERARCHICAL)) == {"a-proc", "b-proc"}


async def test_dissimilar_intent_is_kept(graph: GraphStore) -> None:
    """Below the merge threshold a new intent is its own node, and the merger is not asked."""
    merger = Merger(("never used", axis(5)))
    await graph.apply(
        procedure_with_intent("a", "restart the web server", axis(0)), intents=policy(merger)
    )
    receipt = await graph.apply(
        procedure_with_intent("b", "back up the database", at_cosine(0.75)), intents=policy(merger)
    )
    assert merger.calls == []
    assert receipt.node_ids == ["b-intent", "b-proc"]
    intents = await graph.get_nodes_by_type(REPO, [NodeType.INTENT])
    assert [n.id for n in intents] == ["a-intent", "b-intent"]
    assert targets(await graph.neighbors(REPO, ["b-intent"])) == {"b-proc"}


async def test_intents_of_one_batch_deduplicate_among_themselves(graph: GraphStore) -> None:
    """Within one changeset a duplicate intent is dropped (i2 exactly at the identity threshold)
    and a similar one merged."""
    merged_vector = at_cosine(0.99)
    merger = Merger(("restart or reload nginx", merged_vector))
    changeset = Changeset(
        "cs",
        REPO,
        [
            draft("i1", NodeType.INTENT, "restart nginx", axis(0)),
            draft("i2", NodeType.INTENT, "restart nginx!", at_cosine(0.95)),
            draft("i3", NodeType.INTENT, "reload nginx", at_cosine(0.9)),
            draft("i4", NodeType.INTENT, "back up postgres", axis(4)),
        ]
        + [draft(f"p{i}", NodeType.PROCEDURAL, f"procedure {i}", axis(7)) for i in range(1, 5)],
        [Link(f"i{i}", f"p{i}", HIERARCHICAL) for i in range(1, 5)],
    )
    receipt = await graph.apply(changeset, intents=policy(merger))
    assert merger.calls == [("restart nginx", "reload nginx")]
    assert receipt.node_ids == ["i1", "i4", "p1", "p2", "p3", "p4"]
    intents = await graph.get_nodes_by_type(REPO, [NodeType.INTENT])
    assert [(n.id, n.text) for n in intents] == [
        ("i1", "restart or reload nginx"),
        ("i4", "back up postgres"),
    ]
    assert targets(await graph.neighbors(REPO, ["i1"], HIERARCHICAL)) == {"p1", "p2", "p3"}
    assert rounded(await graph.search_vectors(REPO, merged_vector, 1)) == [("i1", 1.0)]


# Deletes


async def test_delete_removes_links_vectors_and_search_entries(
    graph: GraphStore, backend: Backend, store: str
) -> None:
    """A deleted node is gone from reads, links, vector search and text search."""
    await graph.apply(
        fact_with_tag("a", "nginx listens on port 8080", "nginx", 0), intents=policy()
    )
    await graph.apply(
        fact_with_tag("b", "postgres listens on port 5432", "postgres", 1), intents=policy()
    )
    assert {i for i, _ in await graph.search_text(REPO, "listens", 5)} == {"a-fact", "b-fact"}

    assert await graph.delete_nodes(REPO, ["a-fact", "a-fact", "unknown"]) == 1
    assert await graph.get_nodes(REPO, ["a-fact"]) == []
    assert await graph.neighbors(REPO, ["a-tag"]) == []
    assert [i for i, _ in await graph.search_text(REPO, "listens", 5)] == ["b-fact"]
    assert await graph.search_text(REPO, "8080", 5) == []
    assert "a-fact" not in [i for i, _ in await graph.search_vectors(REPO, axis(0), 10)]
    assert await counts(backend) == {"nodes": 3, "links": 1, "vectors": 3, "fts": 3}
    # The rows are gone too: an index loaded afresh does not bring it back.
    async with open_stores(store, DIM) as other:
        found = await other.graph.search_vectors(REPO, axis(0), 10)
    assert "a-fact" not in [i for i, _ in found]


async def test_a_link_to_no_node_fails_and_stores_nothing(
    graph: GraphStore, backend: Backend
) -> None:
    """A changeset linking a node to an id that is no node (not in it, not in the graph)
    raises StorageError, and none of it is stored (SQLite names a link's ends by rowid, the
    missing one found by no look-up)."""
    changeset = Changeset(
        "lost-cs", REPO, [draft("lost-fact", NodeType.SEMANTIC, "a fact", axis(0))],
        [Link("lost-fact", "nowhere", MEMBERSHIP)],
    )
    with pytest.raises(StorageError):
        await graph.apply(changeset, intents=policy())
    assert await graph.get_nodes(REPO, ["lost-fact"]) == []
    assert await counts(backend) == {"nodes": 0, "links": 0, "vectors": 0, "fts": 0}


async def test_an_unknown_stored_type_is_a_corrupt_store(
    graph: GraphStore, backend: Backend
) -> None:
    """A row naming a type no member has (written by another program, or a later version)
    is `StorageError("corrupt")` on every read that decodes it, not a KeyError."""
    await graph.apply(fact_with_tag("a", "nginx listens on 8080", "nginx"), intents=policy())
    await sql(backend, "UPDATE nodes SET type = 'gadget' WHERE id = 'a-fact'")
    with pytest.raises(StorageError) as caught:
        await graph.get_nodes(REPO, ["a-fact"])
    assert caught.value.reason == "corrupt"
    with pytest.raises(StorageError):
        await graph.typed_links(REPO, ["a-tag"])
    await sql(backend, "UPDATE nodes SET type = 'semantic' WHERE id = 'a-fact'")
    await sql(backend, f"UPDATE links SET type = 'rope' WHERE src = {link_end('a-tag', backend)}")
    with pytest.raises(StorageError) as caught:
        await graph.neighbors(REPO, ["a-tag"])
    assert caught.value.reason == "corrupt"


async def test_delete_only_touches_its_repo(graph: GraphStore) -> None:
    """Deleting from another repo, or nothing, removes nothing."""
    await graph.apply(fact_with_tag("a", "fact", "tag"), intents=policy())
    assert await graph.delete_nodes("other", ["a-fact"]) == 0
    assert await graph.delete_nodes(REPO, []) == 0
    assert [n.id for n in await graph.get_nodes(REPO, ["a-fact"])] == ["a-fact"]


# Search


@pytest.fixture
async def searchable(graph: GraphStore) -> GraphStore:
    await graph.apply(
        fact_with_tag("a", 'nginx "proxy" NEAR port: 8080 (default) AND more*', "nginx"),
        intents=policy(),
    )
    return graph


hostile = st.one_of(
    st.text(),
    st.lists(
        st.sampled_from(
            [
                '"',
                "'",
                "*",
                "NEAR",
                "NEAR(",
                "AND",
                "OR",
                "NOT",
                "(",
                ")",
                ":",
                "^",
                "-",
                "+",
                "{",
                "}",
                "nginx",
                "text:",
                "\\",
                "\x00",
                "NEAR/2",
                "''",
                '""',
                " ",
                "_",
                "é",
            ]
        )
        | st.text(max_size=3)
    ).map("".join),
)


# No deadline: the first example opens the lexical index's slot.
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(query=hostile)
async def test_search_text_never_raises(searchable: GraphStore, query: str) -> None:
    """Any string is a safe text query: it returns matches or nothing, never an error."""
    results = await searchable.search_text(REPO, query, 10)
    assert {i for i, _ in results} <= {"a-fact", "a-tag"}


async def test_search_text_finds_words_and_ranks_better_first(searchable: GraphStore) -> None:
    """Words match by stem, syntax characters are plain text, and the scores are descending."""
    assert [i for i, _ in await searchable.search_text(REPO, 'NEAR("proxy"', 5)] == ["a-fact"]
    results = await searchable.search_text(REPO, "nginx proxies", 5)
    assert {i for i, _ in results} == {"a-fact", "a-tag"}
    assert [s for _, s in results] == sorted((s for _, s in results), reverse=True)
    assert await searchable.search_text(REPO, "   ", 5) == []
    assert await searchable.search_text(REPO, "nginx", 0) == []


async def test_search_text_respects_types_and_repo(searchable: GraphStore) -> None:
    """A type filter and the repo both narrow text search."""
    assert [i for i, _ in await searchable.search_text(REPO, "nginx", 5, [NodeType.TAG])] == [
        "a-tag"
    ]
    assert await searchable.search_text(REPO, "nginx", 5, [NodeType.INTENT]) == []
    assert await searchable.search_text("other", "nginx", 5) == []


async def test_search_vectors_respects_types_and_repo(graph: GraphStore) -> None:
    """Vector search is per repo and honours a type filter."""
    await graph.apply(fact_with_tag("a", "fact", "tag", vector_axis=0), intents=policy())
    await graph.apply(
        Changeset("o", "other", [draft("o-fact", NodeType.SEMANTIC, "fact", axis(0))]),
        intents=policy(),
    )
    assert rounded(await graph.search_vectors(REPO, axis(0), 1)) == [("a-fact", 1.0)]
    assert [i for i, _ in await graph.search_vectors(REPO, axis(0), 5, [NodeType.TAG])] == ["a-tag"]
    assert [i for i, _ in await graph.search_vectors("other", axis(0), 5)] == ["o-fact"]
    assert await graph.search_vectors("empty", axis(0), 5) == []


# Reads


async def test_get_nodes_keeps_the_order_asked(graph: GraphStore) -> None:
    """get_nodes answers in the order asked, once per id, leaving out unknown ids."""
    await graph.apply(fact_with_tag("a", "fact", "tag"), intents=policy())
    got = await graph.get_nodes(REPO, ["a-tag", "missing", "a-fact", "a-tag"])
    assert [n.id for n in got] == ["a-tag", "a-fact"]
    assert await graph.get_nodes("other", ["a-tag"]) == []
    assert await graph.get_nodes(REPO, []) == []


async def test_latest_is_newest_first_and_respects_top_k(graph: GraphStore) -> None:
    """latest gives the newest nodes of the types asked, newest first, at most top_k."""
    for i in range(5):
        await graph.apply(fact_with_tag(f"n{i}", f"fact {i}", f"tag {i}"), intents=policy())
    latest = await graph.latest(REPO, [NodeType.SEMANTIC], 3)
    assert [n.id for n in latest] == ["n4-fact", "n3-fact", "n2-fact"]
    assert [n.created_at for n in latest] == sorted((n.created_at for n in latest), reverse=True)
    both = await graph.latest(REPO, [NodeType.SEMANTIC, NodeType.TAG], 3)
    assert [n.id for n in both] == ["n4-tag", "n4-fact", "n3-tag"]
    assert len(await graph.latest(REPO, [NodeType.TAG], 50)) == 5
    assert await graph.latest(REPO, [NodeType.SEMANTIC], 0) == []
    assert await graph.latest(REPO, [], 3) == []
    assert await graph.latest(REPO, [NodeType.INTENT], 3) == []


async def test_neighbors_in_both_directions_with_a_type_filter(graph: GraphStore) -> None:
    """neighbors sees links from either end, and a link type narrows them."""
    changeset = Changeset(
        "cs",
        REPO,
        [
            draft("fact", NodeType.SEMANTIC, "fact", axis(0)),
            draft("tag", NodeType.TAG, "tag"),
            draft("step", NodeType.EPISODIC, "step", axis(1)),
            draft("other", NodeType.SEMANTIC, "other fact", axis(2)),
        ],
        [
            Link("tag", "fact", MEMBERSHIP),
            Link("fact", "step", LinkType.PROVENANCE),
            Link("fact", "other", LinkType.SIBLING),
        ],
    )
    await graph.apply(changeset, intents=policy())
    assert set(await graph.neighbors(REPO, ["fact"])) == {
        Neighbor("fact", "tag", MEMBERSHIP),
        Neighbor("fact", "step", LinkType.PROVENANCE),
        Neighbor("fact", "other", LinkType.SIBLING),
    }
    assert await graph.neighbors(REPO, ["fact"], LinkType.PROVENANCE) == [
        Neighbor("fact", "step", LinkType.PROVENANCE)
    ]
    assert await graph.neighbors(REPO, ["tag"], MEMBERSHIP) == [Neighbor("tag", "fact", MEMBERSHIP)]
    assert await graph.neighbors(REPO, ["step"]) == [Neighbor("step", "fact", LinkType.PROVENANCE)]
    assert await graph.neighbors(REPO, ["tag"], LinkType.SIBLING) == []
    # Two asked nodes linked to each other each see the link.
    assert set(await graph.neighbors(REPO, ["tag", "fact"], MEMBERSHIP)) == {
        Neighbor("tag", "fact", MEMBERSHIP),
        Neighbor("fact", "tag", MEMBERSHIP),
    }
    assert await graph.neighbors("other", ["fact"]) == []


# Concurrency


async def test_concurrent_applies_share_tags_exactly(graph: GraphStore, backend: Backend) -> None:
    """Thirty concurrent commits sharing tag labels leave one tag per label and every fact."""
    labels = ["nginx", "postgres", "docker", "redis", "tls"]
    spellings: list[Callable[[str], str]] = [str.lower, str.upper, str.title, "  {} ".format]
    changesets: list[tuple[Changeset, set[str]]] = []
    for i in range(30):
        chosen = {labels[i % 5], labels[(i * 3 + 1) % 5]}
        nodes = [draft(f"fact{i}", NodeType.SEMANTIC, f"fact number {i}", axis(i % 7))]
        links = []
        for j, label in enumerate(sorted(chosen)):
            nodes.append(draft(f"tag{i}-{j}", NodeType.TAG, spellings[(i + j) % 4](label)))
            links.append(Link(f"tag{i}-{j}", f"fact{i}", MEMBERSHIP))
        changesets.append((Changeset(f"cs{i}", REPO, nodes, links), chosen))

    async def apply(changeset: Changeset) -> None:
        await graph.apply(changeset, intents=policy())

    async with anyio.create_task_group() as tg:
        for changeset, _ in changesets:
            tg.start_soon(apply, changeset)

    tags = await graph.get_nodes_by_type(REPO, [NodeType.TAG])
    assert sorted(normalise_label(t.text) for t in tags) == sorted(labels)
    label_of: dict[str, str] = {t.id: normalise_label(t.text) for t in tags}
    assert (await counts(backend))["nodes"] == 30 + len(labels)
    for i, (_, chosen) in enumerate(changesets):
        linked = await graph.neighbors(REPO, [f"fact{i}"], MEMBERSHIP)
        assert {label_of[n.node_id] for n in linked} == chosen


async def test_unrelated_repos_commit_independently(graph: GraphStore) -> None:
    """Commits to different repos do not deduplicate against each other."""

    async def apply(changeset: Changeset) -> None:
        await graph.apply(changeset, intents=policy())

    async with anyio.create_task_group() as tg:
        for repo in ("r1", "r2", "r3"):
            changeset = Changeset(
                f"{repo}-cs", repo, [draft(f"{repo}-{uuid.uuid4()}", NodeType.TAG, "shared")]
            )
            tg.start_soon(apply, changeset)
    for repo in ("r1", "r2", "r3"):
        assert len(await graph.get_nodes_by_type(repo, [NodeType.TAG])) == 1


def test_fts_query_dedups_and_caps_terms() -> None:
    """fts_query keeps each word once (any case) and at most MAX_QUERY_TERMS of a long query."""
    assert fts_query('Nginx port nginx PORT "x"') == '"Nginx" OR "port" OR "x"'
    expression = fts_query(" ".join(f"word{i}" for i in range(5000)))
    assert expression.count(" OR ") == MAX_QUERY_TERMS - 1


class HeldMerger(Merger):
    """A merger that waits for `release` before answering, like a slow LLM."""

    def __init__(self, result: tuple[str, Vector] | None) -> None:
        super().__init__(result)
        self.asked = anyio.Event()
        self.release = anyio.Event()

    async def __call__(
        self, pairs: Sequence[tuple[str, str]]
    ) -> list[tuple[str, Vector] | None]:
        self.calls.extend(pairs)
        self.asked.set()
        await self.release.wait()
        return [self.result] * len(pairs)


async def test_a_slow_intent_merge_does_not_hold_up_other_commits(graph: GraphStore) -> None:
    """The LLM merge of an intent is asked before the repo's lock is taken: while it hangs,
    another commit to the repo lands; then the merged wording is applied."""
    await graph.apply(
        procedure_with_intent("a", "restart the web server", axis(0)), intents=policy()
    )
    merger = HeldMerger(("reload or restart nginx", at_cosine(0.3, base=0, other=3)))
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: graph.apply(
                procedure_with_intent("b", "reload nginx config", at_cosine(0.9)),
                intents=policy(merger),
            )
        )
        with anyio.fail_after(5):
            await merger.asked.wait()
            other = await graph.apply(
                procedure_with_intent("c", "back up the database", axis(4)), intents=policy()
            )
        assert other.node_ids == ["c-intent", "c-proc"]
        merger.release.set()
    assert merger.calls == [("restart the web server", "reload nginx config")]
    intents = {n.id: n.text for n in await graph.get_nodes_by_type(REPO, [NodeType.INTENT])}
    assert intents == {"a-intent": "reload or restart nginx", "c-intent": "back up the database"}


async def test_a_merge_the_graph_needs_after_the_lock_is_decided_outside_it(
    graph: GraphStore,
) -> None:
    """An intent that became close to another only after its merges were decided (a commit
    landed meanwhile) is merged all the same: the commit lets the lock go, asks, tries again."""
    merger = Merger(("reload or restart nginx", at_cosine(0.3, base=0, other=3)))
    lock = graph.lock
    asked = anyio.Event()

    def spied(repo: str) -> Any:
        asked.set()
        return lock(repo)

    async with anyio.create_task_group() as tg:
        async with graph.lock(REPO):
            graph.lock = spied  # type: ignore[method-assign]
            tg.start_soon(
                lambda: graph.apply(
                    procedure_with_intent("b", "reload nginx config", at_cosine(0.9)),
                    intents=policy(merger),
                )
            )
            # "b" decided (nothing to merge) and waits for the lock (`wait_all_tasks_blocked`
            # alone returned while b's reads were on their thread or socket).
            with anyio.fail_after(10):
                await asked.wait()
            await anyio.wait_all_tasks_blocked()
            assert merger.calls == []
            # Another commit lands meanwhile, holding the lock as every commit does.
            target = cast(commit.CommitTarget, graph)
            landed = procedure_with_intent("a", "restart the web server", axis(0))
            await commit._apply_locked(await commit._before(target, landed, policy(), ()),
                                       Merger().one, None)
    assert merger.calls == [("restart the web server", "reload nginx config")]
    texts = sorted(n.text for n in await graph.get_nodes_by_type(REPO, [NodeType.INTENT]))
    assert texts == ["reload or restart nginx"]


async def test_links_lists_every_link_of_the_repo_in_order(store: str) -> None:
    """`Memory.links` reads a repo's links through the graph port, by type, source and
    destination; an unknown repo is NotFoundError."""
    import mnemo
    from tests.fakes import FakeEmbedder, FakeLLM

    async with mnemo.Memory(store, llm=FakeLLM(), embedder=FakeEmbedder()) as mem:
        await mem.open_repo(REPO)
        sid = await mem.start_session("explore", repo=REPO)
        await mem.append(sid, "The kitchen is north of the hall.", "go north")
        await mem.close_and_commit(sid)
        links = await mem.links(REPO)
        assert links
        assert links == sorted(links, key=lambda link: (link.type.value, link.src, link.dst))
        nodes = {n.id for n in await mem.get_nodes_by_type(REPO, list(NodeType))}
        assert {end for link in links for end in (link.src, link.dst)} <= nodes
        with pytest.raises(mnemo.NotFoundError):
            await mem.links("nope")
