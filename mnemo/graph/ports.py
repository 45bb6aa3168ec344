"""The graph's port, cut by role (a backend implements all of them as `GraphStore`), and the
side writes (`SideWrite`) a commit writes in its own transaction."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, TypeVar

from mnemo.config import Config
from mnemo.graph.contradiction import Contradicts
from mnemo.graph.dedup import IntentMerges
from mnemo.graph.erasure import Embed
from mnemo.graph.model import (
    Changeset,
    CommitReceipt,
    Link,
    LinkType,
    Node,
    NodeType,
    Vector,
)
from mnemo.graph.scope import Scope, Where

if TYPE_CHECKING:
    from mnemo.graph.history import CommitRecord
    from mnemo.graph.maintenance import ConsolidationReport, DecayReport, ValidationReport
    from mnemo.graph.reembed import Staging, Unstaged


@dataclass(frozen=True, slots=True)
class Neighbor:
    """A node one link away from `origin`."""

    origin: str
    node_id: str
    link_type: LinkType


# (origin, its type, the node at the other end, its type, link type): what a recall hop needs.
TypedLink = tuple[str, NodeType, str, NodeType, LinkType]

T_co = TypeVar("T_co", covariant=True)


class PendingRead(Protocol[T_co]):
    """A read begun (where the store can: a job queued on a worker thread) and finished
    later: its caller goes on meanwhile."""

    async def result(self) -> T_co:
        """The read's answer (raises what the read raised: StorageError for a store's fault)."""

    def discard(self) -> None:
        """The answer is not wanted: nothing waits for it, and its failure is dropped."""


@dataclass(frozen=True, slots=True)
class NodeContext:
    """What recall reads about its best candidates in one round trip: the nodes (in the order
    asked, unknown ids left out), their access stats, some of their links, their unit vectors."""

    nodes: list[Node]
    stats: dict[str, tuple[int, datetime | None]]
    links: list[Neighbor]
    vectors: dict[str, Vector] = field(default_factory=dict)


# What a `node_context` reads next from what it read first: more node ids, and link types.
More = Callable[[NodeContext], tuple[Sequence[str], Iterable[NodeType]]]


@dataclass(frozen=True, slots=True)
class IntentPolicy:
    """How a commit deduplicates intents, retires the facts its facts contradict, and embeds
    again a changeset made before the repo was re-embedded."""

    identity_threshold: float
    merge_threshold: float
    merge: IntentMerges
    # Which existing facts new ones end; None: facts are never retired.
    contradicts: Contradicts | None = None
    contradiction_candidates: int = Config().contradiction_candidates
    contradiction_similarity: float = Config().contradiction_similarity
    # The changeset embedded again for the given generation of the repo's vectors; None: a
    # changeset of an older generation is refused (EmbeddingError).
    restamp: Callable[[Changeset, int], Awaitable[Changeset]] | None = None


@dataclass(frozen=True, slots=True)
class StepsCommitted:
    """The session side of a commit: its steps (with final rewards) are committed in
    `changeset_id`, and unless `state` is None the session moves to `state`. With `version`,
    the session must still be at that version, else nothing is written (`StaleSession`)."""

    session_id: str
    episode_id: str | None
    changeset_id: str
    steps: tuple[tuple[str, float | None], ...]
    state: str | None
    version: int | None = None


@dataclass(frozen=True, slots=True)
class SourceRecorded:
    """The ingest side of a commit: `source_id` of `repo` is the changeset's, by payload."""

    repo: str
    source_id: str
    payload_hash: str
    changeset_id: str
    created_at: str


@dataclass(frozen=True, slots=True)
class SourceForgotten:
    """The ingest side of a forget: the source id is free again."""

    repo: str
    source_id: str


SideWrite = StepsCommitted | SourceRecorded | SourceForgotten


@dataclass(frozen=True, slots=True)
class Reverting:
    """A withdrawal that reverts a commit (`GraphStore.withdraw`): the id its record takes,
    and the check, run under the repo's lock, that raises to refuse it."""

    revert_id: str
    refused: Callable[[], Awaitable[None]]


class VectorsMoved(Exception):
    """Raised by a recall (or a commit) made for another generation than the repo's vectors
    are of: nothing was searched (or written); the caller embeds again and tries again."""

    def __init__(self, generation: int) -> None:
        super().__init__(f"the repo's vectors are of generation {generation}")
        self.generation = generation


class SourceTaken(Exception):
    """Raised by `apply` when a `SourceRecorded`'s source is already recorded by another
    writer; nothing was written."""

    def __init__(self, source_id: str) -> None:
        super().__init__(f"source {source_id!r} was recorded by another writer")
        self.source_id = source_id


