"""Commits to one repo through two graph stores on one store (two Memory objects, two
processes' worth of connections) are serialised: a tag both add is one node."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import cast

import anyio
import pytest

from mnemo.graph.commit import CommitTarget
from mnemo.graph.model import Changeset, Link, LinkType, NodeType
from tests.backends import open_stores
from tests.graph._support import DIM, REPO, axis, draft, policy


def tagged(prefix: str) -> Changeset:
    """A fact and the tag "nginx" (a node id of its own), linked."""
    return Changeset(
        f"{prefix}-cs", REPO,
        [draft(f"{prefix}-fact", NodeType.SEMANTIC, f"fact {prefix}", axis(0)),
         draft(f"{prefix}-tag", NodeType.TAG, "nginx")],
        [Link(f"{prefix}-tag", f"{prefix}-fact", LinkType.MEMBERSHIP)],
    )


def slowed(
    owners: Callable[[str, list[str]], Awaitable[dict[str, str]]],
) -> Callable[[str, list[str]], Awaitable[dict[str, str]]]:
    """`owners`, then a pause: widens the gap between a commit's read and its write."""

    async def slow(repo: str, keys: list[str]) -> dict[str, str]:
        found = await owners(repo, keys)
        await anyio.sleep(0.05)
        return found

    return slow


async def test_two_stores_committing_one_new_tag_make_one_node(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both commits read that no tag "nginx" exists before either writes (the reads are
    slowed to make sure they overlap): with the repo's lock shared through the store, the
    second waits, finds the first's tag and links to it; both commits land."""
    async with open_stores(store, DIM) as first, open_stores(store, DIM) as second:
        for backend in (first, second):
            target = cast(CommitTarget, backend.graph)
            monkeypatch.setattr(target, "tag_owners", slowed(target.tag_owners))
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: first.graph.apply(tagged("a"), intents=policy()))
                tg.start_soon(lambda: second.graph.apply(tagged("b"), intents=policy()))
        tags = await first.graph.get_nodes_by_type(REPO, [NodeType.TAG])
        assert [t.text for t in tags] == ["nginx"]
        linked = {n.node_id for n in await first.graph.neighbors(REPO, [tags[0].id])}
        assert linked == {"a-fact", "b-fact"}
