"""`RecallService`: a repo's recall as `Memory.recall` runs it: the input checked, a `Recaller`
built with the repo's runtime, and the "recall_executed" event reported."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from mnemo.config import Config
from mnemo.events import Events
from mnemo.graph.model import NodeType
from mnemo.graph.ports import RecallReads
from mnemo.graph.reads import node_types
from mnemo.graph.scope import Where
from mnemo.inputs import check_count, check_text
from mnemo.ports import LLM, Reranker
from mnemo.recall import ranking
from mnemo.recall.engine import Recaller, RecallResult
from mnemo.recall.query import LLMReranker, TagVectors

if TYPE_CHECKING:
    from mnemo.session.machine import Runtime


class RecallService:
    """Recalls of every repo, each with its repo's runtime (`runtime`: NotFoundError for an
    unknown repo): its embedder and config, the LLM that plans the query (the repo's, or
    `offline` as `Config.recall_planner` says), the one that synthesises (`llm_for`), and
    `reranker`, else the LLM's re-ranking when `Config.recall_rerank` asks for one."""

    def __init__(
        self,
        graph: RecallReads,
        events: Events,
        *,
        runtime: Callable[[str], Runtime],
        llm_for: Callable[[Runtime, str], LLM],
        offline: LLM,
        reranker: Reranker | None = None,
    ) -> None:
        self._graph = graph
        self._events = events
        self._runtime = runtime
        self._llm_for = llm_for
        self._offline = offline
        self._reranker = reranker
        self._tag_vectors = TagVectors()

    async def recall(
        self, repo: str, query: str, *, k: int, types: Iterable[NodeType] | None, reinforce: bool,
        as_of: datetime | None = None, valid_at: datetime | None = None,
        session_id: str | None = None, where: Where | None = None,
    ) -> RecallResult:
        """The recall, reported as "recall_executed" (with `session_id` when it ran in the
        context of a session, `recall_in_context`)."""
        runtime = self._runtime(repo)
        config = runtime.config
        kinds, as_of, valid_at = check_recall(config, query, k, types, as_of, valid_at)
        llm = self._llm_for(runtime, repo)
        recaller = Recaller(
            self._graph, runtime.embedder, config,
            planner=runtime.llm if config.recall_planner == "llm" else self._offline, llm=llm,
            tag_vectors=self._tag_vectors, generation=runtime.generation,
            reranker=self._reranker or (LLMReranker(llm) if config.recall_rerank else None),
        )
        result = await recaller.recall(
            repo, query, k=k, types=kinds, reinforce=reinforce, as_of=as_of, valid_at=valid_at,
            where=where,
        )
        await self._events.emit(
            "recall_executed", session_id=session_id, repo=repo, query=query, k=k,
            node_ids=[m.node.id for m in result.memories],
        )
        return result


def check_recall(
    config: Config, query: object, k: object, types: Iterable[NodeType] | None,
    as_of: object, valid_at: object = None,
) -> tuple[list[NodeType] | None, datetime | None, datetime | None]:
    """A recall's input checked against the repo's `config`: the types asked for and the
    moments (`as_of` and `valid_at`, made aware).

    Raises:
        InvalidInputError: a blank query or one past `Config.max_text_chars`, a `k` below 1
            or past `Config.max_results`, types that are not node types, an `as_of` that is
            not a datetime, or a `valid_at` that is not one.
    """
    check_text(query, "query", limit=config.max_text_chars, stored=False)
    check_count("k", k, minimum=1, maximum=config.max_results, setting="Config.max_results")
    return (None if types is None else node_types(types), ranking.check_moment(as_of, "as_of"),
            ranking.check_moment(valid_at, "valid_at"))
