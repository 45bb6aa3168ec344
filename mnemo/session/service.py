"""`SessionService`: every live session, its state machine, its queue and its background work.

Each session is a `_Session` record driven by the shared machine (`machine.py`). A state
change happens in `_move`: under the session's lock it re-checks the table, persists, fires the
trigger, then reports a "transition" event. Effects (LLM calls, extraction, commits) run
outside the machine, in tasks of the service's task group, and report back through `_move`.

Busy, for the async queue, means: extracting, an auto-commit extraction in flight, or an
accepted operation still running (API.md, "The async operation queue").
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from mnemo.config import Config
from mnemo.episode.annotation import annotate, embed, starts_trajectory
from mnemo.episode.model import EpisodeRecord, StepInfo, StepRecord
from mnemo.errors import (
    EmbeddingError,
    InvalidInputError,
    LLMError,
    LLMTimeout,
    MnemoError,
    NotFoundError,
    PipelineError,
    SessionError,
    StorageError,
)
from mnemo.events import Events
from mnemo.extraction.memo import TaskMemo
from mnemo.extraction.pipeline import Source, extract, failure_reason
from mnemo.extraction.prompts import merge_intent_request, parse_merged_intent
from mnemo.graph.model import Changeset, CommitReceipt, Vector
from mnemo.graph.ports import GraphStore, IntentPolicy, StepsCommitted
from mnemo.inputs import check_json, check_text
from mnemo.ports import LLM, Embedder, ask, model_name
from mnemo.session.machine import Machines, Move, Refuse, SessionModel, Stale, State, answer
from mnemo.session.ports import LiveSession, SessionStore
from mnemo.session.queue import (
    VALUES,
    Callback,
    Op,
    OpResult,
    Turnstile,
    deliver,
    project,
)

log = logging.getLogger("mnemo")

S = State


@dataclass(frozen=True, slots=True)
class SessionContext:
    """A live session's goal and its last steps, each "obs -> act"."""

    goal: str
    recent_steps: list[str]


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A live session as `Memory.list_sessions` reports it: `goal` is the open episode's (None
    when idle) and `steps` counts that episode's steps."""

    id: str
    repo: str
    state: State
    goal: str | None
    steps: int


@dataclass(slots=True)
class Runtime:
    """The llm, embedder and config a repo (or one session) works with, and the dimension of
    the repo's vectors (0 while the repo has none recorded)."""

    llm: LLM
    embedder: Embedder
    config: Config
    dim: int = 0

    def check_dim(self, repo: str) -> None:
        """Raises EmbeddingError when the embedder's vectors would not fit the repo's."""
        if self.dim and self.embedder.dim != self.dim:
            raise EmbeddingError(
                f"repo {repo!r} holds vectors of dimension {self.dim}, but the embedder "
                f"{getattr(self.embedder, 'name', type(self.embedder).__name__)} makes "
                f"dimension {self.embedder.dim}; open the repo with an embedder of its "
                "dimension"
            )


@dataclass(eq=False, slots=True)
class _Session:
    id: str
    repo: str
    model: SessionModel
    repo_runtime: Runtime
    override: Runtime | None
    config: Config
    episode: EpisodeRecord | None = None
    changeset: Changeset | None = None
    last_receipt: CommitReceipt | None = None
    failure: BaseException | None = None
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    turnstile: Turnstile = field(default_factory=Turnstile)
    appends_in_flight: int = 0
    pending: deque[Op] = field(default_factory=deque)
    running: Op | None = None
    background: int = 0
    claimed: set[str] = field(default_factory=set)
    changed: anyio.Event = field(default_factory=anyio.Event)
    scopes: set[anyio.CancelScope] = field(default_factory=set)
    needs_extraction: bool = False
    # The model the session's extraction started with (`ports.model_name`); None: unknown.
    extraction_model: str | None = None
    last_activity: float = 0.0
    flush_after: float = 0.0
    ended: bool = False
    # The open episode's validated extraction results, so a retry re-asks only what failed
    # (issue 13, item 5), stored with the episode too.
    memo: TaskMemo | None = None

    @property
    def state(self) -> State:
        return self.model.state

    @property
    def runtime(self) -> Runtime:
        """The session's llm and embedder: its own overrides, else its repo's (read late, so a
        restored session picks up what `open_repo` gives its repo)."""
        base = self.repo_runtime
        if self.override is None:
            return Runtime(base.llm, base.embedder, self.config, base.dim)
        return Runtime(self.override.llm, self.override.embedder, self.config, base.dim)

    @property
    def busy(self) -> bool:
        return (
            self.state is S.EXTRACTING
            or self.background > 0
            or self.running is not None
            or bool(self.pending)
        )

    def notify(self) -> None:
        """Wakes whoever waits for this session to change."""
        self.changed.set()
        self.changed = anyio.Event()