class NodeReads(Protocol):
    """What every role reads: nodes, links, the write lock, vector dimension and generation."""

    def lock(self, repo: str) -> AbstractAsyncContextManager[None]:
        """The repo's write lock: commits and maintenance hold it."""

    def dim(self, repo: str) -> int: ...

    async def generation(self, repo: str) -> int:
        """The generation of the repo's vectors, as of the enclosing `reading` block's look,
        else as the store holds them now."""

    async def get_nodes(self, repo: str, node_ids: Sequence[str]) -> list[Node]: ...

    async def neighbors(
        self, repo: str, node_ids: Sequence[str], link_type: LinkType | None = None
    ) -> list[Neighbor]: ...

class RecallReads(NodeReads, Protocol):
    """The reads of a recall (`mnemo.recall`)."""

    def reading(self, repo: str) -> AbstractAsyncContextManager[None]:
        """A block of reads that sees the repo at least as of its start (caches refreshed once)."""

    def vectors_on_loop(self, repo: str) -> bool:
        """Whether vector searches of the repo now answer quickly on the event loop (a hint)."""

    async def typed_links(self, repo: str, node_ids: Sequence[str]) -> list[TypedLink]: ...

    async def typed_links_near(
        self, repo: str, node_ids: Sequence[str], vector: Vector
    ) -> tuple[list[TypedLink], dict[str, float]]:
        """`typed_links`, and the similarity to `vector` of the nodes at their other ends."""

    async def node_context(self, repo: str, node_ids: Sequence[str], linked: Iterable[NodeType],
                           link_type: LinkType, then: More | None = None) -> NodeContext:
        """`get_nodes`, `access_stats` and `vectors` of `node_ids`, and their `neighbors` of
        `link_type` for those whose type is in `linked`, in one read. `then`, if given, is
        called once with that context and names more nodes and types to read in the same call;
        it runs where the store reads (SQLite: its worker thread), so it does no I/O."""

    async def scope(self, repo: str, where: Where) -> Scope:
        """`where` resolved for one recall or search, from the scope index (`Scope`)."""

    async def inside(self, repo: str, scope: Scope, node_ids: Sequence[str]) -> set[str]:
        ...

    async def search_text(
        self, repo: str, query: str, limit: int, types: Iterable[NodeType] | None = None,
        scope: Scope | None = None,
    ) -> list[tuple[str, float]]: ...

    def start_search_text(
        self, repo: str, query: str, limit: int, types: Iterable[NodeType] | None = None,
        scope: Scope | None = None,
    ) -> PendingRead[list[tuple[str, float]]]:
        """`search_text`, begun now where the store can (its lexical index's thread) and
        finished by `result`; every word of `query` is read off the event loop."""

    async def search_vectors(
        self, repo: str, vector: Vector, limit: int, types: Iterable[NodeType] | None = None,
        scope: Scope | None = None,
    ) -> list[tuple[str, float]]: ...

    async def nearest_of_type(
        self, repo: str, probes: Vector, kind: NodeType, k: int,
        among: Sequence[str] | None = None,
    ) -> list[list[tuple[str, float]]]:
        """For each probe row, the `k` nodes of `kind` nearest by cosine; with `among` (ids of
        `kind`), the nearest of those only."""

    async def similarities(
        self, repo: str, node_ids: Sequence[str], vector: Vector
    ) -> dict[str, float]: ...

    async def reinforce(self, repo: str, node_ids: Sequence[str], when: datetime) -> None:
        """Counts one access of each node at `when`, seen by every later call of this store.
        PostgreSQL writes it before returning, skipping locked nodes; SQLite queues it on its
        connection's thread (a write refused after a 0.1 s wait is logged, never raised)."""

    async def vectors(self, repo: str, node_ids: Sequence[str]) -> dict[str, Vector]:
        """The unit vector of each of these nodes that has one."""

class GraphWrites(NodeReads, Protocol):
    """Commits and erasures (`mnemo.graph.commit`, `mnemo.graph.erasure`, ingest), and the
    repo's commits as records (`mnemo.graph.history`); a revert withdraws one."""

    async def apply(
        self,
        changeset: Changeset,
        *,
        intents: IntentPolicy,
        also: Sequence[SideWrite] = (),
    ) -> CommitReceipt: ...

    async def receipt(self, changeset_id: str) -> CommitReceipt | None: ...

    async def ingested(self, repo: str, source_id: str) -> tuple[str, CommitReceipt] | None:
        """(payload hash, its commit's receipt naming the nodes still in the graph) of a
        recorded source, None if unknown (never recorded, or forgotten)."""

    async def withdraw(
        self, repo: str, key: str, *, embed: Embed, also: Sequence[SideWrite] = (),
        generation: int | None = None, reverting: Reverting | None = None,
    ) -> int:
        """Forgets the source `key`: deletes every node it produced, the routing nodes this
        leaves without links, and its commits' records; a node another source shares takes
        that source's wording (embedded by `embed` before the lock). With `reverting`, withdraws
        the commit `key` and records its revert. Returns how many nodes went. On any error
        (EmbeddingError from `embed`; VectorsMoved when the repo's vectors are not of
        `generation`; what `reverting.refused` raises) nothing was deleted."""

    async def delete_nodes(self, repo: str, node_ids: Sequence[str]) -> int: ...

    async def commit_log(
        self, repo: str, *, limit: int | None = None, after_seq: int | None = None
    ) -> list[CommitRecord]:
        """The repo's commits, newest first: the `limit` newest (None: all), or those after
        `after_seq`."""

    async def commit_record(self, repo: str, commit_id: str) -> CommitRecord | None: ...

