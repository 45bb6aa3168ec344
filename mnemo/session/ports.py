"""The sessions' port: `SessionStore`, what the sessions need from a backend, and the rows it
reads back; every accepted step, episode and state change is written before its call returns."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import msgspec

from mnemo.calls.retry import Limits
from mnemo.config import Config
from mnemo.episode import EpisodeLog, EpisodeRecord, StepRecord
from mnemo.errors import EmbeddingError, LLMError, LLMTimeout, MnemoError, SessionError
from mnemo.extraction.memo import KeptResult
from mnemo.graph.model import Changeset
from mnemo.graph.scope import Where
from mnemo.session.machine import OpResult, Runtime, State


@dataclass(frozen=True, slots=True)
class RepoRow:
    """A repo's record: its config, vectors' dimension, and the URIs (never a key) of the
    embedder and LLM it runs with (`llm` None: recorded before models were). `generation`
    counts its re-embeddings: a record read before the last one is out of date."""

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
    model: str | None = None
    version: int = 0
    holder: str | None = None
    lease_until: datetime | None = None
    # When the session was last used through any Memory.
    active_at: datetime | None = None
    # The goal of its last episode, open or not (an idle session's is its last one's).
    goal: str | None = None
    metadata: dict[str, str | int | float | bool] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class IdleSweep:
    """What `Coordination.end_idle` did: the sessions ended, as (id, repo), and the seconds
    until the next comes due (0: more were due; None: none idle)."""

    ended: list[tuple[str, str]]
    next_due: float | None


class Runtimes(Protocol):
    """What each repo runs with (`memory.repos.Repos`): `get` its runtime, `limits` of its LLM
    calls, `learn` the repos other Memories opened, `refresh` one another Memory re-embedded."""

    limits: Limits

    def get(self, name: str) -> Runtime: ...
    async def learn(self, wanted: str | None = None) -> None: ...
    async def refresh(self, name: str, generation: int | None = None) -> Runtime: ...


class SessionStore(Protocol):
    """Every session's rows. A write that changes a session moves its `version` on and
    returns it; given the caller's `version`, it writes nothing and raises `StaleSession` when
    another `Memory` moved the session first."""

    async def load_repos(self) -> list[RepoRow]: ...
    async def save_repo(self, row: RepoRow) -> None: ...
    async def load_profile(self, repo: str, model: str) -> str | None:
        """What `model` learned of its server for `repo` (`save_profile`, JSON text), or None."""
    async def save_profile(self, repo: str, model: str, profile: str) -> None: ...
    async def create_session(
        self, session_id: str, repo: str, config: Config, episode: EpisodeRecord, *,
        holder: str | None = None, lease_until: datetime | None = None,
        metadata: Mapping[str, str | int | float | bool] | None = None,
    ) -> None:
        """Stores a new session collecting `episode`, held by `holder` until `lease_until`,
        its nodes to carry `metadata`."""
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
        """Stores the step (before its annotation) while the session still collects this
        episode; `holder` claims its annotation."""
    async def remove_step(self, session_id: str, episode_id: str, step_id: str) -> int | None:
        """Removes a step not annotated yet, with its claims, while it is its episode's last
        and the session still collects that episode; returns the session's new version, None
        (nothing written) otherwise."""
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
        episode is the session's, and drops `holder`'s claim; returns the session's new
        version, None when the step was annotated already or its episode is gone."""
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
        """Ends the session (given `version`: only while still at it, else `StaleSession`)."""
    async def load_live(self) -> list[LiveSession]: ...
    async def version(self, session_id: str) -> int | None:
        """The session's version as stored now (None: unknown or ended). Reads only."""
    async def load_one(self, session_id: str) -> LiveSession | None:
        """One live session as `load_live` brings it back (None: unknown or ended)."""
    async def keep_result(self, episode_id: str, kept: KeptResult) -> None:
        """Stores a task's validated reply with its open episode (until commit or discard)."""
    async def kept_results(self, episode_id: str) -> list[KeptResult]: ...
    async def episodes(self, session_id: str) -> list[EpisodeLog]: ...
    async def episode(self, episode_id: str) -> EpisodeLog | None: ...
    async def scoped(self, repo: str, where: Where) -> list[str]:
        """The ids of the repo's sessions, live or ended, whose metadata is inside `where`."""


