"""The session state machine and the record it moves. `EDGES` is the one table: the
`transitions` machine fires them, and a trigger it does not fire is answered by `refusal` (a
call's reason from `REFUSALS`, a background result "stale"). Callbacks never await I/O: effects
run outside the machine (`Extract`, `CommitSteps`), and their results come back as triggers.
```
            start_episode            close                 extraction_succeeded
   IDLE ─────────────────▶ COLLECTING ─────▶ EXTRACTING ─────────────────────────▶ READY
    ▲                        │  ▲ append      │   │ auto_committed                  │ │
    │                        └──┘             │   └──────────────▶ IDLE             │ │
    │             commit (retry) ┌────────────┘ extraction_failed                   │ │
    │                            │            ▼                                     │ │
    └──── discard ──────────── FAILED ◀───────┘          IDLE ◀── commit/discard ───┘ │
```
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar, Final

import anyio
from transitions import Machine

from mnemo.adapters.recorded import check_runnable
from mnemo.config import Config, with_longer_timeouts
from mnemo.episode import EpisodeRecord, StepRecord
from mnemo.errors import (
    EmbeddingError,
    LLMError,
    NotFoundError,
    SessionError,
    check_step,
    check_text,
)
from mnemo.extraction.memo import TaskMemo
from mnemo.graph.model import Changeset, CommitReceipt
from mnemo.ports import LLM, Embedder, check_dim, deliver as call_back


class State(StrEnum):
    IDLE = "idle"
    COLLECTING = "collecting"
    EXTRACTING = "extracting"
    READY = "ready"
    FAILED = "failed"


S = State

# What a caller can ask of a session, and what background work reports back.
CALLS: Final = ("start_episode", "append", "close", "commit", "discard")
RESULTS: Final = ("extraction_succeeded", "extraction_failed", "auto_committed")
STALE: Final = "stale"


def _appending(*, appends: int = 0, **_: object) -> bool:
    """An append runs, or was accepted before the close (`appends`, counted by the caller)."""
    return appends > 0


EDGES: Final[list[dict[str, Any]]] = [
    {"trigger": "start_episode", "source": S.IDLE, "dest": S.COLLECTING},
    {"trigger": "append", "source": S.COLLECTING, "dest": S.COLLECTING},
    {"trigger": "close", "source": S.COLLECTING, "dest": S.EXTRACTING, "unless": [_appending]},
    {"trigger": "extraction_succeeded", "source": S.EXTRACTING, "dest": S.READY},
    {"trigger": "extraction_failed", "source": S.EXTRACTING, "dest": S.FAILED},
    # Auto-commit: the close's extraction commits by itself and the session is idle again.
    {"trigger": "auto_committed", "source": S.EXTRACTING, "dest": S.IDLE},
    {"trigger": "commit", "source": S.READY, "dest": S.IDLE},
    # In FAILED, commit retries the extraction.
    {"trigger": "commit", "source": S.FAILED, "dest": S.EXTRACTING},
    {"trigger": "discard", "source": [S.READY, S.FAILED], "dest": S.IDLE},
]

# Why each call is refused where the table has no edge for it, or its condition does not hold.
REFUSALS: Final[dict[State, dict[str, str]]] = {
    S.IDLE: {"append": "not_collecting", "close": "not_collecting", "commit": "not_ready",
             "discard": "not_discardable"},
    S.COLLECTING: {"start_episode": "not_idle", "commit": "not_ready",
                   "discard": "not_discardable", "close": "append_in_progress"},
    S.EXTRACTING: dict.fromkeys(CALLS, "extraction_in_progress"),
    S.READY: {"start_episode": "not_idle", "append": "not_idle", "close": "not_idle"},
    S.FAILED: {"start_episode": "session_failed", "append": "session_failed",
               "close": "session_failed"},
}

def new_machine() -> Machine:
    """The machine of one Memory's sessions; not queued: no callback fires a trigger."""
    return Machine(model=None, states=list(State), transitions=EDGES, initial=S.IDLE,
                   auto_transitions=False, queued=False, send_event=False)


def refusal(session: SessionRecord, event: str, **facts: object) -> str | None:
    """None when the table lets `event` fire on the session now (`facts`: its condition's
    arguments); else a call's reason, or `STALE` for a background result."""
    if event not in CALLS and event not in RESULTS:
        raise ValueError(f"unknown session event {event!r}")
    if session.may_trigger(event, **facts):
        return None
    return STALE if event in RESULTS else REFUSALS[session.state][event]


