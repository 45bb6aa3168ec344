"""Commits as a history: every applied changeset is listed, can be diffed, and can
be reverted unless later work built on it; on each backend."""

from __future__ import annotations

import pytest

import mnemo
from mnemo.graph import history, maintenance
from mnemo.graph.model import Changeset, Link, LinkType, NodeType
from mnemo.graph.ports import GraphStore, SourceRecorded
from tests.backends import open_stores, sql
from tests.conftest import REPO
from tests.graph._support import DIM, axis, draft, embed, policy

MEMBERSHIP = LinkType.MEMBERSHIP


def fact(prefix: str, text: str, tag: str, vector_axis: int = 0) -> Changeset:
    """One SEMANTIC fact with its TAG (shared between changesets by label)."""
    return Changeset(
        f"{prefix}-cs",
        REPO,
        [
            draft(f"{prefix}-fact", NodeType.SEMANTIC, text, axis(vector_axis)),
            draft(f"{prefix}-tag", NodeType.TAG, tag),
        ],
        [Link(f"{prefix}-tag", f"{prefix}-fact", MEMBERSHIP)],
    )


async def state(graph: GraphStore) -> tuple[list[str], list[Link]]:
    """The repo's node ids and links."""
    nodes = await graph.get_nodes_by_type(REPO, list(NodeType))
    return sorted(n.id for n in nodes), await graph.links(REPO)


async def test_each_commit_is_listed_newest_first(store: str) -> None:
    """Each applied changeset leaves one record with the ids of what it added; applying one
    again adds no record; the limit keeps the newest."""
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        await graph.apply(fact("a", "dana lives in lisbon", "dana"), intents=policy())
        await graph.apply(fact("b", "dana likes tea", "dana", 1), intents=policy())
        await graph.apply(fact("b", "dana likes tea", "dana", 1), intents=policy())
        log = await history.history(graph, REPO, 10)
        assert [c.id for c in log] == ["b-cs", "a-cs"]
        assert [c.seq for c in log] == [2, 1]
        newest, oldest = log
        assert oldest.node_ids == ("a-fact", "a-tag")
        assert oldest.links == (Link("a-tag", "a-fact", MEMBERSHIP),)
        # "b-tag" is the same label as "a-tag": deduplicated, its link re-pointed.
        assert newest.node_ids == ("b-fact",)
        assert newest.links == (Link("a-tag", "b-fact", MEMBERSHIP),)
        assert (newest.node_count, newest.link_count, newest.retired_count) == (1, 1, 0)
        assert newest.committed_at >= oldest.committed_at
        assert [c.id for c in await history.history(graph, REPO, 1)] == ["b-cs"]
        diff = await history.diff(graph, REPO, "a-cs")
        assert [n.text for n in diff.nodes] == ["dana lives in lisbon", "dana"]
        assert diff.links == [Link("a-tag", "a-fact", MEMBERSHIP)]
        assert diff.retired == []


async def test_a_record_says_where_the_commit_came_from(store: str) -> None:
    """A commit with an ingest's side write names its source."""
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        side = SourceRecorded(REPO, "doc-1", "hash", "a-cs", "2026-01-01T00:00:00+00:00")
        await graph.apply(fact("a", "x is y", "x"), intents=policy(), also=[side])
        (record,) = await history.history(graph, REPO, 5)
        assert (record.source_id, record.session_id) == ("doc-1", None)


