"""`Parts`: the parts of a `Memory` as each group of its methods (`SessionMethods`,
`GraphMethods`, `ConversationMethods`) sees them, and the check that refuses work on an
inspecting Memory. `SessionMethods`: `Memory`'s methods over sessions: start, append, close,
commit or discard (each also queued, with a callback), and reads of what a session stored. The
session modules are imported inside the methods (with the parts, off the event loop)."""

from __future__ import annotations

import sys
import uuid
from typing import TYPE_CHECKING, Any

import anyio

from mnemo.config import DAY, DURATION_CEILINGS, Config
from mnemo.errors import (
    InvalidInputError,
    NotFoundError,
    PipelineError,
    SessionError,
    StorageError,
    check_count,
    check_id,
    check_models,
    check_seconds,
    check_text,
)
from mnemo.graph.scope import check_metadata

if TYPE_CHECKING:
    from mnemo.conversation.service import ConversationService
    from mnemo.episode import EpisodeLog, StepInfo
    from mnemo.graph.model import CommitReceipt
    from mnemo.graph.ports import GraphStore
    from mnemo.ingest.service import IngestService
    from mnemo.memory.repos import Repos
    from mnemo.ports import LLM, Embedder, EventCallback, Events, Reranker
    from mnemo.recall.query import TagVectors
    from mnemo.session.machine import Callback, SessionContext, SessionInfo, SessionRecord, State
    from mnemo.session.ports import SessionStore
    from mnemo.session.registry import Sessions
    from mnemo.session.timers import BackgroundWork
    from mnemo.storage.ports import Backend

# The most extraction retries one `close_and_commit` may ask for.
MAX_RETRIES = 100


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
                "inspect=True")

    async def _save_profiles(self) -> None:
        if not self._inspect:
            await self._repos.save_profiles(self._sessions_store)


