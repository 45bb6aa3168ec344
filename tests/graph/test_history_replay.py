"""Reverts compose: any sequence of commits and reverts leaves the graph
equal to replaying only the commits that survive, in their order; on each backend."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mnemo
from mnemo.graph import history
from mnemo.graph.model import Changeset, Link, LinkType, NodeType
from mnemo.graph.ports import GraphStore
from tests.backends import open_stores
from tests.conftest import REPO
from tests.graph._support import DIM, axis, draft, policy

LABELS = ("tea", "lisbon", "porto")

# ("commit", tag label index, fact index to link to as a sibling) or ("revert", which commit
# of the history, newest first).
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("commit"), st.integers(0, len(LABELS) - 1), st.integers(-1, 6)),
        st.tuples(st.just("revert"), st.integers(0, 5), st.just(0)),
    ),
    max_size=10,
)


# The replay goes to another repo of the same store (one store per example is cheaper), its
# ids prefixed: ids are unique across repos.
REPLAY = "replay"


def changeset(
    step: int, label: int, sibling: str | None, repo: str = REPO, prefix: str = ""
) -> Changeset:
    """A fact tagged by a label (labels are shared, so tags are too), linked to an earlier
    fact when `sibling` names one."""
    fact = f"{prefix}f{step}"
    links = [Link(f"{prefix}t{step}", fact, LinkType.MEMBERSHIP)]
    if sibling is not None:
        links.append(Link(fact, f"{prefix}{sibling}", LinkType.SIBLING))
    return Changeset(
        f"{prefix}cs{step}",
        repo,
        [
            draft(fact, NodeType.SEMANTIC, f"fact number {step}", axis(step % (DIM - 1))),
            draft(f"{prefix}t{step}", NodeType.TAG, LABELS[label]),
        ],
        links,
    )


async def graph_state(
    graph: GraphStore, repo: str = REPO, prefix: str = ""
) -> tuple[list[tuple[str, str, str]], list[Link]]:
    """The repo's nodes and links, ids without `prefix`."""
    nodes = await graph.get_nodes_by_type(repo, list(NodeType))
    links = sorted(
        (Link(k.src.removeprefix(prefix), k.dst.removeprefix(prefix), k.type)
         for k in await graph.links(repo)),
        key=lambda k: (k.type.value, k.src, k.dst),
    )
    return sorted((n.id.removeprefix(prefix), n.type.value, n.text) for n in nodes), links


async def scenario(ops: list[tuple[str, int, int]], store: str) -> None:
    made: dict[str, tuple[int, int, str | None]] = {}
    async with open_stores(store, DIM) as backend:
        graph = backend.graph
        for step, (kind, a, b) in enumerate(ops):
            if kind == "commit":
                facts = sorted(n.id for n in await graph.get_nodes_by_type(
                    REPO, [NodeType.SEMANTIC]))
                sibling = facts[b % len(facts)] if facts and b >= 0 else None
                cs = changeset(step, a, sibling)
                made[cs.id] = (step, a, sibling)
                await graph.apply(cs, intents=policy())
                continue
            log = await history.history(graph, REPO, 100)
            if not log:
                continue
            before = await graph_state(graph)
            try:
                await history.revert(graph, REPO, log[a % len(log)].id)
            except mnemo.ConflictError:
                assert await graph_state(graph) == before
        survivors = [c.id for c in reversed(await history.history(graph, REPO, 100))]
        for changeset_id in survivors:
            replayed = changeset(*made[changeset_id], repo=REPLAY, prefix="x")
            await graph.apply(replayed, intents=policy())
        assert await graph_state(graph, REPLAY, "x") == await graph_state(graph)


@pytest.mark.slow
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=OPS)
def test_reverts_equal_replaying_the_survivors(
    fresh_stores: Callable[[], str], ops: list[tuple[str, int, int]]
) -> None:
    """After any commits and reverts, the graph is what applying only the surviving commits
    to an empty store gives; a refused revert changes nothing."""
    anyio.run(scenario, ops, fresh_stores())
