"""Re-embedding a repo: every node's vector made again with another embedder (`Memory.reembed`),
while the repo stays readable and writable, and never searched with a mix of the two.

- One re-embedding per repo at a time, across processes (a second is a `ConflictError`).
- New vectors are staged beside the old ones, one transaction a batch; nothing searches them
  until the switch.
- Nodes committed meanwhile, and nodes whose text changed (`unstage_changed`), are staged by a
  catch-up; the last runs under the repo's lock, so no commit slips in before the switch.
- The switch is one transaction under that lock: staged vectors replace the old, the repo's
  record names the new embedder and dimension, and the generation moves, so every process
  drops what it holds of the old ones (`mnemo.storage.vector_log`).
- A re-embedding cut short leaves the repo as it was, with its staged vectors: the next one
  with the same embedder carries on from them, another embedder drops them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from mnemo.graph.model import NodeType, Vector
from mnemo.graph.ports import Reembedding


@dataclass(frozen=True, slots=True)
class Staging:
    """A repo's re-embedding as the store holds it (`mnemo.graph.reembed`): the URI and the
    dimension of the embedder its staged vectors are made with, how many of the repo's nodes
    have one, of how many, and whether it carries on with what one before it staged (a
    re-embedding with the same embedder that was cut short)."""

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



# Embeds nodes (their type and text), one vector row each (the caller runs the embedder).
EmbedNodes = Callable[[Sequence[Unstaged]], Awaitable[Vector]]

# Catch-ups before the repo's lock, so the last, under it, has little left to embed.
CATCH_UPS = 3



@dataclass(frozen=True, slots=True)
class ReembedProgress:
    """How far a re-embedding has got, as `Memory.reembed`'s `progress` callback hears it:
    `done` of the repo's `total` nodes have their new vector (`total` grows when nodes are
    committed meanwhile); `stage` is `"embedding"`, `"switching"` (reported before the lock),
    `"indexing"` (the backend's indexes rebuilt), then `"done"`."""

    repo: str
    stage: str
    done: int
    total: int


Report = Callable[[ReembedProgress], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Reembedded:
    """What a re-embedding did: the new generation of the repo's vectors, how many vectors
    took the old ones' place, and whether it carried on with vectors staged before."""

    generation: int
    vectors: int
    resumed: bool


async def reembed(
    graph: Reembedding,
    repo: str,
    *,
    embedder: str,
    dim: int,
    embed: EmbedNodes,
    batch: int,
    report: Report,
) -> Reembedded:
    """Makes every node's vector of `repo` again with `embed` (the embedder of URI `embedder`,
    `dim` dimensions) and switches the repo to them (see the module doc).

    Raises:
        ConflictError: another re-embedding of the repo is under way.
        EmbeddingError: `embed` failed; the repo is as it was, its staged vectors kept.
        StorageError: the store failed; likewise.
    """
    async with graph.reembedding(repo):
        staging = await graph.begin_reembed(repo, embedder, dim)
        done, total = staging.staged, staging.total

        async def stage_all(stage: str, *, locked: bool = False) -> int:
            """Stages every node without a staged vector, of those the repo held when it
            began (all of them under the repo's lock); how many it staged. Nodes committed
            meanwhile are left to the next pass, so a pass is bounded."""
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