async def test_revert_leaves_the_graph_as_before(store: str) -> None:
    """Reverting the newest commit removes its nodes and the links it added to older nodes;
    its record stays, named by the revert's, which is listed newest; its diff still
    answers."""
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        await graph.apply(fact("a", "dana lives in lisbon", "dana"), intents=policy())
        before = await state(graph)
        await graph.apply(fact("b", "dana likes tea", "dana", 1), intents=policy())
        undone = await history.revert(graph, REPO, "b-cs", embed=embed)
        assert [n.id for n in undone.nodes] == ["b-fact"]
        assert await state(graph) == before
        revert, reverted, kept = await history.history(graph, REPO, 10)
        assert (revert.reverts, revert.node_count, revert.seq) == ("b-cs", 0, 3)
        assert (reverted.id, reverted.reverted_by) == ("b-cs", revert.id)
        assert undone.commit == reverted
        assert (kept.id, kept.reverted_by) == ("a-cs", None)
        assert (await history.diff(graph, REPO, "b-cs")).links == [
            Link("a-tag", "b-fact", MEMBERSHIP)]
        hits = await graph.search_vectors(REPO, axis(1), 5, [NodeType.SEMANTIC])
        assert [node_id for node_id, _ in hits] == ["a-fact"]
        # Applied again (a retried commit), a reverted changeset adds nothing.
        await graph.apply(fact("b", "dana likes tea", "dana", 1), intents=policy())
        assert await state(graph) == before
        for done in ("b-cs", revert.id):
            with pytest.raises(mnemo.ConflictError, match="revert"):
                await history.revert(graph, REPO, done, embed=embed)


async def test_an_older_commit_whose_tag_a_later_one_shares_is_reverted(store: str) -> None:
    """A tag a later commit also links to is shared, not built on: the older commit is
    reverted, its fact goes and the tag stays for the later one."""
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        await graph.apply(fact("b", "dana likes tea", "dana", 1), intents=policy())
        before = await state(graph)
        await graph.apply(fact("a", "dana lives in lisbon", "dana"), intents=policy())
        await graph.apply(fact("c", "cats purr", "cats", 2), intents=policy())
        await history.revert(graph, REPO, "b-cs", embed=embed)
        nodes, links = await state(graph)
        assert nodes == ["a-fact", "b-tag", "c-fact", "c-tag"]
        assert Link("b-tag", "a-fact", MEMBERSHIP) in links
        await history.revert(graph, REPO, "a-cs", embed=embed)
        await history.revert(graph, REPO, "c-cs", embed=embed)
        assert await state(graph) == ([], [])
        await graph.apply(fact("b2", "dana likes tea", "dana", 1), intents=policy())
        assert len((await state(graph))[0]) == len(before[0])


async def test_revert_refuses_what_later_commits_built_on(store: str) -> None:
    """A commit whose fact a later commit linked to cannot be reverted (ConflictError naming
    the later commit, nothing changed); once the later one is reverted, it can."""
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        await graph.apply(fact("a", "dana lives in lisbon", "dana"), intents=policy())
        later = fact("b", "dana likes tea", "tea", 1)
        await graph.apply(Changeset(later.id, REPO, later.nodes, [
            *later.links, Link("b-fact", "a-fact", LinkType.SIBLING)]), intents=policy())
        await graph.apply(fact("c", "cats purr", "cats", 2), intents=policy())
        before = await state(graph)
        with pytest.raises(mnemo.ConflictError, match=r"'b-cs'.*revert it first"):
            await history.revert(graph, REPO, "a-cs", embed=embed)
        assert await state(graph) == before
        assert len(await history.history(graph, REPO, 10)) == 3
        await history.revert(graph, REPO, "b-cs", embed=embed)
        await history.revert(graph, REPO, "a-cs", embed=embed)
        assert (await state(graph))[0] == ["c-fact", "c-tag"]
        assert [c.reverted_by is not None for c in await history.history(graph, REPO, 10)] == [
            False, False, False, True, True]


