"""`Parts`: the parts `Memory.__init__` builds, as every group of its methods sees them, and
the check that refuses work on an inspecting Memory.

`Memory` (`mnemo.memory.facade`) inherits its methods from one class per capability,
`SessionMethods`, `GraphMethods` and `ConversationMethods`; each is a `Parts`, so each reaches
the same typed parts without importing the facade.
"""

from __future__ import annotations

from mnemo.conversation.service import ConversationService
from mnemo.errors import StorageError
from mnemo.events import Events
from mnemo.graph.ports import GraphStore
from mnemo.graph.reads import GraphReads
from mnemo.ingest.service import IngestService
from mnemo.memory.repos import Repos
from mnemo.recall.service import RecallService
from mnemo.session.host import TaskHost
from mnemo.session.ports import SessionStore
from mnemo.session.service import SessionService
from mnemo.storage.ports import Backend


class Parts:
    """The stores and services of one `Memory`; `Memory.__init__` sets every one."""

    _inspect: bool
    _backend: Backend
    _sessions_store: SessionStore
    _repos: Repos
    _events: Events
    _graph: GraphStore
    _service: SessionService
    _reads: GraphReads
    _recalls: RecallService
    _ingests: IngestService
    _conversations: ConversationService
    _host: TaskHost | None

    def _works(self, call: str) -> None:
        """Refuses a call that would start work on an inspecting Memory.

        Raises:
            StorageError: "read_only".
        """
        if self._inspect:
            raise StorageError(
                "read_only", f"{call} needs a Memory that works; this one was opened with "
                "inspect=True"
            )

    async def _save_profiles(self) -> None:
        """Records what the repos' models learned of their servers (an inspecting Memory
        records nothing)."""
        if not self._inspect:
            await self._repos.save_profiles(self._sessions_store)