def refuse_unless(session: SessionRecord, event: str, **facts: object) -> None:
    """Raises NotFoundError for an ended session, SessionError where the table refuses."""
    if session.ended:  # ended while this call waited for its turn
        raise NotFoundError("session", session.id)
    if (reason := refusal(session, event, **facts)) is not None:
        raise SessionError(reason, state=session.state, session_id=session.id)


def appends_before(session: SessionRecord, *, queued: bool = False) -> int:
    """The appends a close waits for: those running or accepted before it (a `queued` close
    is not held by appends queued after it)."""
    later = sum(op.kind == "append" for op in session.pending) if queued else 0
    return max(session.appends_in_flight - later, 0)


def refuse_close(session: SessionRecord, *, queued: bool = False) -> None:
    """Raises as `refuse_unless`: `append_in_progress` while an append runs."""
    refuse_unless(session, "close", appends=appends_before(session, queued=queued))


@dataclass(frozen=True, slots=True)
class SessionContext:
    """A live session's goal and its last steps, each "obs -> act"."""

    goal: str
    recent_steps: list[str]


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A live session as `Memory.list_sessions` reports it: `goal` is its last episode's,
    `steps` the open episode's count (0 when idle), `holder` the `Memory` holding its
    background work until `lease_until`."""

    id: str
    repo: str
    state: State
    goal: str | None
    steps: int
    holder: str | None = None
    lease_until: datetime | None = None


@dataclass(slots=True)
class Runtime:
    """The llm, embedder and config a repo (or one session) works with, the repo's vector
    dimension (0: none recorded) and generation as this Memory knows it."""

    llm: LLM
    embedder: Embedder
    config: Config
    dim: int = 0
    generation: int = 0

    def check_usable(self, repo: str) -> None:
        """`check_dim`, and the LLMError or EmbeddingError of a recorded model that cannot be
        built here (before an append stores a step no model here could annotate)."""
        check_dim(repo, self.embedder, self.dim)
        check_runnable(self.llm)
        check_runnable(self.embedder)


@dataclass(frozen=True, slots=True)
class Extract:
    """The effect of a move to `extracting` held here: run the open episode's extraction."""


@dataclass(frozen=True, slots=True)
class CommitSteps:
    """The effect of a trajectory boundary in auto-commit (or a flush, or a takeover): extract
    and commit `steps` in the background."""

    steps: list[StepRecord]


Effect = Extract | CommitSteps


@dataclass(frozen=True, slots=True)
class OpResult:
    """What an async operation's callback receives."""

    ok: bool
    value: str | None = None
    error: SessionError | None = None


Callback = Callable[[OpResult], Awaitable[None] | None]

# What each operation reports when it succeeds.
VALUES = {"commit": "committed", "discard": "discarded", "start_episode": "started",
          "close": "closed", "append": "appended"}


@dataclass(slots=True)
class Op:
    """One accepted async operation: `applied` once its state change happened; `stored` the
    row of an operation taken from the store, `queued` the row of one this Memory queued,
    `at` when that row was accepted (the store's time: the queue runs in that order)."""

    kind: str
    args: tuple[Any, ...]
    callback: Callback | None
    ticket: int | None = None
    applied: bool = False
    stored: str | None = None
    queued: str | None = None
    at: datetime | None = None


def project(start: State, kinds: Iterable[str], *, auto_commit: bool) -> State | None:
    """The state after queued operations of `kinds` from `start` (a close ends `ready`, or
    `idle` in auto-commit), or None if one of them has no edge on the way."""
    state: State | None = start
    for kind in kinds:
        if state is None:
            return None
        state = next((S(e["dest"]) for e in EDGES if e["trigger"] == kind
                      and state in (e["source"] if isinstance(e["source"], list)
                                    else [e["source"]])), None)
        if kind == "close" and state is not None:
            state = S.IDLE if auto_commit else S.READY
    return state


async def deliver(callback: Callback | None, result: OpResult) -> None:
    """`ports.deliver` of an operation's callback, if any (`end_session` may cancel the task)."""
    if callback is not None:
        await call_back(callback, result, "an operation")


