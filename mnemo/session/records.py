"""The values the session service works with: a live session's record (`SessionRecord`), the
`Runtime` it runs with, and what callers read of a session (`SessionContext`, `SessionInfo`).

The effects a move starts are values here too (`Extract`, `CommitSteps`, `Annotate`): the
machine's moves (`transitions`) name them, and the service starts them (`Sessions.start`).

A `SessionRecord` is the in-memory side of one live session: its machine model, the episode it
collects, its operation queue and its background work. Busy, for the async queue, means:
extracting, an auto-commit extraction in flight, or an accepted operation still running
(the API contract, "The async operation queue").
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import anyio

from mnemo.adapters.recorded import UnavailableEmbedder, UnavailableLLM
from mnemo.config import Config, with_longer_timeouts
from mnemo.episode.model import EpisodeRecord, StepRecord
from mnemo.errors import EmbeddingError, LLMError
from mnemo.extraction.memo import TaskMemo
from mnemo.graph.model import Changeset, CommitReceipt
from mnemo.inputs import check_json, check_text
from mnemo.ports import LLM, Embedder
from mnemo.session.machine import SessionModel, State
from mnemo.session.queue import Op

S = State


@dataclass(frozen=True, slots=True)
class SessionContext:
    """A live session's goal and its last steps, each "obs -> act"."""

    goal: str
    recent_steps: list[str]


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A live session as `Memory.list_sessions` reports it: `goal` is its last episode's (the
    open one's, or for an idle session the one it last committed or discarded) and `steps`
    counts the open episode's steps (0 when idle). `holder` is the `Memory` that holds its
    background work (an extraction), until `lease_until` unless its heartbeat renews it."""

    id: str
    repo: str
    state: State
    goal: str | None
    steps: int
    holder: str | None = None
    lease_until: datetime | None = None


@dataclass(slots=True)
class Runtime:
    """The llm, embedder and config a repo (or one session) works with, the dimension of the
    repo's vectors (0 while the repo has none recorded), and their generation as this Memory
    knows it (`RepoRow.generation`: what the embedder's vectors are made for)."""

    llm: LLM
    embedder: Embedder
    config: Config
    dim: int = 0
    generation: int = 0

    def check_dim(self, repo: str) -> None:
        """Raises EmbeddingError when the embedder's vectors would not fit the repo's."""
        if self.dim and self.embedder.dim != self.dim:
            raise EmbeddingError(
                f"repo {repo!r} holds vectors of dimension {self.dim}, but the embedder "
                f"{getattr(self.embedder, 'name', type(self.embedder).__name__)} makes "
                f"dimension {self.embedder.dim}; open the repo with an embedder of its "
                "dimension"
            )

    def check_usable(self, repo: str) -> None:
        """`check_dim`, and the error of a recorded model that cannot be built here
        (`adapters.recorded`): an append refuses it before it stores a step that no model here
        could annotate.

        Raises:
            LLMError, EmbeddingError: the LLM or the embedder cannot work here.
        """
        self.check_dim(repo)
        if isinstance(self.llm, UnavailableLLM):
            raise LLMError(self.llm.problem)
        if isinstance(self.embedder, UnavailableEmbedder):
            raise EmbeddingError(self.embedder.problem)


@dataclass(frozen=True, slots=True)
class Extract:
    """The effect of a move to `extracting` held here: run the open episode's extraction."""


@dataclass(frozen=True, slots=True)
class CommitSteps:
    """The effect of a trajectory boundary in auto-commit (or a flush, or a take-over):
    extract and commit `steps` in the background while the session keeps collecting."""

    steps: list[StepRecord]


@dataclass(frozen=True, slots=True)
class Annotate:
    """The effect of a stored step: annotate the open episode's stored steps, in order, in
    the background (one task a session; started again by the next append or the close when
    an annotation failed)."""


Effect = Extract | CommitSteps | Annotate


class TicketQueue:
    """Lets holders of numbered tickets through one at a time, in ticket order.

    A ticket taken and then abandoned (its operation failed or was cancelled before its turn)
    is skipped, so no later holder waits forever.
    """

    def __init__(self) -> None:
        self._next = 0
        self._serving = 0
        self._waiting: dict[int, anyio.Event] = {}
        self._abandoned: set[int] = set()

    def take(self) -> int:
        ticket = self._next
        self._next += 1
        return ticket

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
        """Ends `ticket`'s turn (or abandons it, if its turn has not come)."""
        if ticket != self._serving:
            self._abandoned.add(ticket)
            return
        self._serving += 1
        while self._serving in self._abandoned:
            self._abandoned.discard(self._serving)
            self._serving += 1
        event = self._waiting.pop(self._serving, None)
        if event is not None:
            event.set()


@dataclass(eq=False, slots=True)
class SessionRecord:
    """One live session of this Memory: what the store holds of it, plus its lock, queue and
    background work, which only this process knows."""

    id: str
    repo: str
    model: SessionModel
    repo_runtime: Runtime
    override: Runtime | None
    config: Config
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
    # Tasks that only wait on the store for it (`stored.watch`): cancelled with it, but no
    # work on it (a watcher counted as work made this Memory queue operations locally, for
    # an extraction it did not hold, and never take over that work).
    waits: set[anyio.CancelScope] = field(default_factory=set)
    # Read from the store (restored, or started through another Memory) rather than started
    # here: its repo's longer timeouts hold for it (`runtime`).
    recorded: bool = False
    # The model the session's extraction started with (`ports.model_name`); None: unknown.
    extraction_model: str | None = None
    # When it was last used, on the event loop's clock: through this Memory, or, as read from
    # the store (`active_at`, the store's time of the last use through any Memory).
    last_activity: float = 0.0
    active_at: datetime | None = None
    flush_after: float = 0.0
    # This Memory drives the session's auto-commit timers: the store names it the session's
    # holder (it started the session, claimed its work, or took it over). A Memory that only
    # read the session never flushes or expires it.
    driven: bool = False
    # A due deadline is being checked against the store (`timers._due`).
    checking: bool = False
    ended: bool = False
    # The session row's version this record reflects: every write carries it, and one that
    # finds another (a Memory elsewhere moved the session) writes nothing.
    version: int = 0
    # Queued operations wait for work another Memory holds: a watcher reads the store.
    watching: bool = False
    # Held while an operation is checked against the ones this Memory stored for the session
    # and stored beside them (`stored.submit_remote`): a second call waits, so that the
    # pending bound and the queue's rules see the first; and by the Memory's close while it
    # answers them (`SessionService.run`), so that a row being written is answered too.
    storing: anyio.Lock = field(default_factory=anyio.Lock)
    # Held while the session's stored operations are taken and queued (`stored.run_stored`: the
    # extraction's end and the watcher both do it), one taker at a time.
    taking: anyio.Lock = field(default_factory=anyio.Lock)
    # Work that ends by handing stored operations over is under way (an extraction, from its
    # start to its queue's, or a take): while operations this Memory stored wait in it, a
    # call queues behind them and the queue waits (`operations.awaits_handover`).
    handing_over: int = 0
    # The open episode's validated extraction results, so a retry re-asks only what failed,
    # stored with the episode too.
    memo: TaskMemo | None = None
    # The stored steps' annotation runs here (`Annotate`); the ids of the steps whose
    # annotation this Memory claimed in the store; what stopped the last one.
    annotating: bool = False
    held: set[str] = field(default_factory=set)
    annotation_failure: BaseException | None = None

    @property
    def state(self) -> State:
        return self.model.state

    @property
    def runtime(self) -> Runtime:
        """The session's llm and embedder: its own overrides, else its repo's (read late, so a
        restored session picks up what `open_repo` gives its repo)."""
        base = self.repo_runtime
        # A session read from the store with shorter timeouts than its repo now runs with gets
        # the repo's: a slow server's work given more time on reopening has it. One started
        # here keeps the config it was given.
        config = with_longer_timeouts(self.config, base.config) if self.recorded else self.config
        if self.override is None:
            return Runtime(base.llm, base.embedder, config, base.dim, base.generation)
        return Runtime(self.override.llm, self.override.embedder, config, base.dim,
                       base.generation)

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


def current_state(session: SessionRecord) -> State:
    """The session's state now: a call that awaits may have moved it, which mypy's narrowing
    of `session.state` cannot know."""
    return session.state


def check_step(
    config: Config, observation: object, action: object, metadata: dict[str, Any] | None
) -> None:
    """Raises InvalidInputError for a blank observation (a step is what was observed), or a
    step past `config.max_text_chars` (metadata: as JSON, and `inputs.MAX_JSON_DEPTH` deep)."""
    check_text(observation, "observation", limit=config.max_text_chars)
    check_text(action, "action", limit=config.max_text_chars, blank_ok=True)
    if metadata is not None:
        check_json(metadata, "metadata", limit=config.max_text_chars)


def extractable(session: SessionRecord, step: StepRecord) -> bool:
    return step.annotated and step.committed_in is None and step.id not in session.claimed


def step_at(session: SessionRecord, episode_id: str, index: int) -> StepRecord | None:
    """The step `index` of episode `episode_id` as the record holds it now (a read of the
    store replaces the records), None once the episode is not the session's."""
    episode = session.episode
    if episode is None or episode.id != episode_id or index >= len(episode.steps):
        return None
    return episode.steps[index]


def unannotated(session: SessionRecord) -> list[StepRecord]:
    episode = session.episode
    return [s for s in episode.steps if not s.annotated] if episode else []


def uncommitted(session: SessionRecord) -> list[StepRecord]:
    """The open episode's annotated steps that no commit has and no background commit here is
    extracting: what a flush or a close extracts."""
    episode = session.episode
    return [s for s in episode.steps if extractable(session, s)] if episode else []


def finished_steps(session: SessionRecord) -> list[StepRecord]:
    """The steps a boundary hands to a background commit: the uncommitted ones of every
    trajectory of the open episode but the last annotated one."""
    episode = session.episode
    annotated = [s for s in episode.steps if s.annotated] if episode else []
    if not annotated:
        return []
    current = annotated[-1].trajectory_id
    return [s for s in annotated if s.trajectory_id != current and extractable(session, s)]
