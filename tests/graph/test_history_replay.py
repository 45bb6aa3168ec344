"""Reverts compose: any sequence of commits and reverts leaves the graph
equal to replaying only the commits that survive (not reverted), in their order; on each
backend."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

import mnemo
from mnemo.graph import history
from mnemo.graph.model import Changeset, Link, LinkType, Node, NodeType
from mnemo.graph.ports import GraphStore
from tests.backends import open_stores
from tests.conftest import REPO
from tests.graph._support import DIM, axis, draft, embed, policy

LABELS = ("tea", "lisbon", "porto")
FACTS = 4  # facts of that many wordings: a commit of one already there joins it

# ("commit", tag label index, fact index to link to as a sibling, wording) or ("revert",
# which commit of the history, newest first, 0, 0).
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("commit"), st.integers(0, len(LABELS) - 1), st.integers(-1, 6),
                  st.integers(0, FACTS - 1)),
        st.tuples(st.just("revert"), st.integers(0, 5), st.just(0), st.just(0)),
    ),
    max_size=10,
)


# The replay goes to another repo of the same store (one store per example is cheaper), its
# ids prefixed: ids are unique across repos.
REPLAY = "replay"


def changeset(
    step: int, label: int, sibling: str | None, wording: int, repo: str = REPO,
    prefix: str = "",
) -> Changeset:
    """A fact of one of `FACTS` wordings tagged by a label (labels are shared, so tags are
    too), linked to an earlier fact when `sibling` names one."""
    fact = f"{prefix}f{step}"
    links = [Link(f"{prefix}t{step}", fact, LinkType.MEMBERSHIP)]
    if sibling is not None:
        links.append(Link(fact, sibling, LinkType.SIBLING))
    return Changeset(
        f"{prefix}cs{step}",
        repo,
        [
            draft(fact, NodeType.SEMANTIC, f"fact number {wording}", axis(wording)),
            draft(f"{prefix}t{step}", NodeType.TAG, LABELS[label]),
        ],
        links,
    )


async def fact_named(graph: GraphStore, repo: str, text: str | None) -> str | None:
    """The id of the repo's fact of this text (None for None)."""
    facts = await graph.get_nodes_by_type(repo, [NodeType.SEMANTIC])
    return next((n.id for n in facts if n.text == text), None)


async def graph_state(
    graph: GraphStore, repo: str = REPO
) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """The repo's nodes and links, by their nodes' texts (a shared tag keeps the id of the
    commit that made it, when a replay makes it in the next one)."""
    nodes: dict[str, Node] = {n.id: n for n in await graph.get_nodes_by_type(
        repo, list(NodeType))}
    links = sorted((nodes[k.src].text, nodes[k.dst].text, k.type.value)
                   for k in await graph.links(repo))
    return sorted((n.type.value, n.text) for n in nodes.values()), links


async def scenario(ops: list[tuple[str, int, int, int]], store: str) -> None:
    # A commit's step, label, sibling's text and wording.
    made: dict[str, tuple[int, int, str | None, int]] = {}
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        for step, (kind, a, b, wording) in enumerate(ops):
            if kind == "commit":
                facts = sorted(await graph.get_nodes_by_type(REPO, [NodeType.SEMANTIC]),
                               key=lambda n: n.id)
                sibling = facts[b % len(facts)] if facts and b >= 0 else None
                cs = changeset(step, a, sibling.id if sibling else None, wording)
                made[cs.id] = (step, a, sibling.text if sibling else None, wording)
                await graph.apply(cs, intents=policy())
                continue
            log = [c for c in await history.history(graph, REPO, 100)
                   if not (c.reverts or c.reverted_by)]
            if not log:
                continue
            before = await graph_state(graph)
            try:
                await history.revert(graph, REPO, log[a % len(log)].id, embed=embed)
            except mnemo.ConflictError:
                assert await graph_state(graph) == before
        survivors = [c.id for c in reversed(await history.history(graph, REPO, 100))
                     if not (c.reverts or c.reverted_by)]
        for changeset_id in survivors:
            step, label, twin, wording = made[changeset_id]
            replayed = changeset(step, label, await fact_named(graph, REPLAY, twin), wording,
                                 repo=REPLAY, prefix="x")
            await graph.apply(replayed, intents=policy())
        assert await graph_state(graph, REPLAY) == await graph_state(graph)


@pytest.mark.slow
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=OPS)
# A later commit linked to the commit's fact in the direction it had not linked, before any
# other commit joined that fact: the revert is refused.
@example(ops=[("commit", 0, 0, 1), ("commit", 0, 0, 0), ("commit", 0, 1, 1),
              ("commit", 0, 0, 0), ("revert", 2, 0, 0)])
# A later commit linked to a fact the commit joined after the fact's maker was reverted (so it
# alone held the fact then), and a still later commit joined it too: the revert is refused.
@example(ops=[("commit", 0, 0, 1), ("commit", 0, 0, 1), ("revert", 1, 0, 0),
              ("commit", 0, 0, 0), ("commit", 0, 0, 1), ("revert", 2, 0, 0)])
def test_reverts_equal_replaying_the_survivors(
    fresh_stores: Callable[[], str], ops: list[tuple[str, int, int, int]]
) -> None:
    """After any commits and reverts, the graph is what applying only the surviving commits
    to an empty store gives; a refused revert changes nothing."""
    anyio.run(scenario, ops, fresh_stores())
