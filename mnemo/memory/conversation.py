"""`Memory`'s methods over conversation threads: managers, viewport, eviction, goals, search."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from mnemo.errors import InvalidInputError, check_budget
from mnemo.graph.scope import check_where
from mnemo.memory.sessions import Parts
from mnemo.ports import LLM

if TYPE_CHECKING:
    from mnemo.conversation.manager import ConversationManager
    from mnemo.conversation.model import (
        Compression,
        EvictionResult,
        MessageView,
        Retrieval,
        SearchHit,
        ThreadInfo,
        Viewport,
    )


class ConversationMethods(Parts):
    def conversation(
        self,
        *,
        retrieval: Retrieval | None = None,
        compression: Compression | Sequence[Compression] | None = None,
        ttl: float | timedelta | None = None,
        auto_evict_budget: int | None = None,
        eviction_fraction: float = 0.33,
        clock: Callable[[], datetime] | None = None,
        llm: LLM | None = None,
        keep_system: bool = False,
    ) -> ConversationManager:
        """A `ConversationManager` over this Memory's database: `retrieval` is `Recent(k)`
        or `Semantic(k)` (None: `Recent(k=10)`), `compression` a `Summary`, a
        `ToolOutputPruner`, a list of both or None, `ttl` seconds after which raw messages
        are erased (at load). With `auto_evict_budget`, each save evicts when the tokens past
        the boundary exceed it. `clock` (returning an aware datetime) stamps messages and
        judges the ttl; `llm` writes the manager's summaries and evictions instead of the
        Memory's model. With `keep_system`, a thread's first messages while they are system
        or developer messages (at most 8: its instructions) come first in every `load`, and
        a summary never takes them in.

        Raises:
            InvalidInputError: a policy of the wrong type, a ttl that is not a positive number
                of seconds up to 100 years, a bad auto-eviction budget or fraction, a bad `llm`,
                or a `keep_system` that is not a bool.
        """
        from mnemo.conversation.manager import ConversationManager
        from mnemo.conversation.model import Recent, Semantic
        from mnemo.conversation.service import check_fraction, compressions, ttl_seconds

        retrieval = Recent(k=10) if retrieval is None else retrieval
        if not isinstance(retrieval, Recent | Semantic):
            raise InvalidInputError(
                f"retrieval must be mnemo.Recent or mnemo.Semantic, got {retrieval!r}")
        if auto_evict_budget is not None:
            check_budget("auto_evict_budget", auto_evict_budget)
        check_fraction(eviction_fraction)
        if not isinstance(keep_system, bool):
            raise InvalidInputError(f"keep_system must be a bool, got {keep_system!r}")
        service = self._conversations
        return ConversationManager(
            service, retrieval=retrieval, compression=compressions(compression),
            ttl=ttl_seconds(ttl), auto_evict_budget=auto_evict_budget,
            eviction_fraction=eviction_fraction, clock=clock or service.clock,
            llm=service.model(llm), keep_system=keep_system)

    async def list_threads(self) -> list[ThreadInfo]:
        """Every stored thread (not purged), oldest first: raw message count, next seq and
        viewport boundary."""
        return await self._conversations.store.threads()

    async def viewport(self, thread_id: str, *, token_budget: int) -> Viewport:
        """What the agent sees of the thread within `token_budget` tokens: the messages from
        the eviction boundary on (the newest that fit, never a tool result without its call),
        snapshots, messages pinned to open goals and past messages recalled for them
        (`mnemo.Viewport`). An unknown thread is empty.

        Raises:
            InvalidInputError: a blank thread id or a budget below 1.
        """
        return await self._conversations.viewport(thread_id, token_budget)

    async def evict(
        self, thread_id: str, *, token_budget: int, eviction_fraction: float = 0.33,
        llm: LLM | None = None,
    ) -> EvictionResult:
        """Moves the oldest `eviction_fraction` of the viewport out of it, never parting a
        tool call from its results (its newest message stays unless its call goes): the LLM
        (`llm`, else the Memory's) saves a snapshot and pins what must stay word for word; the
        boundary advances even when the LLM fails (`EvictionResult.error` says why). One
        eviction per thread at a time: a second one waits and starts from the new boundary.

        Raises:
            InvalidInputError: a blank thread id, a budget below 1, a fraction outside
                (0, 1], or an `llm` that is not one.
            NotFoundError: the thread was never saved.
        """
        return await self._conversations.evict(thread_id, token_budget, eviction_fraction, llm)

    async def add_goal(self, thread_id: str, description: str) -> str:
        """Adds an open goal to the thread; eviction may pin messages to it. Returns its id.

        Raises:
            InvalidInputError: a thread id that is no name, a blank description or one past
                `Config.max_text_chars`, or a thread with `Config.max_open_goals` open goals.
        """
        return await self._conversations.add_goal(thread_id, description)

    async def complete_goal(self, goal_id: str) -> None:
        """Completes the goal (again: nothing); messages it was the last open goal of are freed.

        Raises:
            NotFoundError: an unknown goal.
        """
        await self._conversations.complete_goal(goal_id)

    async def search_messages(
        self,
        query: str,
        *,
        thread_id: str | None = None,
        limit: int = 5,
        exclude_viewport_of: str | None = None,
        where: Mapping[str, object] | None = None,
    ) -> list[SearchHit]:
        """Messages of every thread (or of `thread_id`) matching the query's words, best
        first: FTS5 with porter stemming, each word quoted and OR-combined (AND, OR and NOT are
        words), bm25 weighted by recency, ~300-character snippets. Any text is a safe query;
        one without a word finds nothing. `exclude_viewport_of` leaves out what that thread's
        viewport shows (pinned messages stay findable); `where` keeps the messages saved with
        that scope's metadata.

        Raises:
            InvalidInputError: a blank query, one longer than `Config.max_text_chars`, a
                limit outside 1..100, or a malformed `where`.
        """
        return await self._conversations.search_messages(
            query, thread_id=thread_id, limit=limit, exclude_viewport_of=exclude_viewport_of,
            where=check_where(where),
        )

    async def message_ids(self, prefix: str, *, limit: int = 2) -> list[str]:
        """The ids of stored messages (of every thread) that start with `prefix`, sorted, at
        most `limit` (1..100).

        Raises:
            InvalidInputError: a blank prefix, or a limit outside 1..100.
        """
        return await self._conversations.message_ids(prefix, limit=limit)

    async def view_messages(self, message_id: str, *, radius: int = 10) -> MessageView:
        """The message with `radius` messages on each side (tool outputs reduced to ok or
        error) and the 3 nearest snapshots before and after it.

        Raises:
            InvalidInputError: a blank id, or a radius outside 0..100.
            NotFoundError: an unknown message.
        """
        return await self._conversations.view_messages(message_id, radius=radius)
