"""Re-embedding a repo (`Memory.reembed`): new vectors staged beside the old ones, a batch per
transaction, while the repo stays readable and writable; nodes committed or changed meanwhile
are caught up (the last catch-up under the repo's lock), then one transaction switches the
vectors, the record and the generation. Cut short, the repo is as it was, with its staged
vectors for the next run with the same embedder.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from mnemo.graph.model import NodeType, Vector
from mnemo.graph.ports import Reembedding


@dataclass(frozen=True, slots=True)
class Staging:
    """A repo's re-embedding as the store holds it: its embedder's URI and dimension, how
    many of the repo's nodes have a staged vector, of how many, and whether it resumes one."""

    embedder: str
    dim: int
    staged: int
    total: int
    resumed: bool


class Unstaged(NamedTuple):
    """A node of a repo being re-embedded that has no staged vector yet."""

    rowid: int
    id: str
    type: NodeType
    text: str


# Catch-ups before the repo's lock, so the last, under it, has little left to embed.
CATCH_UPS = 3


@dataclass(frozen=True, slots=True)
class ReembedProgress:
    """How far a re-embedding has got (`Memory.reembed`'s `progress`): `done` of `total` nodes
    (which grows with commits meanwhile); `stage` is `"embedding"`, `"switching"`,
    `"indexing"`, then `"done"`."""

    repo: str
    stage: str
    done: int
    total: int


Report = Callable[[ReembedProgress], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Reembedded:
    """What a re-embedding did: the new generation, vectors switched, whether it resumed."""

    generation: int
    vectors: int
    resumed: bool


async def reembed(
    graph: Reembedding,
    repo: str,
    *,
    embedder: str,
    dim: int,
    embed: Callable[[Sequence[Unstaged]], Awaitable[Vector]],
    batch: int,
    report: Report,
) -> Reembedded:
    """`Memory.reembed`'s work: `embed` runs the embedder of URI `embedder` (`dim` dimensions)
    on nodes' type and text, a vector row each. ConflictError: another re-embedding is under
    way; on EmbeddingError or StorageError the repo is as it was, its staged vectors kept."""
    async with graph.reembedding(repo):
        staging = await graph.begin_reembed(repo, embedder, dim)
        done, total = staging.staged, staging.total

        async def stage_all(stage: str, *, locked: bool = False) -> int:
            """Stages the nodes without a staged vector of those the repo held when it began
            (all, under the lock); returns how many. Later nodes are left to the next pass."""
            nonlocal done, total
            staged, after = 0, 0
            upto = None if locked else await graph.last_rowid(repo)
            while nodes := await graph.unstaged(repo, after, batch, upto):
                await graph.stage(repo, nodes, await embed(nodes))
                after = nodes[-1].rowid
                staged += len(nodes)
                done += len(nodes)
                total = max(total, done)
                if not locked:  # the caller's callback never runs while commits wait
                    await report(ReembedProgress(repo, stage, done, total))
            return staged

        await report(ReembedProgress(repo, "embedding", done, total))
        await stage_all("embedding")
        for _ in range(CATCH_UPS):
            await graph.unstage_changed(repo)
            if not await stage_all("embedding"):
                break
        await report(ReembedProgress(repo, "switching", done, total))
        async with graph.lock(repo):
            await graph.unstage_changed(repo)
            await stage_all("switching", locked=True)
            generation, vectors = await graph.switch_vectors(repo)
    return Reembedded(generation, vectors, staging.resumed)