@dataclass(frozen=True, slots=True)
class HolderInfo:
    """An open `Memory` on the store: its holder id, and when it last said it was alive."""

    id: str
    host: str
    pid: int
    started_at: datetime
    seen_at: datetime


def process_gone(pid: int) -> bool:
    """Whether no process of this host has the id `pid`."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # another user's
    return False


@dataclass(frozen=True, slots=True)
class SessionLease:
    """A session's row as the multi-process rules read it: state, `version`, and who holds
    its background work until when."""

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
        """`result` as stored: an error by its reason, its cause by type name and message."""
        error = result.error
        cause = None if error is None else error.__cause__
        return cls(result.ok, result.value, None if error is None else error.reason,
                   None if cause is None else (type(cause).__name__, str(cause)))

    def result(self, state: State, session_id: str) -> OpResult:
        """The result for the Memory that accepted the operation; an error keeps its cause
        as far as the store could."""
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
    `LLMError` or `EmbeddingError` as itself, anything else as a `MnemoError` naming it."""
    for error_type in (LLMTimeout, LLMError, EmbeddingError):
        if kind == error_type.__name__:
            return error_type(message)
    return MnemoError(f"{kind} (raised by the Memory that ran the operation): {message}")


class Coordination(Protocol):
    """How the `Memory` objects on one store agree on who does what: holders with a heartbeat,
    sessions moved by compare-and-set on their version, times on the store's clock. Each
    method that reads or writes the store is one transaction."""

    def now(self) -> datetime:
        """The store's time, as this `Memory` knows it (no round trip): every time compared
        across Memories is stamped and judged with it, never a host's own clock."""

    async def sync_clock(self) -> None:
        """Measures this host's clock against the store's again (SQLite: nothing to do);
        StorageError leaves `now` on the last measure."""

    async def register(self, holder: HolderInfo) -> None:
        """Records an open `Memory` (again, after a restart with the same id: replaced)."""

    async def beat(self, holder_id: str, now: datetime, lease_until: datetime) -> int:
        """The holder is alive at `now`: its `seen_at` moves on, and every lease it holds
        lasts until `lease_until`. Returns how many leases were renewed."""

    async def retire(self, holder_id: str, now: datetime) -> None:
        """The holder closes: its record, leases and step claims end at `now`, so another
        `Memory` may take its work over at once."""

    async def holders(self) -> list[HolderInfo]:
        """Every recorded holder, oldest first."""

    async def lease(self, session_id: str) -> SessionLease | None:
        """The session's row (None for an unknown session)."""

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
        `version + 1`, held by `holder_id` until `lease_until` (None, None: nobody), in `state`
        and recording `model` when given. Returns the new version, or None (nothing written)."""

    async def takeable(
        self, now: datetime, unseen_since: datetime, gone: Sequence[str] = ()
    ) -> list[SessionLease]:
        """The live sessions whose background work nobody holds any more (extracting, or in
        auto-commit with timers): a lease ended before `now`, or a holder gone (in `gone`, or
        unseen since `unseen_since`). Oldest first. Reads only."""

    async def claim_steps(
        self, session_id: str, step_ids: Sequence[str], holder_id: str, *,
        unseen_since: datetime, gone: Sequence[str] = (),
    ) -> set[str]:
        """Claims for `holder_id` the uncommitted steps among `step_ids` that no other live
        holder claims; returns those it holds now (also those held before). A step's commit
        and the session's end drop its claim."""

    async def release_steps(
        self, session_id: str, holder_id: str, step_ids: Sequence[str]
    ) -> None:
        """Drops `holder_id`'s claims on the session's `step_ids`."""

    async def claim_source(
        self, repo: str, source_id: str, payload_hash: str, holder_id: str, *,
        unseen_since: datetime, gone: Sequence[str] = (),
    ) -> str | None:
        """Claims `source_id` of `repo` (an ingest of `payload_hash`) for `holder_id` unless
        another live holder claims it: None when this holder holds it now, else the payload
        hash the other claimed."""

    async def release_source(self, repo: str, source_id: str, holder_id: str) -> None:
        """Drops `holder_id`'s claim on `source_id` of `repo`."""

    async def unannotated(
        self, unseen_since: datetime, gone: Sequence[str] = ()
    ) -> list[str]:
        """The collecting sessions with a step of their open episode unannotated and not
        claimed by a live holder: work to take over. Reads only."""

    async def queue_op(self, op: StoredOp, *, own: bool = False) -> None:
        """Stores an async operation accepted while another Memory holds the session's work,
        or (`own`) one its accepting Memory queued behind the session's work there."""

    async def take_ops(
        self, session_id: str, holder_id: str, unseen_since: datetime | None = None,
        gone: Sequence[str] = (),
    ) -> list[StoredOp]:
        """Takes the session's stored operations nobody took yet, once each, in order; with
        `unseen_since`, also those queued by a holder gone (as `takeable` judges)."""

    async def queued_ops(self, session_id: str) -> list[tuple[str, str, datetime]]:
        """The session's stored operations not answered yet, whichever Memory accepted them,
        as (id, kind, accepted at) in the order they were accepted. Reads only."""

    async def finish_op(self, op_id: str, result: StoredResult) -> None:
        """Records a taken operation's result for the Memory that accepted it (forgotten if
        that Memory closed)."""

    async def orphan_ops(self, op_ids: Sequence[str]) -> None:
        """The accepting Memory closes: these operations are forgotten (once done)."""

    async def op_results(self, op_ids: Sequence[str]) -> dict[str, StoredResult]:
        """The results recorded so far of these operations."""

    async def abandon_ops(
        self, op_ids: Sequence[str], unseen_since: datetime, gone: Sequence[str] = (), *,
        me: str | None = None,
    ) -> list[str]:
        """Forgets those of these operations another holder than `me` took and left without
        a result (it is gone, as `takeable` judges), so a late result goes nowhere; returns ids."""

    async def forget_orphans(
        self, unseen_since: datetime, gone: Sequence[str] = (), *, me: str | None = None
    ) -> int:
        """Forgets the operations nobody waits for (their Memory closed, or left as a taker
        does) that are answered or that a gone holder took and left without a result (as
        `abandon_ops` judges); returns how many."""

    async def still_taken(self, op_id: str, holder_id: str) -> bool:
        """Whether the operation is still taken by `holder_id` (False once `abandon_ops`
        answered it). Reads only."""

    async def drop_queued(self, op_id: str, holder_id: str) -> bool:
        """Forgets an operation `holder_id` queued, about to run it; False if another holder
        took it over meanwhile (or it is gone)."""

    async def left_queues(self, unseen_since: datetime, gone: Sequence[str] = ()) -> list[str]:
        """The live sessions, not extracting, with operations queued by a holder gone (as
        `takeable` judges) before it ran them. Reads only."""

    async def drop_ops(self, op_ids: Sequence[str]) -> None:
        """Forgets operations whose results were delivered, or that were answered unrun."""

    async def end_idle(self, limit: int) -> IdleSweep:
        """Ends at most `limit` sessions idle past their `idle_session_timeout`, most overdue
        first, as `SessionStore.end` does; one that moved meanwhile is left alone."""

    async def change_token(self) -> int:
        """A number that changes when another connection changed the store (a cheap poll)."""


class StepsCommittedElsewhere(Exception):
    """A commit of steps another changeset already committed: nothing was written."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"{session_id}: steps committed by another Memory")


class StaleSession(Exception):
    """A write carrying the session's version found another: nothing was written."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"{session_id}: moved by another Memory")