class GraphMaintenance(NodeReads, Protocol):
    """Consolidation, decay and validation: each runs under `lock(repo)`, held by the caller."""

    async def unconsolidated(self, repo: str) -> set[str]:
        """The SEMANTIC nodes not yet compared by `consolidate`."""

    async def merge_duplicates(
        self, repo: str, pairs: list[tuple[str, str]], examined: list[str]
    ) -> ConsolidationReport:
        """Merges each pair's second node into its survivor, marks `examined`: one transaction."""

    async def decay_sweep(self, repo: str, config: Config, *, now: datetime) -> DecayReport:
        """Deletes the memories valued below `config.decay_threshold` at `now`, then the routing
        and source nodes left with no links, in one transaction."""

    async def validate(self, repo: str, dim: int) -> ValidationReport:
        """Checks (and repairs) the repo's episodic integrity, in one transaction."""

    async def vectors_of_type(self, repo: str, kind: NodeType) -> tuple[list[str], Vector]:
        """The ids and unit vectors (one row each) of every node of one type."""

class Reembedding(NodeReads, Protocol):
    """A repo's re-embedding: new vectors staged beside the old ones, then switched at once."""

    def reembedding(self, repo: str) -> AbstractAsyncContextManager[None]:
        """The repo's re-embedding, one at a time across processes: entered at once or not at
        all (ConflictError); a process that dies lets it go."""

    async def begin_reembed(self, repo: str, embedder: str, dim: int) -> Staging:
        """Starts the repo's re-embedding with embedder URI `embedder` of `dim` dimensions, or
        carries on with the one under way if it matches (else its staged vectors are dropped)."""

    async def unstaged(
        self, repo: str, after: int, limit: int, upto: int | None = None
    ) -> list[Unstaged]:
        """Up to `limit` nodes past rowid `after` (to `upto`) with no staged vector, by rowid."""

    async def last_rowid(self, repo: str) -> int:
        """The highest rowid of the repo's nodes (0 when it has none)."""

    async def stage(self, repo: str, nodes: Sequence[Unstaged], vectors: Vector) -> None:
        """Stages a vector (a row of `vectors`) per node still in the repo: one transaction."""

    async def unstage_changed(self, repo: str) -> None:
        """Drops the staged vectors of nodes whose text changed since the re-embedding last read
        the node log (all of them when the log no longer reaches back)."""

    async def switch_vectors(self, repo: str) -> tuple[int, int]:
        """Puts the staged vectors in place, records their embedder, dimension and the next
        generation, and ends the re-embedding, in one transaction (the caller holds
        `lock(repo)`). Returns (the new generation, how many vectors were switched).
        StorageError: no re-embedding under way, or a node without a staged vector."""

    async def vectors_switched(self, repo: str, dim: int) -> None:
        """Brings the backend's indexes beside the repo's vectors in step with the switched
        `dim`-dimension vectors (after the lock is let go: it may take long)."""

class GraphStore(RecallReads, GraphWrites, GraphMaintenance, Reembedding, Protocol):
    """A repo's knowledge graph, every role at once: what a backend implements."""

    async def get_nodes_by_type(self, repo: str, types: Iterable[NodeType]) -> list[Node]: ...

    async def node_ids(self, repo: str, like: str, unlike: str, limit: int) -> list[str]:
        """The ids of nodes matching LIKE `like`, not `unlike` (`\\` escapes), sorted, at most
        `limit`."""

    async def latest(self, repo: str, types: Iterable[NodeType], top_k: int) -> list[Node]: ...

    async def links(self, repo: str) -> list[Link]:
        """Every link of the repo, by type, then source, then destination."""

    async def scope_sources(self, repo: str, where: Where) -> list[tuple[str | None, str, str]]:
        """(source id or None, node id, type) of every node inside `where`, in the order added."""

    async def scope_nodes(self, repo: str, where: Where, limit: int, offset: int) -> list[Node]:
        """`limit` nodes inside `where` in the order added, after the first `offset`, in one
        read."""

    async def settle(self, repo: str) -> None:
        """Waits until the repo's indexes built in the background have caught up."""

    async def aclose(self) -> None: ...

    async def access_stats(
        self, repo: str, node_ids: Sequence[str]
    ) -> dict[str, tuple[int, datetime | None]]: ...
