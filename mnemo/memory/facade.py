"""`Memory`: the one object an app opens, a thin facade over the parts (a storage backend,
`Repos`, the live `Sessions`, `Recaller`, `IngestService`, `ConversationService`). This module
builds, opens and closes them and holds the methods over repos, recall and ingest; `Memory`
inherits the others (`memory.sessions`, `memory.graph`, `memory.conversation`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import datetime
from importlib.util import find_spec
from typing import TYPE_CHECKING, TypeVar

import anyio

from mnemo.config import Config
from mnemo.cpu import import_kept
from mnemo.errors import (
    POSTGRES_SCHEMES,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    StorageError,
    check_id,
    check_models,
    check_store,
)
from mnemo.graph.scope import check_metadata, check_where
from mnemo.memory.conversation import ConversationMethods
from mnemo.memory.graph import GraphMethods
from mnemo.memory.sessions import SessionMethods

if TYPE_CHECKING:
    from mnemo.graph.model import NodeType
    from mnemo.graph.scope import Where
    from mnemo.ingest.model import IngestProgress, IngestReceipt, Trajectory
    from mnemo.ports import LLM, Embedder, EventCallback, Reranker, Usage
    from mnemo.recall.engine import RecallResult

T = TypeVar("T")

# SQLite's `synchronous` settings a Memory takes (WAL makes NORMAL durable against a killed
# process; FULL and EXTRA against power loss).
SYNCHRONOUS = ("NORMAL", "FULL", "EXTRA")


class Memory(SessionMethods, GraphMethods, ConversationMethods):
    """An agent's memory in one SQLite file (or `":memory:"`), or a PostgreSQL database.

    `path` is a SQLite file's path (`str` or `os.PathLike`), `":memory:"`, or a PostgreSQL
    URL; anything else, like an `on_event` that is not callable, is `InvalidInputError` before
    anything is created. `llm=None` is the offline LLM (deterministic heuristics, no network);
    `embedder=None` the embedded default embedder. Use it as an async context manager, or call
    `aclose()`; it closes only the models it made, never those passed to it. It is entered once
    (again: `StorageError("closed")`; a new Memory opens the store again). Opening one that
    works ends the store's idle sessions past their `Config.idle_session_timeout`.

    `inspect=True` opens the store to look inside it (the command line's reads, the web app,
    MCP read tools): the Memory starts no background task, records no repo's settings or
    models, calls no model but for its own calls, counts no access in `recall` unless
    `reinforce=True`, and refuses what would start work (`open_repo` of an unknown repo, a
    session's calls, `ingest`, a store older than this mnemo, which it leaves so) with
    `StorageError("read_only")`. Deliberate edits (`forget`,
    `revert`, a thread's `purge`) go through.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] = ":memory:",
        *,
        llm: LLM | None = None,
        embedder: Embedder | None = None,
        config: Config | None = None,
        on_event: EventCallback | None = None,
        synchronous: str = "NORMAL",
        inspect: bool = False,
        reranker: Reranker | None = None,
    ) -> None:
        path = check_store(path)
        check_models(llm, embedder, reranker)
        if config is not None and not isinstance(config, Config):
            raise InvalidInputError(f"config must be a mnemo.Config, got {type(config).__name__}")
        if on_event is not None and not callable(on_event):
            raise InvalidInputError(f"on_event must be callable or None, got {on_event!r}")
        if not isinstance(synchronous, str) or synchronous.upper() not in SYNCHRONOUS:
            raise InvalidInputError(
                f"synchronous must be one of {', '.join(SYNCHRONOUS)}, got {synchronous!r}")
        self._config = config or Config()
        self._inspect = inspect
        self._entered = False
        self._parts = (path, llm, embedder, on_event, synchronous.upper(), reranker)
        if _loaded(path) or _without_driver(path):
            self._build()  # at once (without the driver: raises what to install)

    def _build(self) -> None:
        """Builds the parts (`memory.assembly`), once their modules are imported."""
        from mnemo.memory import assembly

        assembly.build(self, *self._parts[:5], config=self._config, inspect=self._inspect)

    async def __aenter__(self) -> Memory:
        if self._entered:
            raise StorageError("closed", "a Memory opens once: make a new mnemo.Memory to open "
                               "the store again")
        self._entered = True
        if "_backend" not in vars(self):
            # A cold start: the parts' modules (threadpoolctl's among them) are imported off
            # the event loop.
            await anyio.to_thread.run_sync(_load, self._parts[0])
            self._build()
        from mnemo.graph.blas import limit_blas_threads

        # On the loop's thread: OpenBLAS counts a limit set from another thread for that one.
        limit_blas_threads(self._config.blas_threads)
        await self._backend.open()
        try:
            self._repos.load(await self._sessions_store.load_repos())
            await self._repos.adopt_profiles(self._sessions_store)
            if self._inspect:
                return self  # sessions are read from the store when asked, never restored
            from mnemo.session.timers import end_idle

            # Idle sessions left behind end before the live ones are restored.
            await end_idle(self._live)
            known = set(self._repos.names())
            live = await self._sessions_store.load_live()
            await self._background.start([s for s in live if s.repo in known])
        except BaseException:
            await self._backend.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stops background work (an interrupted extraction resumes on the next open), closes
        the models this Memory made (never those it was given) and the database.

        Raises:
            RuntimeError: called from this Memory's operation callback or event handler,
                which its close would wait for; nothing is closed.
        """
        if "_backend" not in vars(self):
            return  # never built: nothing was opened
        if self._background.hosts_this_task():
            raise RuntimeError("aclose() from a callback or event handler of this Memory would "
                               "wait for itself: close the Memory after the handler returns")
        try:
            if await self._background.stop():
                with anyio.move_on_after(2, shield=True):
                    await self._save_profiles()
        finally:
            with anyio.move_on_after(2, shield=True):
                await self._repos.close_adapters()
            await self._backend.close()

    async def open_repo(
        self,
        name: str,
        *,
        llm: LLM | None = None,
        embedder: Embedder | None = None,
        config: Config | None = None,
    ) -> None:
        """Creates the repo if needed and sets the llm, embedder and config its sessions
        inherit. Idempotent; restored sessions of the repo resume their extraction now. On an
        inspecting Memory it records and resumes nothing: the models and config apply to its
        own calls.

        Raises:
            InvalidInputError: a blank name or a config that is not a `Config`.
            EmbeddingError: the embedder's dimension differs from the repo's vectors', or it is
                given for a repo of the hashed embedder's retired features.
            StorageError: "read_only", a repo the store does not hold on an inspecting Memory.
        """
        check_id(name, "repo name")
        check_models(llm, embedder)
        if config is not None and not isinstance(config, Config):
            raise InvalidInputError(f"config must be a mnemo.Config, got {type(config).__name__}")
        if self._inspect:
            await self._repos.learn(name)
            if name not in self._repos.names():
                self._works(f"open_repo of the new repo {name!r}")
        if name in self._repos.names():
            await self._repos.refresh(name)  # its record, as another Memory may have moved it
        await self._repos.open(
            name, llm=llm, embedder=embedder, config=config,
            save=None if self._inspect else self._sessions_store.save_repo,
        )
        await self._repos.adopt_profiles(self._sessions_store)
        if not self._inspect:
            self._live.look.set()  # the takeover task looks for work the repo's model may do

    async def list_repos(self) -> list[str]:
        """The names of every repo in the store (opened through any Memory), oldest first."""
        await self._repos.learn()
        return self._repos.names()

    async def repo_config(self, repo: str) -> Config:
        """The config the repo's sessions and ingests run with, as `open_repo` recorded it.

        Raises:
            InvalidInputError: a repo name that is not a string (or is blank, ...).
            NotFoundError: an unknown repo.
        """
        return (await self._repos.known(repo)).config

    def usage(self, session_id: str | None = None, *, repo: str | None = None) -> Usage:
        """Tokens and cost the LLM spent for a session, a repo, or (neither given) everything,
        conversation memory's calls included, since this Memory was opened."""
        if session_id is not None:
            return self._repos.limits.usage.of_session(check_id(session_id, "session_id"))
        if repo is not None:
            return self._repos.limits.usage.of_repo(check_id(repo, "repo"))
        return self._repos.limits.usage.total()

    async def recall(
        self,
        repo: str,
        query: str,
        *,
        k: int = 10,
        types: Iterable[NodeType] | None = None,
        reinforce: bool | None = None,
        as_of: datetime | None = None,
        valid_at: datetime | None = None,
        where: Mapping[str, object] | None = None,
    ) -> RecallResult:
        """The repo's memories most relevant to `query`, best first; with `where` (metadata
        key -> a value or a list of values), only the nodes of that scope (`Node.metadata`).
        Each memory returned counts as one access (its value grows) unless `reinforce=False`
        (on an inspecting Memory, only with `reinforce=True`). A fact a later one contradicted
        ranks below it (`Recalled.retired`); `as_of` answers as the memory stood then,
        `valid_at` with the facts that held at that moment (either or both).

        Raises:
            InvalidInputError: a blank query or one past `Config.max_text_chars`, a k below 1,
                an `as_of` or `valid_at` not a datetime, or a malformed `where`.
            NotFoundError: an unknown repo.
            ConflictError: the repo was re-embedded twice by another Memory meanwhile.
            EmbeddingError: the repo's embedder cannot run here (a record not built here).
                One that fails leaves the words channel and the graph to answer, and
                `RecallResult.degraded` names it.
        """
        from mnemo.recall.ranking import check_recall

        scope = check_where(where)
        kinds, moment, valid = await self._repos.checked(
            repo, lambda c: check_recall(c, query, k, types, as_of, valid_at))
        chosen = not self._inspect if reinforce is None else reinforce
        return await self._following_switches(repo, lambda: self._recall(
            repo, query, k=k, types=kinds, reinforce=chosen, as_of=moment, valid_at=valid,
            where=scope))

    async def _following_switches(
        self, repo: str, call: Callable[[], Awaitable[T]], doing: str = "recalled"
    ) -> T:
        """`call()`, run once more with the repo's current embedder when another Memory
        re-embedded the repo; ConflictError if it was re-embedded again before that run."""
        from mnemo.graph.ports import VectorsMoved

        try:
            return await call()
        except VectorsMoved as moved:
            await self._repos.refresh(repo, moved.generation)
        try:
            return await call()
        except VectorsMoved as moved:
            raise ConflictError(
                f"repo {repo!r} was re-embedded twice while it was {doing}") from moved

    async def ingest(
        self,
        repo: str,
        trajectory: Trajectory,
        *,
        source_id: str,
        progress: Callable[[IngestProgress], Awaitable[None] | None] | None = None,
        metadata: dict[str, str | int | float | bool] | None = None,
    ) -> IngestReceipt:
        """Stores a complete trajectory in one call (annotation, segmentation, extraction,
        commit); returns when its nodes are durable. Idempotent by `source_id` within the repo:
        the same payload again returns the first receipt with `created=False`; concurrent
        identical calls do the work once. `progress` (sync or async) gets an `IngestProgress`
        at each stage, also emitted to `on_event` as `"ingest_progress"`; what it raises is
        logged, never propagated. Every node committed carries `metadata` (what `where=`
        selects); the same source under another metadata is another payload.

        Raises (nothing is stored):
            InvalidInputError: a malformed trajectory or source id, a blank goal or
                observation, more steps than `Config.max_steps_per_ingest`, a text or metadata
                past `Config.max_text_chars` or `inputs.MAX_JSON_DEPTH`, or a bad `metadata`.
            NotFoundError: an unknown repo.
            ConflictError: the source id was used with a different payload.
            EmbeddingError: the repo's embedder cannot run here (a record not built here).
            PipelineError: "extraction_failed".
        """
        from mnemo.ingest.service import check_ingest

        self._works("ingest")
        scoped = check_metadata(metadata)
        await self._repos.checked(
            repo, lambda config: check_ingest(trajectory, source_id, progress, config))
        await self._repos.refresh(repo)
        try:
            return await self._ingests.ingest(repo, trajectory, source_id, progress, scoped)
        finally:
            await self._save_profiles()

    async def forget(self, repo: str, source_id: str) -> int:
        """Removes every node the source produced, with its links, vectors and search
        entries, and the tags and intents it left unlinked (an intent another source uses
        takes that source's wording). Returns how many nodes went (0 for an unknown source);
        the source id can then be ingested again. A session of the repo goes whole, its
        record, metadata, episodes and steps: a live one is ended first (as `end_session`), and
        so is the session of an episode still open, whose stored steps go with it.

        Raises:
            EmbeddingError: such an intent's new wording could not be embedded; nothing went.
            ConflictError: another Memory re-embedded the repo twice meanwhile.
        """
        check_id(source_id, "source_id")
        await self._repos.known(repo)
        await self._repos.refresh(repo)
        episode = await self._sessions_store.episode(source_id)
        live = episode.session_id if episode is not None and episode.status == "open" else source_id
        try:
            session = await self._live.fetch(live)
        except NotFoundError:
            session = None
        if session is not None and session.repo == repo:
            await self._end(session)
        return await self._following_switches(
            repo, lambda: self._ingests.forget(repo, source_id), "forgotten")

    async def forget_where(self, repo: str, where: Mapping[str, object]) -> int:
        """Erases everything in the scope `where` selects, as `forget` erases a source: each
        ingest with nodes in it, each session with nodes or metadata in it (a live one is
        ended), then any node of the scope still there. Returns how many nodes went.

        Raises:
            InvalidInputError: a malformed or empty `where`.
            NotFoundError: an unknown repo.
            EmbeddingError: as `forget`'s.
        """
        scope = check_where(where)
        if scope is None:
            raise InvalidInputError("forget_where needs a where with at least one key")
        await self._repos.checked(repo, lambda config: None)
        found = await self._graph.scope_sources(repo, scope)
        sources = {s for s, _, _ in found if s is not None}
        sources.update(await self._sessions_store.scoped(repo, scope))
        steps = [i for _, i, kind in found if kind == "source"]
        for node in await self._graph.get_nodes(repo, steps):
            if isinstance(session := node.data.get("session_id"), str):
                sources.add(session)
        gone = 0
        for source in sorted(sources):
            gone += await self.forget(repo, source)
        rest = [i for _, i, _ in await self._graph.scope_sources(repo, scope)]
        for at in range(0, len(rest), 500):
            gone += await self._graph.delete_nodes(repo, rest[at:at + 500])
        return gone

    async def recall_in_context(
        self, repo: str, session_id: str, query: str, *, k: int = 10,
        where: Mapping[str, object] | None = None,
    ) -> RecallResult:
        """`recall` with the session's goal and last 3 steps added to the query (cut to fit
        `Config.max_text_chars`); an unknown or idle session falls back to the plain query.

        Raises:
            InvalidInputError: as `recall`'s, or a session id that is not a string.
            ConflictError: as `recall`'s.
        """
        from mnemo.recall.ranking import check_recall

        check_id(session_id, "session_id")
        scope = check_where(where)
        await self._repos.checked(repo, lambda c: check_recall(c, query, k, None, None))
        limit = self._repos.get(repo).config.max_text_chars  # a known repo, once checked
        try:
            context = await self._session_context(session_id, 3)
        except NotFoundError:
            context = None
        if context is not None:
            query = "\n".join([query, context.goal, *context.recent_steps])[:limit]
        return await self._following_switches(repo, lambda: self._recall(
            repo, query, k=k, types=None, reinforce=not self._inspect,
            session_id=session_id, where=scope,
        ))

    async def _recall(
        self, repo: str, query: str, *, k: int, types: list[NodeType] | None, reinforce: bool,
        as_of: datetime | None = None, valid_at: datetime | None = None,
        session_id: str | None = None, where: Where | None = None,
    ) -> RecallResult:
        """The recall of checked input with the repo's runtime (its LLM only when the config
        asks a model to plan, re-rank or synthesise), reported as "recall_executed"."""
        from mnemo.adapters.recorded import check_runnable
        from mnemo.recall.engine import Recaller
        from mnemo.recall.tasks import LLMReranker

        runtime = self._repos.embedding(repo)
        check_runnable(runtime.embedder)  # a failing one leaves the words: `degraded`
        config = runtime.config
        asks = config.recall_planner == "llm" or config.recall_rerank or config.recall_synthesis
        llm = self._repos.limits.llm_for(runtime.llm, runtime.config, repo) if asks else None
        recaller = Recaller(
            self._graph, runtime.embedder, config, tag_vectors=self._tag_vectors, llm=llm,
            planner=llm if config.recall_planner == "llm" else None,
            generation=runtime.generation,
            reranker=self._parts[5] or (LLMReranker(llm) if llm and config.recall_rerank else None),
        )
        result = await recaller.recall(
            repo, query, k=k, types=types, reinforce=reinforce, as_of=as_of, valid_at=valid_at,
            where=where,
        )
        await self._events.emit(
            "recall_executed", session_id=session_id, repo=repo, query=query, k=k,
            node_ids=[m.node.id for m in result.memories],
        )
        return result


def _loaded(path: str) -> bool:
    """Whether the parts' modules (with the backend's for `path`) are imported already."""
    assembly = sys.modules.get("mnemo.memory.assembly")
    return assembly is not None and assembly.backend_module(path) in sys.modules


def _without_driver(path: str) -> bool:
    if not path.startswith(POSTGRES_SCHEMES):
        return False
    try:
        return find_spec("psycopg") is None
    except ValueError:  # a module set to None in sys.modules: as if not installed
        return True


def _load(path: str) -> None:
    import_kept("mnemo.memory.assembly")  # the parts' modules, whatever was imported before
    import_kept("mnemo.graph.blas")
    from mnemo.memory import assembly

    assembly.load(path)