class SessionMethods(Parts):
    async def start_session(
        self,
        goal: str,
        *,
        repo: str,
        llm: LLM | None = None,
        embedder: Embedder | None = None,
        config: Config | None = None,
        metadata: dict[str, str | int | float | bool] | None = None,
    ) -> str:
        """Opens a session collecting its first episode towards `goal`; returns its id. Every
        node it commits carries `metadata` (`Node.metadata`).

        Raises:
            InvalidInputError: a blank goal or one past `Config.max_text_chars`, a config that
                is not a `Config`, or a metadata outside `mnemo.graph.scope`'s bounds.
            NotFoundError: an unknown repo.
            EmbeddingError: the embedder override's dimension differs from the repo's.
        """
        self._works("start_session")
        check_models(llm, embedder)
        scoped = check_metadata(metadata)
        if config is not None and not isinstance(config, Config):
            raise InvalidInputError(f"config must be a mnemo.Config, got {type(config).__name__}")
        await self._repos.checked(repo, lambda repo_config: check_text(
            goal, "goal", limit=(config or repo_config).max_text_chars))
        await self._repos.refresh(repo)  # another Memory may have re-embedded it
        override, chosen = await self._repos.session_runtime(repo, llm, embedder, config)
        from mnemo.episode import EpisodeRecord
        from mnemo.session.machine import State

        session_id = f"session_{uuid.uuid4().hex}"
        episode = EpisodeRecord(f"episode_{uuid.uuid4().hex}", goal)
        live = self._live
        holder = until = None
        if chosen.auto_commit:
            # Its timers are this Memory's, recorded in the store: no other Memory flushes or
            # expires it, and another takes them over when this one goes.
            await live.register()
            holder, until = live.holder_id, live.lease_until()
        await live.store.create_session(session_id, repo, chosen, episode, holder=holder,
                                        lease_until=until, metadata=scoped)
        session = live.add(session_id, repo, State.COLLECTING, chosen, override)
        session.metadata = dict(scoped or {})
        session.episode = episode
        session.driven = holder is not None
        live.touch(session)
        await live.events.emit("transition", session_id=session_id, repo=repo,
                               **{"from": None, "to": State.COLLECTING})
        return session_id

    async def append(
        self,
        session_id: str,
        observation: str,
        action: str,
        *,
        metadata: dict[str, object] | None = None,
    ) -> StepInfo:
        """Stores one step (durable before the model is asked), then waits for its annotation
        at most `Config.append_timeout`: `StepInfo.annotated` is False if the model has not
        answered by then (the step is annotated later, by close at the latest).

        Raises:
            InvalidInputError: observation or action is not a string or is longer than the
                session's `Config.max_text_chars` (metadata: its JSON); no step was added.
            SessionError: the session is not collecting.
            LLMError, EmbeddingError: the model or the embedder failed within that time (the
                adapter's exception as `__cause__`), or cannot work here at all; no step was
                added.
            StorageError: the step could not be stored.
        """
        self._works("append")
        from mnemo.session.registry import append

        await (await self._live.fetch(session_id)).after_accepted()
        return await append(self._live, session_id, observation, action, metadata)

    async def close(self, session_id: str) -> None:
        """Ends the episode and starts extraction in the background (state `extracting`)."""
        await self._move(session_id, "close")

    async def commit(self, session_id: str) -> CommitReceipt | None:
        """`ready`: applies the changeset durably and returns its receipt (state `idle`).
        `failed`: retries the extraction (state `extracting`) and returns None."""
        return await self._move(session_id, "commit")

    async def discard(self, session_id: str) -> None:
        """Drops a ready changeset or a failed extraction (state `idle`)."""
        await self._move(session_id, "discard")

    async def start_episode(self, session_id: str, goal: str) -> None:
        """Starts a new episode in an idle session (state `collecting`)."""
        self._works("start_episode")
        from mnemo.session import registry, transitions

        session = await self._live.fetch(session_id)
        check_text(goal, "goal", limit=session.config.max_text_chars)
        await session.after_accepted()
        await registry.refuse_checked(self._live, session, "start_episode")
        await transitions.start_episode(self._live, session, goal)

    async def _move(self, session_id: str, kind: str) -> CommitReceipt | None:
        """`close`, `commit` or `discard` (`_works`) on the session as the store holds it now."""
        self._works(kind)
        from mnemo.session import transitions

        await (await self._live.fetch(session_id)).after_accepted()
        return await transitions.call(self._live, await self._live.fetch(session_id, fresh=True),
                                      kind)

    async def close_and_commit(
        self,
        session_id: str,
        *,
        max_retries: int = 2,
        max_polls: int | None = None,
        poll_interval: float = 0.05,
    ) -> CommitReceipt:
        """Closes, waits for extraction, and commits; retries a failed extraction up to
        `max_retries` times. Each wait lasts as long as the session's `extraction_timeout`
        allows (twice in auto-commit), or `max_polls * poll_interval` seconds when `max_polls`
        is given. In auto-commit the receipt holds what the close committed.

        Raises:
            InvalidInputError: `max_retries` not an integer in 0..`MAX_RETRIES`, `max_polls`
                not None or an integer >= 1, `poll_interval` not in (0, a day] s, a wait > a day.
            PipelineError: "extraction_failed" or "extraction_timeout".
        """
        self._works("close_and_commit")
        check_count("max_retries", max_retries, maximum=MAX_RETRIES)
        check_seconds("poll_interval", poll_interval, DURATION_CEILINGS["wait"])
        if max_polls is not None:  # a wait, at most a day as poll_interval is
            check_count("max_polls", max_polls, minimum=1,
                        maximum=min(DAY / poll_interval, sys.maxsize))
        from mnemo.extraction.pipeline import failure_reason
        from mnemo.session import transitions
        from mnemo.session.machine import State as S

        try:
            live = self._live
            await (await live.fetch(session_id)).after_accepted()
            session = await live.fetch(session_id, fresh=True)
            # Extractions this call started (or found running), besides its retries.
            runs = 1 if session.state in (S.COLLECTING, S.IDLE, S.EXTRACTING) else 0
            if session.state in (S.COLLECTING, S.IDLE):
                await transitions.call(live, session, "close")
            retries = 0
            if max_polls is None:
                # A grace past the time limit lets the extraction's own timeout report first; an
                # auto-commit close may wait for another Memory's commit, then extract: twice.
                phases = 2 if session.config.auto_commit else 1
                wait = session.runtime.config.extraction_timeout * 1.1 * phases + 1.0
            else:
                wait = max_polls * poll_interval
            while True:
                with anyio.move_on_after(wait) as scope:
                    while session.state is S.EXTRACTING and not session.ended:
                        await transitions.wait_moved(live, session)
                if scope.cancelled_caught:
                    last = self._repos.limits.usage.last_answer(session_id)
                    if (max_polls is None and last is not None
                            and anyio.current_time() - last < wait):
                        continue  # still being answered: its calls queued, they did not hang
                    raise PipelineError("extraction_timeout", f"{session_id} still extracting")
                if session.ended:
                    raise NotFoundError("session", session_id)
                if session.state is S.READY:
                    receipt = await self._move(session_id, "commit")
                    assert receipt is not None
                    return receipt
                if session.state is S.IDLE and session.config.auto_commit and session.last_receipt:
                    return session.last_receipt
                if session.state is S.FAILED and retries < max_retries:
                    retries += 1
                    await self._move(session_id, "commit")
                    continue
                if session.state is S.FAILED:
                    runs += retries
                    times = ("before this call" if runs == 0 else "once in this call"
                             if runs == 1 else f"{runs} times in this call")
                    raise PipelineError(
                        failure_reason(session.failure or Exception()),
                        f"{session_id}: the extraction failed {times}, last: {session.failure}",
                    ) from session.failure
                raise SessionError("not_ready", state=session.state, session_id=session_id)
        finally:
            await self._save_profiles()

    async def commit_async(self, session_id: str, callback: Callback | None = None) -> None:
        await self._submit(session_id, "commit", (), callback)

    async def discard_async(self, session_id: str, callback: Callback | None = None) -> None:
        await self._submit(session_id, "discard", (), callback)

    async def close_async(self, session_id: str, callback: Callback | None = None) -> None:
        await self._submit(session_id, "close", (), callback)

    async def start_episode_async(
        self, session_id: str, goal: str, callback: Callback | None = None
    ) -> None:
        if not isinstance(goal, str) or not goal.strip():
            raise InvalidInputError(f"goal must be a non-blank string, got {goal!r}")
        await self._submit(session_id, "start_episode", (goal,), callback)

    async def append_async(
        self, session_id: str, observation: str, action: str, callback: Callback | None = None
    ) -> None:
        for what, value in (("observation", observation), ("action", action)):
            if not isinstance(value, str):
                raise InvalidInputError(f"{what} must be a string, got {type(value).__name__}")
        await self._submit(session_id, "append", (observation, action), callback)

    async def _submit(self, session_id: str, kind: str, args: tuple[Any, ...],
                      callback: Callback | None) -> None:
        from mnemo.session import operations

        self._works(f"{kind}_async")
        await operations.submit(self._live, session_id, kind, args, callback)

    async def session_state(self, session_id: str) -> State:
        """The session's state as the store holds it now. Reads only."""
        return (await self._live.fetch(session_id, fresh=True)).state

    async def session_context(self, session_id: str) -> SessionContext | None:
        """The goal and last 5 steps ("obs -> act") of a live episode; None when idle."""
        return await self._session_context(session_id, 5)

    async def _session_context(self, session_id: str, steps: int) -> SessionContext | None:
        from mnemo.session.machine import SessionContext, State

        session = await self._live.fetch(session_id, fresh=True)
        episode = session.episode
        if session.state is State.IDLE or episode is None:
            return None
        return SessionContext(episode.goal, [s.line for s in episode.steps[-steps:]])

    async def end_session(self, session_id: str) -> None:
        """Stops the session: its background work is cancelled, queued operations get
        "session_ended", and its id becomes unknown. Uncommitted steps stay in the log."""
        self._works("end_session")
        await self._end(await self._live.fetch(session_id))

    async def _end(self, session: SessionRecord) -> None:
        """Ends the session in the store, then here (a store's refusal changes nothing)."""
        await self._live.store.end(session.id)
        await self._live.forget(session)

    async def episodes(self, session_id: str) -> list[EpisodeLog]:
        """Every episode the session stored (ended sessions too), oldest first, with steps
        and trajectories; [] for an unknown id. Reads only."""
        return await self._sessions_store.episodes(check_id(session_id, "session_id"))

    async def episode(self, episode_id: str) -> EpisodeLog | None:
        """The stored episode (with its session id and steps) that an EPISODIC node's
        `data["episode_id"]` names; None for one no session stored (an ingest's)."""
        return await self._sessions_store.episode(check_id(episode_id, "episode_id"))

    async def list_sessions(self) -> list[SessionInfo]:
        """Every live session (restored ones included), oldest first: id, repo, state, the
        open (or last) episode's goal and step count (0 when idle), and an extraction's holder.
        Reads only: it never resumes or ends a session."""
        from mnemo.session.machine import SessionInfo, State

        return [
            SessionInfo(
                s.id, s.repo, s.state, s.goal,
                len(s.episode.steps) if s.episode is not None and s.state is not State.IDLE
                else 0,
                s.holder if s.state is State.EXTRACTING else None,
                s.lease_until if s.state is State.EXTRACTING else None,
            )
            for s in await self._live.store.load_live()]
