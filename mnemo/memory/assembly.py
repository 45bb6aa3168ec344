"""The parts of a `Memory`, built (`build`). Importing this module imports every part's module
and their libraries (seconds on a loaded machine), which a cold `Memory` does in a worker
thread (`load`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from mnemo.adapters.minilm import default_embedder
from mnemo.calls.retry import LimitedLLM
from mnemo.config import Config
from mnemo.conversation.service import ConversationService
from mnemo.cpu import import_kept
from mnemo.errors import StorageError
from mnemo.extraction.contradiction import intent_policy
from mnemo.ingest.service import IngestRuntime, IngestService
from mnemo.memory.repos import Repos
from mnemo.ports import LLM, Embedder, EventCallback, Events
from mnemo.recall.engine import Recaller  # noqa: F401 - imported here, off the loop, for recall
from mnemo.recall.query import TagVectors
from mnemo.session import extracting, operations
from mnemo.session.registry import Sessions, claimed, store_moved
from mnemo.session.timers import BackgroundWork
from mnemo.storage.ports import has_postgres_driver, is_postgres, open_backend

if TYPE_CHECKING:
    from mnemo.memory.sessions import Parts

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SourceClaims:
    """`ingest.service.Claims` of the Memory `live` serves: a claim lapses with its holder (a
    process gone, or unseen for a lease)."""

    live: Sessions

    async def claim(self, repo: str, source_id: str, digest: str) -> str | None:
        live = self.live
        return await claimed(live, lambda cut, gone: live.coordination.claim_source(
            repo, source_id, digest, live.holder_id, unseen_since=cut, gone=gone),
            lambda held: held is None)

    async def release(self, repo: str, source_id: str) -> None:
        try:
            await self.live.coordination.release_source(repo, source_id, self.live.holder_id)
        except StorageError as exc:  # the ingest's own outcome stands
            log.warning("the claim on source %r of repo %r stays until this Memory closes: %r",
                        source_id, repo, exc)

    async def token(self) -> int:
        return await self.live.coordination.change_token()

    async def moved(self, token: int) -> None:
        await store_moved(self.live, token)


def load(path: str) -> None:
    """Imports the backend's module for `path` and checks the default embedder's files
    (their digests are kept for `build`). Runs in a worker thread."""
    if not is_postgres(path) or has_postgres_driver():  # else `build` says what to install
        import_kept(backend_module(path))
    default_embedder()


def backend_module(path: str) -> str:
    """The module `open_backend(path)` imports."""
    return "mnemo.storage.postgres.store" if is_postgres(path) else "mnemo.storage.sqlite"


def build(
    memory: Parts, path: str, llm: LLM | None, embedder: Embedder | None,
    on_event: EventCallback | None, synchronous: str, *, config: Config, inspect: bool,
) -> None:
    repos: Repos  # made once the backend is (`dims` is asked later)
    backend = open_backend(
        path, dims=lambda repo: repos.dim(repo), busy_timeout=config.busy_timeout,
        synchronous=synchronous, lexical_dir=config.lexical_dir, ann_dir=config.ann_dir,
        inspect=inspect,
    )
    sessions = backend.sessions
    repos = Repos(config, llm, embedder, sessions.load_repos)
    events = Events(on_event)

    def ingest_runtime(repo: str) -> IngestRuntime:
        runtime = repos.embedding(repo)
        chosen = repos.limits.llm_for(runtime.llm, runtime.config, repo)
        return IngestRuntime(
            chosen, runtime.embedder, runtime.config,
            intent_policy(runtime.config, runtime.embedder, chosen, repo, repos.refresh),
            runtime.generation,
        )

    live = Sessions(
        store=sessions,
        coordination=backend.coordination,
        graph=backend.graph,
        events=events,
        repos=repos,
        lease=timedelta(seconds=config.lease_timeout),
        shortest_idle=config.idle_session_timeout,
        effects=extracting.start,
        answer_ended=operations.answer_ended,
    )
    memory._backend, memory._sessions_store, memory._repos = backend, sessions, repos
    memory._events, memory._graph, memory._live = events, backend.graph, live
    memory._background = BackgroundWork(live)
    memory._tag_vectors = TagVectors()
    memory._ingests = IngestService(backend.graph, ingest_runtime, events, SourceClaims(live))
    def limited(llm: LLM) -> LLM:  # conversation memory's calls count in `usage()`'s total
        if isinstance(llm, LimitedLLM):  # a manager's own model, given back: metered already
            return llm
        return LimitedLLM(llm, repos.limits.slots(llm, config),
                          lambda usage: repos.limits.usage.add(None, None, usage))

    memory._conversations = ConversationService(
        backend.threads,
        llm=limited(repos.llm),
        limit=limited,
        embedder=repos.embedder,
        config=config,
        events=events,
        # A message's age is judged by every Memory on the store: by the store's clock.
        clock=backend.coordination.now,
    )