class TicketQueue:
    """Lets numbered tickets through one at a time, in order; an abandoned one is skipped."""

    def __init__(self) -> None:
        self._tickets = itertools.count()
        self._serving = 0
        self._waiting: dict[int, anyio.Event] = {}
        self._abandoned: set[int] = set()

    def take(self) -> int:
        return next(self._tickets)

    async def wait(self, ticket: int) -> None:
        """Returns when it is `ticket`'s turn; the holder must then call `leave`."""
        if ticket == self._serving:
            return
        event = self._waiting.setdefault(ticket, anyio.Event())
        try:
            await event.wait()
        except BaseException:
            self._waiting.pop(ticket, None)
            if ticket == self._serving:
                self.leave(ticket)  # our turn came as we were cancelled: pass it on
            else:
                self._abandoned.add(ticket)
            raise

    def leave(self, ticket: int) -> None:
        """Ends `ticket`'s turn (or abandons it, if its turn has not come; one left already
        stays left)."""
        if ticket < self._serving:
            return
        if ticket != self._serving:
            self._abandoned.add(ticket)
            return
        self._serving += 1
        while self._serving in self._abandoned:
            self._abandoned.discard(self._serving)
            self._serving += 1
        if (event := self._waiting.pop(self._serving, None)) is not None:
            event.set()


# The session whose operation's callback runs in this context.
CALLED_BACK: ContextVar[SessionRecord | None] = ContextVar("mnemo_called_back", default=None)
# The sessions (one Memory's) whose background work the current task is, and that task.
_WORKING: ContextVar[tuple[object, object] | None] = ContextVar("mnemo_working", default=None)


def working(sessions: object) -> None:
    """Marks the running task as part of `sessions`' background work (a task it starts is not)."""
    _WORKING.set((sessions, asyncio.current_task()))


def working_for(sessions: object) -> bool:
    """Whether the running task is part of `sessions`' background work (`working`)."""
    marked = _WORKING.get()
    return marked is not None and marked[0] is sessions and marked[1] is asyncio.current_task()


@dataclass(eq=False)
class SessionRecord:
    """One live session of this Memory, the model its machine moves. Not slotted: the machine
    sets its methods on the record."""

    id: str
    repo: str
    repo_runtime: Runtime
    override: Runtime | None
    config: Config
    state: State = S.IDLE
    episode: EpisodeRecord | None = None
    changeset: Changeset | None = None
    # The scope its nodes carry (`Node.metadata`).
    metadata: dict[str, str | int | float | bool] = field(default_factory=dict)
    last_receipt: CommitReceipt | None = None
    failure: BaseException | None = None
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    ticket_queue: TicketQueue = field(default_factory=TicketQueue)
    appends_in_flight: int = 0
    pending: deque[Op] = field(default_factory=deque)
    running: Op | None = None
    background: int = 0
    claimed: set[str] = field(default_factory=set)
    changed: anyio.Event = field(default_factory=anyio.Event)
    scopes: set[anyio.CancelScope] = field(default_factory=set)
    # Tasks that only wait on the store for it: cancelled with it, but no work on it.
    waits: set[anyio.CancelScope] = field(default_factory=set)
    # Read from the store rather than started here: its repo's longer timeouts hold for it.
    recorded: bool = False
    # The model the session's extraction started with (`ports.model_name`); None: unknown.
    extraction_model: str | None = None
    # When it was last used, on the event loop's clock (from the store's `active_at` too).
    last_activity: float = 0.0
    active_at: datetime | None = None
    flush_after: float = 0.0
    # This Memory drives the session's auto-commit timers: the store names it the holder.
    driven: bool = False
    checking: bool = False  # a due deadline is being checked against the store
    ended: bool = False
    # The session row's version this record reflects: a write carrying another writes nothing.
    version: int = 0
    watching: bool = False  # queued operations wait for work another Memory holds
    # Held while an operation is checked against and stored beside this Memory's stored ones.
    storing: anyio.Lock = field(default_factory=anyio.Lock)
    # Held while the session's stored operations are taken and queued, one taker at a time.
    taking: anyio.Lock = field(default_factory=anyio.Lock)
    # Work that ends by handing stored operations over is under way.
    handing_over: int = 0
    # This Memory runs the session's extraction (started, not yet over).
    extracts: bool = False
    # The open episode's validated extraction results, so a retry re-asks only what failed.
    memo: TaskMemo | None = None
    # The annotation runs here; the steps whose annotation it claimed; what stopped the last.
    annotating: bool = False
    held: set[str] = field(default_factory=set)
    annotation_failure: BaseException | None = None
    failed_step: str | None = None  # the step whose annotation raised `annotation_failure`

    # Set on the record by `Machine.add_model`.
    may_trigger: ClassVar[Callable[..., bool]]
    trigger: ClassVar[Callable[..., bool]]

    @property
    def runtime(self) -> Runtime:
        """The session's llm and embedder: its overrides, else its repo's (read late); a
        session read from the store runs with its repo's timeouts where longer."""
        base = self.repo_runtime
        config = with_longer_timeouts(self.config, base.config) if self.recorded else self.config
        chosen = base if self.override is None else self.override
        return Runtime(chosen.llm, chosen.embedder, config, base.dim, base.generation)

    @property
    def busy(self) -> bool:
        """Whether an operation accepted now queues: an extraction, or an accepted operation,
        is under way (the contract's "busy"; a synchronous append is neither)."""
        return (self.state is S.EXTRACTING or self.background > 0 or self.running is not None
                or bool(self.pending))

    def notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def after_accepted(self) -> None:
        """Returns once the operations accepted before this call have run (or an extraction
        holds the rest back): a synchronous call keeps call order with the queue. A call from
        an operation's callback goes first: the next operation waits for the callback."""
        if CALLED_BACK.get() is self:
            return
        ahead = [op for op in (self.running, *self.pending) if op is not None]
        while not self.ended and self.state is not S.EXTRACTING and any(
                op is self.running or any(op is p for p in self.pending) for op in ahead):
            await self.changed.wait()

    def advance(self, version: int) -> None:
        """Takes `version`, what this Memory's write left, when it follows the record's (else
        another Memory wrote meanwhile, and a reload reads it)."""
        if version == self.version + 1:
            self.version = version

    def step_at(self, episode_id: str, index: int) -> StepRecord | None:
        """The step `index` of episode `episode_id` as the record holds it now, None once the
        episode is not the session's."""
        episode = self.episode
        if episode is None or episode.id != episode_id or index >= len(episode.steps):
            return None
        return episode.steps[index]

    def model_failure(self, step_id: str) -> BaseException | None:
        """The model's or embedder's failure (not a timeout) that ended the last annotation,
        at the step `step_id`."""
        failure = self.annotation_failure
        if self.annotating or self.failed_step != step_id or isinstance(failure, TimeoutError):
            return None
        return failure if isinstance(failure, LLMError | EmbeddingError) else None

    def unannotated(self) -> list[StepRecord]:
        return [s for s in self.episode.steps if not s.annotated] if self.episode else []

    def uncommitted(self) -> list[StepRecord]:
        """The open episode's annotated steps not committed nor extracted by a background
        commit here: what a flush or a close extracts."""
        return [s for s in self.episode.steps if self._extractable(s)] if self.episode else []

    def finished_steps(self) -> list[StepRecord]:
        """The steps a boundary hands to a background commit: the uncommitted ones of every
        trajectory of the open episode but the last annotated one."""
        annotated = [s for s in self.episode.steps if s.annotated] if self.episode else []
        if not annotated:
            return []
        current = annotated[-1].trajectory_id
        return [s for s in annotated if s.trajectory_id != current and self._extractable(s)]

    def _extractable(self, step: StepRecord) -> bool:
        return step.annotated and step.committed_in is None and step.id not in self.claimed