def _check_step(
    config: Config, observation: object, action: object, metadata: dict[str, Any] | None
) -> None:
    """Raises InvalidInputError for a step past `config.max_text_chars` (metadata: as JSON)."""
    check_text(observation, "observation", limit=config.max_text_chars, blank_ok=True)
    check_text(action, "action", limit=config.max_text_chars, blank_ok=True)
    if metadata is not None:
        check_json(metadata, "metadata", limit=config.max_text_chars)


class SessionService:
    """All sessions of one `Memory`."""

    def __init__(
        self,
        *,
        store: SessionStore,
        graph: GraphStore,
        events: Events,
        repo_runtime: Callable[[str], Runtime],
        llm_for: Callable[[Runtime, str, str | None], LLM],
    ) -> None:
        self._store = store
        self._graph = graph
        self._events = events
        self._repo_runtime = repo_runtime
        self._llm_for = llm_for
        self._machines = Machines()
        self._sessions: dict[str, _Session] = {}
        self._tg: TaskGroup | None = None
        self._timer_wake = anyio.Event()
        self._timed: set[str] = set()  # ids of auto-commit sessions, the only ones with timers

    # ---- life of the service -------------------------------------------------------------

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Owns every background task; returns when cancelled."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._timers)
                task_status.started()
                await anyio.sleep_forever()
        finally:
            # Every accepted operation gets its callback, even when the Memory closes first.
            with anyio.CancelScope(shield=True):
                for session in list(self._sessions.values()):
                    await self._fail_pending(session, "memory_closed")

    def restore(self, live: list[LiveSession]) -> None:
        """Brings back sessions that had not ended. One that was extracting extracts again now
        if its repo's model here is the one the extraction started with, else when `open_repo`
        gives the repo that model (API.md: work is resumed only by a matching model)."""
        for row in live:
            session = self._add(row.id, row.repo, row.state, row.config, None)
            session.episode = row.episode
            session.changeset = row.changeset
            session.needs_extraction = row.state is S.EXTRACTING
            session.extraction_model = row.model
            self._touch(session)
            self._resume(session)

    def resume_repo(self, repo: str) -> None:
        """Restarts the extractions of restored sessions of `repo` that its model may finish."""
        for session in list(self._sessions.values()):
            if session.repo == repo:
                self._resume(session)

    def _touch(self, session: _Session) -> None:
        """Records activity; an auto-commit session may now have an earlier deadline (a first
        uncommitted step starts its flush clock), so the timers look again. Other sessions have
        no timers: waking for them cost every append a scan of every session."""
        session.last_activity = anyio.current_time()
        if session.config.auto_commit:
            self._timed.add(session.id)
            self._timer_wake.set()

    def _add(
        self, session_id: str, repo: str, state: State, config: Config, override: Runtime | None
    ) -> _Session:
        model = SessionModel(session_id)
        self._machines.add(model, state)
        session = _Session(session_id, repo, model, self._repo_runtime(repo), override, config)
        self._sessions[session_id] = session
        return session

    def _get(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise NotFoundError("session", str(session_id))
        return session

    def _resume(self, session: _Session) -> None:
        """Restarts a restored extraction, if this Memory's model for it is the one it started
        with (issue 9: a read through an offline `mnemo mcp` once finished a real model's
        extraction with heuristics). Reads never call this."""
        if not session.needs_extraction or self._tg is None:
            return
        recorded = session.extraction_model
        here = model_name(session.runtime.llm)
        if recorded is not None and recorded != here:
            log.info("%s: extraction started with %s, not %s: left to a Memory with that model",
                     session.id, recorded, here)
            return
        session.needs_extraction = False
        self._spawn(session, self._extract_episode, session)

    async def _start_extracting(self, session: _Session, event: str, op: Op | None) -> None:
        """Moves the session to `extracting` (recording the model that will extract) and
        starts the extraction."""
        model = model_name(session.runtime.llm)

        async def persist() -> None:
            await self._store.set_state(session.id, S.EXTRACTING, model=model)
            session.extraction_model = model

        await self._move(session, event, persist, op=op)
        self._spawn(session, self._extract_episode, session)

    def _spawn(self, session: _Session, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Starts `fn(*args)` in the service's group, cancellable by `end_session`."""
        assert self._tg is not None, "the Memory is not open"

        async def owned() -> None:
            with anyio.CancelScope() as scope:
                session.scopes.add(scope)
                try:
                    await fn(*args)
                except Exception:
                    # A bug in one session's work must not take every session down with the
                    # task group: it is logged, and the session stays in its persisted state.
                    log.exception("%s: background work crashed", session.id)
                finally:
                    session.scopes.discard(scope)

        self._tg.start_soon(owned)

    # ---- sessions --------------------------------------------------------------------------

    async def start_session(
        self, goal: str, *, repo: str, override: Runtime | None, config: Config
    ) -> str:
        check_text(goal, "goal", limit=config.max_text_chars)
        session_id = f"session_{uuid.uuid4().hex}"
        episode = EpisodeRecord(f"episode_{uuid.uuid4().hex}", goal)
        await self._store.create_session(session_id, repo, config, episode)
        session = self._add(session_id, repo, S.COLLECTING, config, override)
        session.episode = episode
        self._touch(session)
        await self._events.emit(
            "transition", session_id=session_id, repo=repo, **{"from": None, "to": S.COLLECTING}
        )
        return session_id

    def state_of(self, session_id: str) -> State:
        return self._get(session_id).state

    def context(self, session_id: str, steps: int = 5) -> SessionContext | None:
        session = self._get(session_id)
        if session.state is S.IDLE or session.episode is None:
            return None
        recent = [step.line for step in session.episode.steps[-steps:]] if steps else []
        return SessionContext(session.episode.goal, recent)

    def list_sessions(self) -> list[SessionInfo]:
        """Every live session, oldest first. Reads only: unlike `_get`, it never resumes a
        restored session's extraction, so looking does not start work."""
        return [
            SessionInfo(
                s.id,
                s.repo,
                s.state,
                s.episode.goal if s.episode is not None and s.state is not S.IDLE else None,
                len(s.episode.steps) if s.episode is not None and s.state is not S.IDLE else 0,
            )
            for s in self._sessions.values()
        ]

    async def end_session(self, session_id: str) -> None:
        """Stops the session: its background work is cancelled, queued operations get
        "session_ended", and its id becomes unknown. Uncommitted steps stay in the log."""
        session = self._get(session_id)
        # Stored first: if the store refuses, nothing has changed and the session goes on.
        await self._store.end(session_id)
        if session.ended:  # ended by another call while this one waited for the store
            return
        session.ended = True
        del self._sessions[session_id]
        self._machines.remove(session.model)
        for scope in list(session.scopes):
            scope.cancel()
        await self._fail_pending(session, "session_ended")
        session.notify()

    # ---- the sync calls ----------------------------------------------------------------------

    async def start_episode(self, session_id: str, goal: str) -> None:
        session = self._get(session_id)
        check_text(goal, "goal", limit=session.config.max_text_chars)
        self._refuse_unless(session, "start_episode")
        await self._do_start_episode(session, goal)

    async def append(
        self, session_id: str, observation: str, action: str, metadata: dict[str, Any] | None
    ) -> StepInfo:
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidInputError(f"metadata must be a dict, got {type(metadata).__name__}")
        session = self._get(session_id)
        _check_step(session.config, observation, action, metadata)
        self._refuse_unless(session, "append")
        session.appends_in_flight += 1
        ticket = session.turnstile.take()
        try:
            return await self._do_append(session, ticket, observation, action, metadata)
        finally:
            session.appends_in_flight -= 1

    async def close(self, session_id: str) -> None:
        session = self._get(session_id)
        self._refuse_close(session)
        await self._do_close(session)

    async def commit(self, session_id: str) -> CommitReceipt | None:
        session = self._get(session_id)
        self._refuse_unless(session, "commit")
        return await self._do_commit(session)

    async def discard(self, session_id: str) -> None:
        session = self._get(session_id)
        self._refuse_unless(session, "discard")
        await self._do_discard(session)

    async def close_and_commit(
        self, session_id: str, *, max_retries: int, max_polls: int | None, poll_interval: float
    ) -> CommitReceipt:
        """Closes, waits for the extraction and commits; retries a failed extraction.

        Each wait lasts as long as the session's `extraction_timeout` allows (plus a grace, so
        that the extraction's own timeout reports first), or `max_polls * poll_interval`
        seconds when `max_polls` is given (it is woken by the state change, it does not poll).

        Raises:
            PipelineError: "extraction_failed" after `max_retries` failed retries, or
                "extraction_timeout" when an extraction outlasts the wait.
        """
        session = self._get(session_id)
        if session.state in (S.COLLECTING, S.IDLE):
            self._refuse_close(session)
            await self._do_close(session)
        retries = 0
        if max_polls is None:
            wait = session.config.extraction_timeout * 1.1 + 1.0
        else:
            wait = max(max_polls, 1) * max(poll_interval, 0.0)
        while True:
            with anyio.move_on_after(wait if wait > 0 else math.inf) as scope:
                while session.state is S.EXTRACTING and not session.ended:
                    await session.changed.wait()
            if scope.cancelled_caught:
                raise PipelineError("extraction_timeout", f"{session_id} still extracting")
            if session.ended:
                raise NotFoundError("session", session_id)
            state = session.state
            if state is S.READY:
                receipt = await self.commit(session_id)
                assert receipt is not None
                return receipt
            if state is S.IDLE and session.config.auto_commit and session.last_receipt:
                return session.last_receipt
            if state is S.FAILED and retries < max_retries:
                retries += 1
                await self.commit(session_id)
                continue
            if state is S.FAILED:
                raise PipelineError(
                    failure_reason(session.failure or Exception()),
                    f"{session_id} failed {retries + 1} times: {session.failure!r}",
                ) from session.failure
            raise SessionError("not_ready", state=state, session_id=session_id)

    # ---- the async calls ------------------------------------------------------------------

    def submit(self, session_id: str, kind: str, args: tuple[Any, ...],
               callback: Callback | None) -> None:
        """Accepts an async operation: runs it now when the session is free, else queues it.

        Raises:
            SessionError: "session_failed", "pending_queue_full", "invalid_operation" or
                "invalid_queued_operation" (API.md's queue rules).
        """
        session = self._get(session_id)
        if kind == "append":
            _check_step(session.config, args[0], args[1], None)
        elif kind == "start_episode":
            check_text(args[0], "goal", limit=session.config.max_text_chars)
        if session.state is S.FAILED:
            raise SessionError("session_failed", state=session.state, session_id=session_id)
        op = Op(kind, args, callback)
        if session.busy:
            if len(session.pending) >= session.config.max_pending_ops:
                raise SessionError(
                    "pending_queue_full", state=session.state, session_id=session_id
                )
            if self._projection(session, op) is None:
                raise SessionError(
                    "invalid_queued_operation", state=session.state, session_id=session_id
                )
            self._accept(session, op)
            session.pending.append(op)
            return
        verdict = answer(session.state, kind)
        if not isinstance(verdict, Move) or (kind == "close" and session.appends_in_flight):
            raise SessionError("invalid_operation", state=session.state, session_id=session_id)
        self._accept(session, op)
        session.running = op
        self._spawn(session, self._run_op, session, op)

    def _accept(self, session: _Session, op: Op) -> None:
        if op.kind == "append":
            session.appends_in_flight += 1
            op.ticket = session.turnstile.take()

    def _projection(self, session: _Session, op: Op) -> State | None:
        auto = session.config.auto_commit
        if session.state is S.EXTRACTING:
            start = S.IDLE if auto else S.READY
            ops: list[Op] = []
        else:
            start = session.state
            ops = [session.running] if session.running and not session.running.applied else []
        return project(start, [*ops, *session.pending, op], auto_commit=auto)

    async def _run_op(self, session: _Session, op: Op) -> None:
        """Runs an accepted operation and reports it: exactly one callback, whatever happens
        (issue 9: an error that was not a `MnemoError` used to leave `running` set, so the
        session's queue never moved again and no callback came)."""
        try:
            await self._execute(session, op)
        except Exception as exc:
            await self._finish_op(session, op, OpResult(False, None, _as_session_error(
                exc, session)))
            await self._fail_pending(session, "preceding_op_failed")
        except BaseException:
            # Cancelled: by `end_session` or by the Memory closing. The callback still comes.
            with anyio.CancelScope(shield=True):
                reason = "session_ended" if session.ended else "memory_closed"
                await self._finish_op(session, op, OpResult(False, None, SessionError(
                    reason, state=session.state, session_id=session.id)))
            raise
        else:
            await self._finish_op(session, op, OpResult(True, VALUES[op.kind]))
        finally:
            if op.kind == "append":
                session.appends_in_flight -= 1
            if session.running is op:
                session.running = None
        self._kick(session)

    async def _finish_op(self, session: _Session, op: Op, result: OpResult) -> None:
        op.done = True
        if session.running is op:
            session.running = None
        await deliver(op.callback, result)

    async def _execute(self, session: _Session, op: Op) -> None:
        if op.kind == "append":
            assert op.ticket is not None
            observation, action = op.args
            await self._do_append(session, op.ticket, observation, action, None)
        elif op.kind == "close":
            self._refuse_close(session)
            await self._do_close(session, op)
        else:
            self._refuse_unless(session, op.kind)
            if op.kind == "commit":
                await self._do_commit(session, op)
            elif op.kind == "discard":
                await self._do_discard(session, op)
            else:
                await self._do_start_episode(session, op.args[0], op=op)

    def _kick(self, session: _Session) -> None:
        """Starts the next queued operation if nothing holds the session."""
        if session.ended or session.running is not None or not session.pending:
            return
        if session.state is S.EXTRACTING or session.background:
            return
        op = session.pending.popleft()
        session.running = op
        self._spawn(session, self._run_op, session, op)

    async def _fail_pending(self, session: _Session, reason: str) -> None:
        while session.pending:
            op = session.pending.popleft()
            if op.kind == "append":
                session.appends_in_flight -= 1
                if op.ticket is not None:
                    session.turnstile.leave(op.ticket)
            error = SessionError(reason, state=session.state, session_id=session.id)
            await deliver(op.callback, OpResult(False, None, error))

    # ---- what each call does ------------------------------------------------------------

    def _refuse_unless(self, session: _Session, event: str) -> None:
        if session.ended:  # ended while this call waited for its turn
            raise NotFoundError("session", session.id)
        verdict = answer(session.state, event)
        if isinstance(verdict, Refuse):
            raise SessionError(verdict.reason, state=session.state, session_id=session.id)

    def _refuse_close(self, session: _Session) -> None:
        self._refuse_unless(session, "close")
        if session.appends_in_flight:
            raise SessionError("append_in_progress", state=session.state, session_id=session.id)

    async def _move(
        self,
        session: _Session,
        event: str,
        persist: Callable[[], Awaitable[object]] | None = None,
        *,
        op: Op | None = None,
        data: Callable[[], dict[str, Any]] | None = None,
    ) -> bool:
        """Persists and fires `event` if the table still allows it; False for a stale result.

        Raises:
            SessionError: the table refuses `event` in the current state.
        """
        async with session.lock:
            if session.ended:
                return False
            before = session.state
            verdict = answer(before, event)
            if isinstance(verdict, Refuse):
                raise SessionError(verdict.reason, state=before, session_id=session.id)
            if isinstance(verdict, Stale):
                log.info("%s: stale %s in state %s dropped", session.id, event, before)
                return False
            if persist is not None:
                await persist()
            after = Machines.fire(session.model, event)
            if op is not None:
                op.applied = True
        session.notify()
        if before is not after:
            await self._events.emit(
                "transition", session_id=session.id, repo=session.repo,
                **{"from": before, "to": after}, **(data() if data else {}),
            )
        return True

    async def _do_start_episode(self, session: _Session, goal: str, op: Op | None = None) -> None:
        episode = EpisodeRecord(f"episode_{uuid.uuid4().hex}", goal)

        async def persist() -> None:
            await self._store.start_episode(session.id, episode)
            session.episode = episode
            session.last_receipt = None

        await self._move(session, "start_episode", persist, op=op)
        self._touch(session)

    async def _do_append(
        self,
        session: _Session,
        ticket: int,
        observation: str,
        action: str,
        metadata: dict[str, Any] | None,
    ) -> StepInfo:
        await session.turnstile.wait(ticket)
        try:
            return await self._annotate_and_store(session, observation, action, metadata)
        finally:
            session.turnstile.leave(ticket)

    async def _annotate_and_store(
        self, session: _Session, observation: str, action: str, metadata: dict[str, Any] | None
    ) -> StepInfo:
        self._refuse_unless(session, "append")
        episode = session.episode
        assert episode is not None, "a collecting session has an episode"
        runtime = session.runtime
        runtime.check_dim(session.repo)
        previous = episode.steps[-1] if episode.steps else None
        timeout = runtime.config.append_timeout
        try:
            with anyio.fail_after(timeout):
                note = await annotate(
                    self._llm_for(runtime, session.repo, session.id),
                    runtime.embedder,
                    goal=episode.goal,
                    observation=observation,
                    action=action,
                    previous=previous,
                    recent=[step.line for step in episode.steps[-3:]],
                )
        except TimeoutError as exc:
            if isinstance(exc, MnemoError):
                raise
            raise LLMTimeout(f"{session.id}: append timed out after {timeout}s") from exc
        boundary = starts_trajectory(
            previous, note.subgoal_vec, runtime.config.trajectory_threshold
        )
        trajectory = (
            f"trajectory_{uuid.uuid4().hex}"
            if previous is None or boundary
            else previous.trajectory_id
        )
        step = StepRecord(
            id=f"{episode.id}:{len(episode.steps)}",
            index=len(episode.steps),
            trajectory_id=trajectory,
            observation=observation,
            action=action,
            state_summary=note.state_summary,
            subgoal=note.subgoal,
            subgoal_vec=note.subgoal_vec,
            metadata=metadata,
        )
        if previous is not None:
            previous_reward = previous.reward
            previous.reward = note.previous_reward
        async with session.lock:
            self._refuse_unless(session, "append")
            try:
                await self._store.add_step(session.id, episode.id, step, previous)
            except BaseException:
                if previous is not None:
                    previous.reward = previous_reward
                raise
            episode.steps.append(step)
        self._touch(session)
        info = StepInfo(step.index, trajectory, boundary)
        await self._events.emit(
            "step_appended", session_id=session.id, repo=session.repo, index=step.index,
            trajectory_id=trajectory, boundary_detected=boundary,
        )
        if boundary and session.config.auto_commit:
            ready = [s for s in episode.steps[:-1] if self._extractable(session, s)]
            if ready:
                self._start_background(session, ready)
        return info

    async def _do_close(self, session: _Session, op: Op | None = None) -> None:
        await self._start_extracting(session, "close", op)

    async def _do_commit(self, session: _Session, op: Op | None = None) -> CommitReceipt | None:
        if session.state is S.FAILED:
            session.failure = None
            await self._start_extracting(session, "commit", op)
            return None
        changeset = session.changeset
        episode = session.episode
        assert changeset is not None, "a ready session holds its changeset"
        wanted = set(changeset.step_ids)
        steps = [s for s in episode.steps if s.id in wanted] if episode else []
        async with session.lock:
            self._refuse_unless(session, "commit")
            receipt = await self._commit_steps(session, changeset, steps, S.IDLE)
            Machines.fire(session.model, "commit")
            if op is not None:
                op.applied = True
            session.changeset = None
            session.episode = None
            session.last_receipt = receipt
        session.notify()
        await self._events.emit(
            "changeset_applied", session_id=session.id, repo=session.repo,
            node_ids=receipt.node_ids, changeset_id=receipt.changeset_id,
        )
        await self._events.emit(
            "transition", session_id=session.id, repo=session.repo,
            **{"from": S.READY, "to": S.IDLE, "node_ids": receipt.node_ids},
        )
        return receipt

    async def _do_discard(self, session: _Session, op: Op | None = None) -> None:
        episode_id = session.episode.id if session.episode else None

        async def persist() -> None:
            await self._store.discard(session.id, episode_id)
            session.changeset = None
            session.episode = None
            session.failure = None

        await self._move(session, "discard", persist, op=op)

    # ---- extraction ---------------------------------------------------------------------

    def _extractable(self, session: _Session, step: StepRecord) -> bool:
        return step.committed_in is None and step.id not in session.claimed

    def _source(self, session: _Session, episode: EpisodeRecord) -> Source:
        return Source(
            node_id=f"source_{episode.id}",
            text=episode.goal,
            data={"session_id": session.id, "episode_id": episode.id, "goal": episode.goal},
        )

    async def _extract_steps(
        self, session: _Session, episode: EpisodeRecord, steps: list[StepRecord]
    ) -> Changeset:
        runtime = session.runtime
        runtime.check_dim(session.repo)
        if session.memo is None or session.memo.episode_id != episode.id:
            # What an earlier extraction of this episode kept (here, or in a Memory before a
            # restart) is asked no more.
            session.memo = TaskMemo(episode.id, await self._store.kept_results(episode.id))
        return await extract(
            episode,
            steps,
            repo=session.repo,
            source=self._source(session, episode),
            llm=self._llm_for(runtime, session.repo, session.id),
            embedder=runtime.embedder,
            time_limit=runtime.config.extraction_timeout,
            score_last_step=bool(steps) and steps[-1].reward is None,
            memo=session.memo,
        )

    async def _extract_episode(self, session: _Session) -> None:
        """The close's extraction: ready (or, in auto-commit, committed and idle) or failed.

        Whatever fails on the way, storing the result included, ends in `failed`: the session
        never stays extracting with nobody working on it."""
        episode = session.episode
        try:
            while session.background:
                await session.changed.wait()
            steps = [s for s in episode.steps if self._extractable(session, s)] if episode else []
            if episode is None:
                changeset = Changeset(f"changeset_{uuid.uuid4().hex}", session.repo)
            else:
                changeset = await self._extract_steps(session, episode, steps)
            if session.config.auto_commit:
                await self._auto_commit_close(session, changeset, steps)
                return

            async def persist() -> None:
                await self._store.save_extraction(session.id, changeset, steps[-1:])
                session.changeset = changeset

            if await self._move(session, "extraction_succeeded", persist):
                self._kick(session)
        except Exception as exc:
            log.warning("%s: extraction failed: %r", session.id, exc)
            session.failure = exc
            await self._store_kept(session)
            await self._extraction_failed(session)

    async def _store_kept(self, session: _Session) -> None:
        """Stores what a failed extraction kept, so that a retry after a restart (or by the
        Memory taking the work over) asks only what failed. Best effort: if the store refuses,
        the results stay kept here."""
        memo = session.memo
        if memo is None:
            return
        for kept in memo.unsaved():
            try:
                await self._store.keep_result(memo.episode_id, kept)
            except StorageError as exc:
                log.warning("%s: could not store a kept %s result: %r", session.id, kept.task, exc)
                return

    async def _extraction_failed(self, session: _Session) -> None:
        """Moves an extracting session to `failed` and fails what was queued behind it."""
        try:
            moved = await self._move(
                session, "extraction_failed", lambda: self._store.set_state(session.id, S.FAILED)
            )
        except StorageError as exc:
            # The store refuses even the failure: the session fails here all the same, so no
            # caller waits on it; the store still says extracting, so a reopened store (or a
            # `commit` here, which retries) extracts again.
            log.warning("%s: could not store the failed state: %r", session.id, exc)
            moved = await self._move(session, "extraction_failed")
        if moved:
            await self._fail_pending(session, "extraction_failed")

    async def _auto_commit_close(
        self, session: _Session, changeset: Changeset, steps: list[StepRecord]
    ) -> None:
        receipts: list[CommitReceipt] = []

        async def persist() -> None:
            receipts.append(await self._commit_steps(session, changeset, steps, S.IDLE))
            session.last_receipt = receipts[0]
            session.episode = None

        moved = await self._move(
            session, "auto_committed", persist, data=lambda: {"node_ids": receipts[0].node_ids}
        )
        if moved:
            await self._events.emit(
                "changeset_applied", session_id=session.id, repo=session.repo,
                node_ids=receipts[0].node_ids, changeset_id=changeset.id,
            )
            self._kick(session)

    async def _commit_steps(
        self,
        session: _Session,
        changeset: Changeset,
        steps: list[StepRecord],
        state: State | None,
    ) -> CommitReceipt:
        """Applies `changeset` with the session's side (steps committed, and `state` unless
        None) in the same transaction, then marks the steps committed in memory."""
        episode_id = session.episode.id if session.episode else None
        side = StepsCommitted(
            session.id,
            episode_id,
            changeset.id,
            tuple((s.id, s.reward) for s in steps),
            None if state is None else state.value,
        )
        receipt = await self._graph.apply(
            changeset, intents=self._intent_policy(session), also=[side]
        )
        for step in steps:
            step.committed_in = changeset.id
        return receipt

    def _start_background(self, session: _Session, steps: list[StepRecord]) -> None:
        session.claimed.update(s.id for s in steps)
        session.background += 1
        self._spawn(session, self._background_commit, session, steps)

    async def _background_commit(self, session: _Session, steps: list[StepRecord]) -> None:
        """Auto-commit of finished steps while the session keeps collecting."""
        episode = session.episode
        try:
            assert episode is not None
            changeset = await self._extract_steps(session, episode, steps)
            receipt = await self._commit_steps(session, changeset, steps, None)
        except Exception as exc:
            log.warning("%s: auto-commit of %d steps failed: %r", session.id, len(steps), exc)
            await self._store_kept(session)
            session.claimed.difference_update(s.id for s in steps)
            session.background -= 1
            session.flush_after = anyio.current_time()  # the next flush waits a full timeout
            self._timer_wake.set()
            session.notify()
            await self._fail_pending(session, "extraction_failed")
            return
        session.claimed.difference_update(s.id for s in steps)
        session.background -= 1
        session.notify()
        trajectories = sorted({s.trajectory_id for s in steps})
        await self._events.emit(
            "changeset_applied", session_id=session.id, repo=session.repo,
            node_ids=receipt.node_ids, changeset_id=receipt.changeset_id,
        )
        await self._events.emit(
            "trajectory_committed", session_id=session.id, repo=session.repo,
            node_ids=receipt.node_ids, trajectory_ids=trajectories,
            step_indices=[s.index for s in steps],
        )
        self._kick(session)

    def _intent_policy(self, session: _Session) -> IntentPolicy:
        runtime = session.runtime
        return self.intent_policy(runtime, self._llm_for(runtime, session.repo, session.id))

    @staticmethod
    def intent_policy(runtime: Runtime, llm: LLM) -> IntentPolicy:
        """How commits made with `runtime` deduplicate intents (merging through `llm`)."""

        async def merge(existing: str, new: str) -> tuple[str, Vector] | None:
            try:
                with anyio.fail_after(runtime.config.extraction_timeout):
                    text = await ask(
                        llm,
                        merge_intent_request(existing=existing, new=new),
                        parse_merged_intent,
                    )
                    vector = (await embed(runtime.embedder, [text]))[0]
            except (LLMError, EmbeddingError, TimeoutError) as exc:
                log.warning("intent merge failed, keeping %r: %r", existing, exc)
                return None
            return text, vector

        return IntentPolicy(
            identity_threshold=runtime.config.intent_identity_threshold,
            merge_threshold=runtime.config.intent_merge_threshold,
            merge=merge,
        )

    # ---- auto-commit timers -----------------------------------------------------------------

    async def _timers(self) -> None:
        """Flushes idle trajectories and expires idle sessions of auto-commit repos."""
        while True:
            now = anyio.current_time()
            next_due = math.inf
            for session_id in list(self._timed):
                session = self._sessions.get(session_id)
                if session is None:
                    self._timed.discard(session_id)
                    continue
                due = self._check_deadlines(session, now)
                next_due = min(next_due, due)
            self._timer_wake = anyio.Event()
            with anyio.move_on_after(max(next_due - anyio.current_time(), 0.0)):
                await self._timer_wake.wait()

    def _check_deadlines(self, session: _Session, now: float) -> float:
        """Acts on what is due for `session`; returns when it next needs a look."""
        config = session.config
        if not config.auto_commit or session.ended:
            return math.inf
        if session.state not in (S.COLLECTING, S.IDLE):
            return math.inf
        due = math.inf
        if config.session_timeout is not None:
            expiry = session.last_activity + config.session_timeout
            if now >= expiry:
                session.last_activity = math.inf  # once
                self._spawn(session, self._expire, session)
                return math.inf
            due = expiry
        if config.flush_timeout is not None and session.state is S.COLLECTING:
            episode = session.episode
            waiting = [s for s in episode.steps if self._extractable(session, s)] if episode else []
            if waiting:
                flush_at = max(session.last_activity, session.flush_after) + config.flush_timeout
                if now >= flush_at:
                    self._start_background(session, waiting)
                else:
                    due = min(due, flush_at)
        return due

    async def _expire(self, session: _Session) -> None:
        """Commits what is left of an expired session, then ends it."""
        if session.state is S.COLLECTING and session.running is None and not session.pending:
            try:
                await self._do_close(session)
            except SessionError:
                pass
            while _state(session) is S.EXTRACTING and not session.ended:
                await session.changed.wait()
        if session.ended:
            return
        if _state(session) is S.FAILED:
            # Ending it would leave its steps out of the graph: keep it for a retry.
            log.warning("%s: expired, but its last extraction failed; kept", session.id)
            return
        state, committed = session.state, bool(session.last_receipt)
        # Ended before it is reported: whoever hears "session_expired" finds the id unknown.
        await self.end_session(session.id)
        await self._events.emit(
            "session_expired", session_id=session.id, repo=session.repo,
            state=state, committed=committed,
        )


def _state(session: _Session) -> State:
    # A call that awaits may have moved the state; mypy's narrowing cannot know that.
    return session.state


def _as_session_error(exc: Exception, session: _Session) -> SessionError:
    """The `SessionError` an async operation's callback receives for `exc`."""
    if isinstance(exc, SessionError):
        return exc
    reason = (
        "llm_failed" if isinstance(exc, LLMError)
        else "embedding_failed" if isinstance(exc, EmbeddingError)
        else "operation_failed"
    )
    error = SessionError(reason, state=session.state, session_id=session.id)
    error.__cause__ = exc
    return error