@pytest.mark.parametrize("joined_first", [True, False])
async def test_a_commit_whose_fact_another_shared_before_a_link_to_it_is_reverted(
    store: str, joined_first: bool,
) -> None:
    """A link a later commit made to a fact that another commit had joined by then is built
    on the fact, not on its first commit: that one is reverted, the fact and the link stay.
    Joined after the link, the fact was that commit's alone when linked: refused, naming the
    linking commit."""
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        linking = fact("c", "cats purr", "cats", 2)
        linking = Changeset(linking.id, REPO, linking.nodes,
                            [*linking.links, Link("c-fact", "a-fact", LinkType.SIBLING)])
        joining = fact("b", "dana lives in lisbon", "dana")
        later = [joining, linking] if joined_first else [linking, joining]
        for changeset in (fact("a", "dana lives in lisbon", "dana"), *later):
            await graph.apply(changeset, intents=policy())
        assert (await history.history(graph, REPO, 3))[1 - later.index(joining)].joined == (
            "a-fact",)
        if not joined_first:
            with pytest.raises(mnemo.ConflictError, match=r"'c-cs'.*revert it first"):
                await history.revert(graph, REPO, "a-cs", embed=embed)
            return
        await history.revert(graph, REPO, "a-cs", embed=embed)
        nodes, links = await state(graph)
        assert nodes == ["a-fact", "a-tag", "c-fact", "c-tag"]
        assert Link("c-fact", "a-fact", LinkType.SIBLING) in links


async def test_revert_refuses_a_fact_consolidate_merged_another_into(store: str) -> None:
    """A fact another commit's fact was merged into by `consolidate` holds that commit's
    links: reverting its commit is refused, naming why."""
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        await graph.apply(fact("a", "bees make their honey", "bees"), intents=policy())
        await graph.apply(fact("b", "bees make our honey", "honey"), intents=policy())
        assert (await maintenance.consolidate(graph, REPO, mnemo.Config())).merged == 1
        with pytest.raises(mnemo.ConflictError, match="consolidate"):
            await history.revert(graph, REPO, "a-cs", embed=embed)


async def test_unknown_commits_and_bad_limits_are_invalid_input(store: str) -> None:
    """An unknown or blank commit id, or a limit below 1, raises InvalidInputError."""
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        await graph.apply(fact("a", "x is y", "x"), intents=policy())
        for bad in ("nope", " "):
            with pytest.raises(mnemo.InvalidInputError):
                await history.diff(graph, REPO, bad)
            with pytest.raises(mnemo.InvalidInputError):
                await history.revert(graph, REPO, bad, embed=embed)
        with pytest.raises(mnemo.InvalidInputError):
            await history.history(graph, REPO, 0)
        with pytest.raises(mnemo.InvalidInputError):
            await history.diff(graph, "other", "a-cs")
        assert int((await sql(backend, "SELECT count(*) FROM commits"))[0][0]) == 1


async def test_sessions_and_ingests_are_listed_commits(mem: mnemo.Memory) -> None:
    """A session's commit names the session, an ingest's its source; reverting the ingest
    frees the source id (ingesting it again creates anew) and is listed."""
    sid = await mem.start_session("explore the house", repo=REPO)
    await mem.append(sid, "walk north", "go north")
    receipt = await mem.close_and_commit(sid)
    assert receipt is not None
    trajectory = mnemo.Trajectory("cook", [mnemo.Step("the oven is cold", "turn it on")])
    ingested = await mem.ingest(REPO, trajectory, source_id="recipe")
    newest, oldest = await mem.history(REPO)
    assert (oldest.id, oldest.session_id, oldest.source_id) == (receipt.changeset_id, sid, None)
    assert set(oldest.node_ids) == set(receipt.node_ids)
    assert (newest.session_id, newest.source_id) == (None, "recipe")
    assert set(newest.node_ids) == set(ingested.node_ids)
    diff = await mem.commit_diff(REPO, newest.id)
    assert {n.id for n in diff.nodes} == set(ingested.node_ids)

    undone = await mem.revert(REPO, newest.id)
    revert, reverted, first = await mem.history(REPO, limit=5)
    assert (revert.reverts, reverted.id, reverted.reverted_by, first.id) == (
        newest.id, newest.id, revert.id, oldest.id)
    assert undone.commit.reverted_by == revert.id
    assert (await mem.commit_diff(REPO, newest.id)).nodes == []
    for node_id in ingested.node_ids:
        assert await mem.get_node(REPO, node_id) is None
    again = await mem.ingest(REPO, trajectory, source_id="recipe")
    assert again.created
    with pytest.raises(mnemo.NotFoundError):
        await mem.history("nope")
