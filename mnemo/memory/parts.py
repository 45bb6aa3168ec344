"""`Parts`: the parts of a `Memory` as each group of its methods (`SessionMethods`,
`GraphMethods`, `ConversationMethods`) sees them, and the check that refuses work on an
inspecting Memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mnemo.errors import StorageError

if TYPE_CHECKING:
    from mnemo.conversation.service import ConversationService
    from mnemo.graph.ports import GraphStore
    from mnemo.ingest.service import IngestService
    from mnemo.memory.repos import Repos
    from mnemo.ports import LLM, Embedder, EventCallback, Events, Reranker
    from mnemo.recall.query import TagVectors
    from mnemo.session.ports import SessionStore
    from mnemo.session.registry import Sessions
    from mnemo.session.timers import BackgroundWork
    from mnemo.storage.ports import Backend


class Parts:
    """The stores and services of one `Memory`; `memory.assembly.build` sets every one."""

    _inspect: bool
    _backend: Backend
    _sessions_store: SessionStore
    _repos: Repos
    _events: Events
    _graph: GraphStore
    _background: BackgroundWork
    _live: Sessions
    _tag_vectors: TagVectors
    _ingests: IngestService
    _conversations: ConversationService
    # What `build` builds the parts from.
    _parts: tuple[str, LLM | None, Embedder | None, EventCallback | None, str, Reranker | None]

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> object:
            # Only for a part not built yet (the parts are annotated above; `_inspect` and
            # `_parts` are set first): a Memory opened cold builds them when entered.
            if name in Parts.__annotations__:
                raise StorageError("closed", "the Memory is not open: enter it first")
            raise AttributeError(name)

    def _works(self, call: str) -> None:
        """Refuses work on an inspecting Memory: `StorageError("read_only")`."""
        if self._inspect:
            raise StorageError(
                "read_only", f"{call} needs a Memory that works; this one was opened with "
                "inspect=True"
            )

    async def _save_profiles(self) -> None:
        if not self._inspect:
            await self._repos.save_profiles(self._sessions_store)
