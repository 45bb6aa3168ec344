"""Contradicted facts are retired, not deleted (issue 14).

Before a commit takes the repo's lock, each new SEMANTIC or PROCEDURAL fact is compared with
the few live facts of its type that recall's two channels find closest to it (its vector, its
words); the decision is the repo's LLM's (`IntentPolicy.contradicts`, the "contradiction"
task). A contradicted fact stays, with `valid_to` (when its successor began to hold) and
`retired_at` (the commit's time), linked from its successor by SUPERSEDES. A new fact that
names an earlier time than the one it contradicts is the one retired: it held before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from mnemo.graph.facts import TEMPORAL
from mnemo.graph.model import Changeset, Node, NodeType, Vector

# Whether the new fact (second) ends the existing one (first).
Contradicts = Callable[[str, str], Awaitable[bool]]

# Live facts compared with each new one, per channel (vector, words): the default of
# `Config.contradiction_candidates`.
CANDIDATES = 3


class FactSearch(Protocol):
    async def search_vectors(
        self, repo: str, vector: Vector, limit: int, types: Iterable[NodeType] | None = None
    ) -> list[tuple[str, float]]: ...

    async def search_text(
        self, repo: str, query: str, limit: int, types: Iterable[NodeType] | None = None
    ) -> list[tuple[str, float]]: ...

    async def get_nodes(self, repo: str, node_ids: list[str]) -> list[Node]: ...


@dataclass(frozen=True, slots=True)
class Retirement:
    """`retired` stops holding at `valid_to` (None: when the commit is made), succeeded by
    `successor`."""

    retired: str
    successor: str
    valid_to: datetime | None


async def retirements(
    graph: FactSearch, changeset: Changeset, contradicts: Contradicts,
    candidates: int = CANDIDATES,
) -> list[Retirement]:
    """The facts the changeset's facts contradict (each compared with `candidates` live facts
    per channel), asked before the commit's lock."""
    found: list[Retirement] = []
    own = {n.id for n in changeset.nodes}
    seen: set[str] = set()
    for node in changeset.nodes:
        if node.type not in TEMPORAL:
            continue
        kinds = [node.type]
        ids = [i for i, _ in await graph.search_vectors(
            changeset.repo, node.vector, candidates, kinds)]
        ids += [i for i, _ in await graph.search_text(
            changeset.repo, node.text, candidates, kinds)]
        fresh = [i for i in dict.fromkeys(ids) if i not in own and i not in seen]
        for old in await graph.get_nodes(changeset.repo, fresh):
            if old.retired or not await contradicts(old.text, node.text):
                continue
            seen.add(old.id)
            if node.valid_from and old.valid_from and node.valid_from < old.valid_from:
                found.append(Retirement(node.id, old.id, old.valid_from))
                break  # the new fact is retired: it ends nothing more
            found.append(Retirement(old.id, node.id, node.valid_from))
    return found


async def still_live(
    graph: FactSearch, repo: str, planned: list[Retirement], added: set[str]
) -> list[Retirement]:
    """The retirements that still apply under the lock: the new fact is being added, and
    the existing one is still there and live (another commit may have retired or removed it
    since they were decided)."""
    pairs = [r for r in planned if (r.retired in added) != (r.successor in added)]
    existing = [r.successor if r.retired in added else r.retired for r in pairs]
    live = {n.id for n in await graph.get_nodes(repo, existing) if not n.retired}
    return [r for r, other in zip(pairs, existing, strict=True) if other in live]
