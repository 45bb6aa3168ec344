"""The sessions' port: `SessionStore`, what the sessions need from a backend, and the
rows it reads back.

Every accepted step, episode and state change is written through it before the call that made
it returns; `load_live` brings back every session that had not ended. Implementations live in
`mnemo.storage.<backend>.sessions`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import msgspec

from mnemo.config import Config
from mnemo.episode import EpisodeLog, EpisodeRecord, StepRecord
from mnemo.errors import EmbeddingError, LLMError, LLMTimeout, MnemoError, SessionError
from mnemo.extraction.memo import KeptResult
from mnemo.graph.model import Changeset
from mnemo.session.machine import OpResult, State


@dataclass(frozen=True, slots=True)
class RepoRow:
    """A repo's record: its config, its vectors' dimension, and the URIs of the embedder and
    LLM it runs with (`mnemo.adapters.uri`; never a key; `llm` is None for a repo recorded
    before models were). `generation` counts the times its vectors were made again with
    another embedder (`Memory.reembed`): a record read before the last one is out of date."""

    name: str
    config: Config
    dim: int
    embedder: str
    llm: str | None = None
    generation: int = 0


@dataclass(slots=True)
class LiveSession:
    """A session as `load_live` finds it after a restart."""

    id: str
    repo: str
    state: State
    config: Config
    episode: EpisodeRecord | None
    changeset: Changeset | None = None
    created_at: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    version: int = 0
    holder: str | None = None
    lease_until: datetime | None = None
    # When the session was last used (an append, an episode started) through any Memory.
    active_at: datetime | None = None
    # The goal of its last episode, open or not (an idle session's is its last one's).
    goal: str | None = None
    metadata: dict[str, str | int | float | bool] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class IdleSweep:
    """What `Coordination.end_idle` did: the sessions it ended, as (id, repo), and the seconds
    until the next idle session comes due (0: more were due than it ended; None: none idle)."""

    ended: list[tuple[str, str]]
    next_due: float | None


class SessionStore(Protocol):
    """Every session's rows. A write that changes a session moves its `version` on and
    returns the new one; given the `version` the caller read, it writes nothing and raises
    `StaleSession` when another `Memory` moved the session first."""

    async def load_repos(self) -> list[RepoRow]: ...
    async def save_repo(self, row: RepoRow) -> None: ...
    async def load_profile(self, repo: str, model: str) -> str | None:
        """What `model` learned of its server for `repo` (`save_profile`, JSON text), or None."""
        ...
    async def save_profile(self, repo: str, model: str, profile: str) -> None: ...
    async def create_session(
        self, session_id: str, repo: str, config: Config, episode: EpisodeRecord, *,
        holder: str | None = None, lease_until: datetime | None = None,
        metadata: Mapping[str, str | int | float | bool] | None = None,
    ) -> None:
        """Stores a new session, collecting `episode`, used now, and held by `holder` (its
        auto-commit timers) until `lease_until`, its nodes to carry `metadata`."""
        ...
    async def start_episode(
        self, session_id: str, episode: EpisodeRecord, *, version: int | None = None
    ) -> int: ...
    async def add_step(
        self,
        session_id: str,
        episode_id: str,
        step: StepRecord,
        *,
        version: int | None = None,
        holder: str | None = None,
    ) -> int:
        """Stores the step (before its annotation) while the session is still collecting
        this episode; `holder` claims its annotation (`Coordination.claim_steps`)."""
        ...
    async def annotate_step(
        self,
        session_id: str,
        episode_id: str,
        step: StepRecord,
        previous: StepRecord | None,
        *,
        holder: str | None = None,
    ) -> int | None:
        """Writes a stored step's annotation and the previous step's reward, once, while the
        episode is the session's (its state may have moved on: a close waits for it), and
        drops `holder`'s claim on it; returns the session's new version, None when the step
        was annotated already or its episode is gone."""
        ...
    async def set_state(
        self,
        session_id: str,
        state: State,
        *,
        model: str | None = None,
        version: int | None = None,
    ) -> int: ...
    async def save_extraction(
        self,
        session_id: str,
        changeset: Changeset,
        scored: Sequence[StepRecord],
        *,
        version: int | None = None,
    ) -> int: ...
    async def discard(
        self, session_id: str, episode_id: str | None, *, version: int | None = None
    ) -> int: ...
    async def end(self, session_id: str, *, version: int | None = None) -> None:
        """Ends the session (given `version`: only while it is still at it, else
        `StaleSession`)."""
        ...
    async def load_live(self) -> list[LiveSession]: ...
    async def version(self, session_id: str) -> int | None:
        """The session's version as stored now (None: unknown or ended): whether another
        Memory moved it since a record was read. Reads only."""
        ...
    async def load_one(self, session_id: str) -> LiveSession | None:
        """One live session as `load_live` brings it back (None: unknown or ended)."""
        ...
    async def keep_result(self, episode_id: str, kept: KeptResult) -> None:
        """Stores a task's validated reply with its open episode (kept until it is committed
        or discarded)."""
        ...
    async def kept_results(self, episode_id: str) -> list[KeptResult]: ...
    async def episodes(self, session_id: str) -> list[EpisodeLog]: ...
    async def episode(self, episode_id: str) -> EpisodeLog | None: ...


# ---- many Memory objects on one store ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HolderInfo:
    """An open `Memory` on the store: the holder of the background work it runs, and when it
    last said it was alive (`seen_at`, renewed by its heartbeat)."""

    id: str
    host: str
    pid: int
    started_at: datetime
    seen_at: datetime


@dataclass(frozen=True, slots=True)
class SessionLease:
    """What the multi-process rules read of a session's row: its state and `version` (every
    transition compares and sets it), and who holds its background work until when."""

    id: str
    repo: str
    state: State
    version: int
    holder: str | None
    lease_until: datetime | None
    model: str | None
    ended: bool


@dataclass(frozen=True, slots=True)
class StoredOp:
    """An async operation stored with its session (`args`: JSON values)."""

    id: str
    session_id: str
    kind: str
    args: list[Any]
    accepted_by: str
    created_at: datetime


class StoredResult(msgspec.Struct):
    """An operation's result as one Memory stores it for the Memory that accepted it."""

    ok: bool
    value: str | None = None
    error: str | None = None
    # The type's name and message of the error's cause.
    cause: tuple[str, str] | None = None

    @classmethod
    def of(cls, result: OpResult) -> StoredResult:
        """`result` as stored: an error by its reason, its cause by its type's name and
        message (an exception does not cross processes)."""
        error = result.error
        cause = None if error is None else error.__cause__
        return cls(result.ok, result.value, None if error is None else error.reason,
                   None if cause is None else (type(cause).__name__, str(cause)))

    def result(self, state: State, session_id: str) -> OpResult:
        """The result for the Memory that accepted the operation; an error keeps its cause
        (`operation_failed`'s LLM or embedder error) as far as the store could."""
        error = None if self.error is None else SessionError(
            self.error, state=state, session_id=session_id)
        if error is not None and self.cause is not None:
            error.__cause__ = _remote_cause(*self.cause)
        return OpResult(self.ok, self.value, error)

    @classmethod
    def decode(cls, text: str | bytes) -> StoredResult:
        """A stored result's JSON text; one that does not read as a result is a failure."""
        try:
            return msgspec.json.decode(text, type=cls)
        except msgspec.DecodeError:
            return cls(False, error="operation_failed")