def current_state(session: SessionRecord) -> State:
    """The session's state now (a call that awaited may have moved it; mypy cannot know)."""
    return session.state


def check_args(session: SessionRecord, kind: str, args: tuple[Any, ...]) -> None:
    """Raises InvalidInputError for an operation's text past the session's bounds."""
    if kind == "append":
        check_step(args[0], args[1], None, limit=session.config.max_text_chars)
    elif kind == "start_episode":
        check_text(args[0], "goal", limit=session.config.max_text_chars)


def check_queue(session: SessionRecord, queued: int, projected: State | None) -> None:
    """Raises the queue rules' SessionError: the queue is full, or no state is `projected`."""
    if queued >= session.config.max_pending_ops:
        raise SessionError("pending_queue_full", state=session.state, session_id=session.id)
    if projected is None:
        raise SessionError("invalid_queued_operation", state=session.state,
                           session_id=session.id)


def accept(session: SessionRecord, op: Op) -> None:
    """Counts an accepted append in flight."""
    if op.kind == "append":
        session.appends_in_flight += 1


def projection(session: SessionRecord, queued: list[str]) -> State | None:
    """The state after the running operation (if not applied yet) and `queued`."""
    auto = session.config.auto_commit
    if session.state is S.EXTRACTING:
        start = S.IDLE if auto else S.READY
        kinds: list[str] = []
    else:
        start = session.state
        running = session.running
        kinds = [running.kind] if running and not running.applied else []
    return project(start, [*kinds, *queued], auto_commit=auto)


def failure(session: SessionRecord, reason: str) -> OpResult:
    return OpResult(False, None, SessionError(reason, state=session.state, session_id=session.id))


def as_session_error(exc: Exception, session: SessionRecord) -> SessionError:
    if isinstance(exc, SessionError):
        return exc
    # The API contract: the caller tells the failure by its cause, not by a reason of its own.
    error = SessionError("operation_failed", state=session.state, session_id=session.id)
    error.__cause__ = exc
    return error
