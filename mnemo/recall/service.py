"""`RecallService`: a repo's recall as `Memory.recall` runs it: the input checked, a `Recaller`
built with the repo's runtime, and the "recall_executed" event reported."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from mnemo.config import Config
from mnemo.events import Events
from mnemo.graph.model import NodeType
from mnemo.graph.ports import GraphStore
from mnemo.graph.reads import node_types
from mnemo.inputs import check_count, check_text
from mnemo.ports import LLM, Embedder
from mnemo.recall import temporal
from mnemo.recall.engine import Recaller, RecallResult
from mnemo.recall.tag_vectors import TagVectors


@dataclass(frozen=True, slots=True)
class RecallRuntime:
    """What a recall in one repo runs with: its embedder and config, the LLM that plans the
    query and the one that synthesises."""

    embedder: Embedder
    config: Config
    planner: LLM
    llm: LLM
    # The generation of the repo's vectors `embedder` makes (`RepoRow.generation`).
    generation: int | None = None


class RecallService:
    """Recalls of every repo; `runtime` raises NotFoundError for an unknown repo."""

    def __init__(
        self,
        graph: GraphStore,
        events: Events,
        *,
        runtime: Callable[[str], RecallRuntime],
        max_chars: Callable[[str], int],
    ) -> None:
        self._graph = graph
        self._events = events
        self._runtime = runtime
        self._max_chars = max_chars
        self._tag_vectors = TagVectors()

    async def recall(
        self, repo: str, query: str, *, k: int, types: Iterable[NodeType] | None, reinforce: bool,
        as_of: datetime | None = None, valid_at: datetime | None = None,
        session_id: str | None = None,
    ) -> RecallResult:
        """The recall, reported as "recall_executed" (with `session_id` when it ran in the
        context of a session, `recall_in_context`)."""
        check_text(query, "query", limit=self._max_chars(repo), stored=False)
        as_of = temporal.check_moment(as_of, "as_of")
        valid_at = temporal.check_moment(valid_at, "valid_at")
        runtime = self._runtime(repo)
        check_count("k", k, minimum=1, maximum=runtime.config.max_results,
                    setting="Config.max_results")
        recaller = Recaller(
            self._graph, runtime.embedder, runtime.config, planner=runtime.planner,
            llm=runtime.llm, tag_vectors=self._tag_vectors, generation=runtime.generation,
        )
        result = await recaller.recall(
            repo, query, k=k, types=None if types is None else node_types(types),
            reinforce=reinforce, as_of=as_of, valid_at=valid_at,
        )
        await self._events.emit(
            "recall_executed", session_id=session_id, repo=repo, query=query, k=k,
            node_ids=[m.node.id for m in result.memories],
        )
        return result