def _remote_cause(kind: str, message: str) -> Exception:
    """An error raised in another Memory, rebuilt from its type's name and message: an
    `LLMError` or `EmbeddingError` (what a caller tells an `operation_failed` by) as itself,
    anything else as a `MnemoError` naming its type."""
    for error_type in (LLMTimeout, LLMError, EmbeddingError):
        if kind == error_type.__name__:
            return error_type(message)
    return MnemoError(f"{kind} (raised by the Memory that ran the operation): {message}")


class Coordination(Protocol):
    """How the `Memory` objects on one store agree on who does what: holders with a heartbeat,
    and sessions moved by compare-and-set on their version, with times on the store's clock
    (`now`). Each method that reads or writes the store is one transaction."""

    def now(self) -> datetime:
        """The store's time, as this `Memory` knows it: every time compared across Memories
        (a lease, a heartbeat, a session's last use, an operation's acceptance) is stamped
        and judged with it, never with a host's own clock. No round trip."""
        ...

    async def sync_clock(self) -> None:
        """Measures this host's clock against the store's again (`now` follows it). SQLite
        is on one host, whose clock is the store's: nothing to do.

        Raises:
            StorageError: the store could not be asked (`now` keeps the last measure).
        """
        ...

    async def register(self, holder: HolderInfo) -> None:
        """Records an open `Memory` (again, after a restart with the same id: replaced)."""
        ...

    async def beat(self, holder_id: str, now: datetime, lease_until: datetime) -> int:
        """The holder is alive at `now`: its `seen_at` moves on, and every lease it holds
        lasts until `lease_until`. Returns how many leases were renewed."""
        ...

    async def retire(self, holder_id: str, now: datetime) -> None:
        """The holder closes: its record goes and its leases end at `now` (its step claims
        with it: a claim lasts while its holder is recorded), so that another `Memory` may
        take its work over at once."""
        ...

    async def holders(self) -> list[HolderInfo]:
        """Every recorded holder, oldest first."""
        ...

    async def lease(self, session_id: str) -> SessionLease | None:
        """The session's row (None for an unknown session)."""
        ...

    async def claim(
        self,
        session_id: str,
        *,
        version: int,
        holder_id: str | None,
        lease_until: datetime | None,
        state: State | None = None,
        model: str | None = None,
    ) -> int | None:
        """Compare-and-set: when the session's version is still `version`, it becomes
        `version + 1`, held by `holder_id` until `lease_until` (None, None: held by nobody),
        in `state` and recording `model` when given. Returns the new version, or None when
        another `Memory` moved the session first (nothing written)."""
        ...

    async def takeable(
        self, now: datetime, unseen_since: datetime, gone: Sequence[str] = ()
    ) -> list[SessionLease]:
        """The live sessions whose background work nobody holds any more: extracting (or
        collecting or idle in auto-commit: their timers), with a lease that ended before
        `now`, or a holder that is gone, in `gone`, or was last seen
        before `unseen_since`. Oldest first. Reads only."""
        ...

    async def claim_steps(
        self, session_id: str, step_ids: Sequence[str], holder_id: str, *,
        unseen_since: datetime, gone: Sequence[str] = (),
    ) -> set[str]:
        """Claims for `holder_id` the uncommitted steps of the session among `step_ids` that
        no other holder claims, or whose claimer left (retired, not seen since
        `unseen_since`, or in `gone`); returns those among `step_ids` it holds now (also the
        ones it held before). A commit of a step, and the session's end, drop its claim."""
        ...

    async def release_steps(
        self, session_id: str, holder_id: str, step_ids: Sequence[str]
    ) -> None:
        """Drops `holder_id`'s claims on the session's `step_ids`: it will not commit them
        after all."""
        ...

    async def unannotated(
        self, unseen_since: datetime, gone: Sequence[str] = ()
    ) -> list[str]:
        """The collecting sessions with a step of their open episode not annotated yet and
        not claimed by a live holder (one not retired, seen since `unseen_since`, not in
        `gone`): work to take over. Reads only."""
        ...

    async def queue_op(self, op: StoredOp) -> None:
        """Stores an async operation accepted while another Memory holds the session's work."""
        ...

    async def take_ops(self, session_id: str, holder_id: str) -> list[StoredOp]:
        """Takes the session's stored operations nobody took yet (each is taken once), in
        the order they were accepted."""
        ...

    async def finish_op(self, op_id: str, result: StoredResult) -> None:
        """Records a taken operation's result for the Memory that accepted it (forgets the
        operation when that Memory closed: nobody is left to call back)."""
        ...

    async def orphan_ops(self, op_ids: Sequence[str]) -> None:
        """The Memory that accepted these operations closes: those done are forgotten, the
        others are forgotten once done."""
        ...

    async def op_results(self, op_ids: Sequence[str]) -> dict[str, StoredResult]:
        """The results recorded so far of these operations."""
        ...

    async def abandon_ops(
        self, op_ids: Sequence[str], unseen_since: datetime, gone: Sequence[str] = (), *,
        me: str | None = None,
    ) -> list[str]:
        """Forgets those of these operations that a holder other than `me` took and left
        without recording a result (it retired, is in `gone`, or was last seen before
        `unseen_since`), so that a result it still records goes nowhere; returns their ids."""
        ...

    async def forget_orphans(
        self, unseen_since: datetime, gone: Sequence[str] = (), *, me: str | None = None
    ) -> int:
        """Forgets the operations nobody waits for (the Memory that accepted them closed)
        that a holder other than `me` took and left without a result (as `abandon_ops`
        judges it): nobody else would take them, and nobody reads them; returns how many."""
        ...

    async def still_taken(self, op_id: str, holder_id: str) -> bool:
        """Whether the operation is still taken by `holder_id`: False once the Memory that
        accepted it answered it (`abandon_ops`, having taken that holder for gone). Reads
        only."""
        ...

    async def drop_ops(self, op_ids: Sequence[str]) -> None:
        """Forgets operations whose results were delivered."""
        ...

    async def end_idle(self, limit: int) -> IdleSweep:
        """Ends at most `limit` idle sessions untouched (no change of state) for longer than
        their config's `idle_session_timeout`, the most overdue first, as
        `SessionStore.end` ends one; a session that moved meanwhile is left alone. Reads only
        when none is due."""
        ...

    async def change_token(self) -> int:
        """A number that changes when another connection changed the store (a cheap read:
        what a waiting `Memory` polls)."""
        ...


class StepsCommittedElsewhere(Exception):
    """A commit of steps another changeset already committed (another `Memory`'s auto-commit
    of the same steps): nothing was written, and the session itself may not have moved."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"{session_id}: steps committed by another Memory")
        self.session_id = session_id


class StaleSession(Exception):
    """A write that carried the session's version found another one: another `Memory` moved
    the session first, and nothing was written (the caller reads the session again)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"{session_id}: moved by another Memory")
        self.session_id = session_id
