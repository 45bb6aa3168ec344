"""`Sessions`, what the session modules share; a step's path (`append` stores steps in call
order, `annotation` annotates them in order); the step claims: which Memory works on which."""

from __future__ import annotations

import logging
import math
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskGroup
from transitions import Machine

from mnemo.config import Config
from mnemo.episode import NO_VECTOR, EpisodeRecord, StepInfo, StepRecord, annotate_step
from mnemo.errors import NotFoundError, SessionError, StorageError, check_id, check_step
from mnemo.graph.ports import GraphStore
from mnemo.ports import Events
from mnemo.session.machine import (
    Callback,
    CommitSteps,
    Effect,
    Op,
    Runtime,
    SessionRecord,
    State,
    new_machine,
    refuse_unless,
    working,
)
from mnemo.session.ports import (
    Coordination,
    HolderInfo,
    LiveSession,
    Runtimes,
    SessionStore,
    StaleSession,
    process_gone,
)

log = logging.getLogger("mnemo")
T = TypeVar("T")

HOST = socket.gethostname()
# A wait for another Memory's claims looks at the store's change token this often, and at
# least every `RECHECK` seconds regardless (a claimer that died writes nothing).
SETTLE_INTERVAL = 0.2
RECHECK = 1.0


@dataclass(eq=False)
class Sessions:
    """Every live session of one Memory, with the ports they use. `effects` starts what a move
    asks for (an `Effect`) in the session's tasks, and `answer_ended` answers what a session
    ended elsewhere owes: given, so that this module does not import their runners."""

    store: SessionStore
    coordination: Coordination
    graph: GraphStore
    events: Events
    repos: Runtimes
    lease: timedelta
    shortest_idle: float  # the shortest `idle_session_timeout` known: the idle sweep's wait
    effects: Callable[[Sessions, SessionRecord, Effect], None]
    answer_ended: Callable[[Sessions, SessionRecord], Awaitable[None]]
    # This Memory as a holder of work, recorded at its first claim, alive while it beats.
    holder_id: str = field(default_factory=lambda: f"holder_{uuid.uuid4().hex}")
    registered: anyio.Event = field(default_factory=anyio.Event)
    registering: anyio.Lock = field(default_factory=anyio.Lock)
    # Operations accepted here for work another Memory holds, by session, in order.
    remote: dict[str, list[tuple[str, str, Callback | None]]] = field(default_factory=dict)
    machine: Machine = field(default_factory=new_machine)
    by_id: dict[str, SessionRecord] = field(default_factory=dict)
    tg: TaskGroup | None = None
    closing: bool = False  # the Memory is closing: nothing more is stored for another Memory
    timer_wake: anyio.Event = field(default_factory=anyio.Event)
    timed: set[str] = field(default_factory=set)  # the auto-commit sessions (they have timers)
    idle_wake: anyio.Event = field(default_factory=anyio.Event)
    look: anyio.Event = field(default_factory=anyio.Event)  # set: the takeover task looks now
    passes: int = 0  # background loops' passes at the store under way (`timers.background_pass`)
    passes_end: anyio.Event | None = None  # closing: set once none is under way

    def lease_until(self) -> datetime:
        return self.coordination.now() + self.lease

    async def register(self) -> None:
        """Records this Memory as a holder, once, before its first claim."""
        if self.registered.is_set():
            return
        async with self.registering:
            if not self.registered.is_set():
                now = self.coordination.now()
                await self.coordination.register(
                    HolderInfo(self.holder_id, HOST, os.getpid(), now, now))
                self.registered.set()

    async def gone(self) -> list[str]:
        """The holders on this host, other than this one, whose process is gone."""
        return [h.id for h in await self.coordination.holders()
                if h.id != self.holder_id and h.host == HOST and process_gone(h.pid)]

    def add(
        self, session_id: str, repo: str, state: State, config: Config, override: Runtime | None
    ) -> SessionRecord:
        session = SessionRecord(session_id, repo, self.repos.get(repo), override, config)
        self.machine.add_model(session, initial=state)
        self.by_id[session_id] = session
        if config.idle_session_timeout < self.shortest_idle:  # the idle sweep looks that often
            self.shortest_idle = config.idle_session_timeout
            self.idle_wake.set()
        return session

    async def fetch(self, session_id: str, *, fresh: bool = False) -> SessionRecord:
        """The session's record, read from the store when unknown here, and, when `fresh`,
        read again if the store's version is newer; reads only. NotFoundError: no live session
        has this id; InvalidInputError: an id no store can hold."""
        session = self.by_id.get(check_id(session_id, "session_id"))
        if session is None:
            row = await self.store.load_one(session_id)
            if row is None:
                raise NotFoundError("session", session_id)
            await self.repos.learn(row.repo)  # opened through another Memory, maybe
            return self.by_id.get(session_id) or self.adopt(row)  # or another call's load
        if fresh:
            version = await self.store.version(session_id)
            # Versions only grow: an older one is a read that crossed a write here, not a move.
            moved = version is None or version > session.version
            # Not while this Memory holds the lock: the store may hold its own write under way
            # (looked at after the read: the write may have begun during it).
            if moved and not session.lock.locked():
                await self.reload(session)
        return session

    def adopt(self, row: LiveSession) -> SessionRecord:
        """A record for a session the store holds (restored, or started elsewhere)."""
        session = self.add(row.id, row.repo, row.state, row.config, None)
        session.recorded = True
        session.metadata = dict(row.metadata)
        session.last_activity = self.clock_of(row.active_at)
        self._take_row(session, row)
        return session

    def _take_row(self, session: SessionRecord, row: LiveSession) -> None:
        """The row in the record: driven only when the store names this Memory the holder; a
        moved row's `active_at` starts its idle time (an expiry keeps its `math.inf` mark)."""
        session.episode = row.episode
        session.changeset = row.changeset
        session.extraction_model = row.model
        session.version = row.version
        session.driven = row.holder is not None and row.holder == self.holder_id
        if row.active_at is None or row.active_at == session.active_at:
            return
        session.active_at = row.active_at
        if session.last_activity != math.inf:
            session.last_activity = max(session.last_activity, self.clock_of(row.active_at))

    def clock_of(self, moment: datetime | None) -> float:
        """A time from the store on the event loop's clock (`Coordination.now`); None: now."""
        ago = 0.0 if moment is None else (self.coordination.now() - moment).total_seconds()
        return anyio.current_time() - max(ago, 0.0)

    async def reload(self, session: SessionRecord, *, conflict: bool = False) -> None:
        """Reads the session again from the store, which another Memory changed. A row no
        newer than the record is left out (a read older than this Memory's own write), unless
        `conflict`: read under the lock after the store refused this version, so any version
        is the store's truth. NotFoundError: it ended meanwhile (what it owed: `session_ended`)."""
        row = await self.store.load_one(session.id)
        if row is None:
            await self.forget(session)
            raise NotFoundError("session", session.id)
        if row.version == session.version or (row.version < session.version and not conflict):
            return
        before = session.state
        if row.state is not before:
            self.machine.set_state(row.state, model=session)
        self._take_row(session, row)
        if row.state is not before:
            session.notify()

    async def forget(self, session: SessionRecord) -> None:
        """Drops a session the store no longer holds: its background work is cancelled, its
        id is unknown here, and what it owed is answered `session_ended`."""
        if session.ended:
            return
        session.ended = True
        self.by_id.pop(session.id, None)
        self.machine.remove_model(session)
        for scope in [*session.scopes, *session.waits]:
            scope.cancel()
        session.notify()
        # Shielded: the caller may be one of the session's own tasks, just cancelled.
        with anyio.CancelScope(shield=True):
            await self.answer_ended(self, session)

    def touch(self, session: SessionRecord) -> None:
        """Records activity; the timers of an auto-commit session this Memory drives look again
        (its deadline may be earlier; no other session has timers here to wake)."""
        session.last_activity = anyio.current_time()
        if session.driven:
            self.drive(session)

    def drive(self, session: SessionRecord) -> None:
        """This Memory drives the session's timers now (the store names it the holder)."""
        session.driven = True
        if session.config.auto_commit:
            self.timed.add(session.id)
            self.timer_wake.set()

    def spawn(
        self, session: SessionRecord, fn: Callable[..., Awaitable[None]], *args: Any,
        waiting: bool = False,
    ) -> None:
        """Starts `fn(*args)` in the background group, cancellable by `end_session`: work on
        the session (`session.scopes`), or, `waiting`, a wait on the store (`session.waits`).
        RuntimeError once the Memory has closed."""
        assert self.tg is not None, "the Memory is not open"
        scopes = session.waits if waiting else session.scopes
        # Counted from now, not from when the task first runs (in between, the session would
        # look extracted by another Memory); a cancel before it runs cancels it on entry.
        scope = anyio.CancelScope()
        scopes.add(scope)

        async def owned() -> None:
            working(self)  # a callback or handler it runs closes no Memory
            with scope:
                try:
                    await fn(*args)
                except Exception:
                    # One session's bug is logged: it must not take the group down.
                    log.exception("%s: background work crashed", session.id)
                finally:
                    scopes.discard(scope)

        try:
            self.tg.start_soon(owned)
        except RuntimeError:  # the group has ended (the Memory closed): nothing started
            scopes.discard(scope)
            raise


async def refuse_checked(live: Sessions, session: SessionRecord, event: str) -> None:
    """`refuse_unless` for append and start_episode: a refusal is final, so it is checked
    against the store first (read under the session's lock, taken in only when newer)."""
    try:
        refuse_unless(session, event)
    except SessionError:
        async with session.lock:
            await live.reload(session)
        refuse_unless(session, event)


async def append(
    live: Sessions, session_id: str, observation: str, action: str,
    metadata: dict[str, Any] | None,
) -> StepInfo:
    session = await live.fetch(session_id)
    check_step(observation, action, metadata, limit=session.config.max_text_chars)
    await refuse_checked(live, session, "append")
    session.appends_in_flight += 1
    ticket = session.ticket_queue.take()
    try:
        return await run_append(live, session, ticket, observation, action, metadata)
    finally:
        session.appends_in_flight -= 1
        session.notify()  # an expiry waits for appends to end (`timers._working`)


async def run_append(
    live: Sessions, session: SessionRecord, ticket: int, observation: str, action: str,
    metadata: dict[str, Any] | None, op: Op | None = None,
) -> StepInfo:
    """Stores the step at `ticket`'s turn (appends run one at a time, in call order; `op.applied`
    while it stays stored) and annotates it: returns once annotated, or `append_timeout` after."""
    await session.ticket_queue.wait(ticket)
    try:
        stored, episode_id = await _store(live, session, observation, action, metadata)
        if op is not None:
            op.applied = True
        with anyio.move_on_after(session.runtime.config.append_timeout):
            while True:
                changed = session.changed
                now = session.step_at(episode_id, stored.index)
                if now is None or now.annotated or not session.annotating:
                    break
                await changed.wait()
        await _unless_failed(live, session, episode_id, stored, op)
    finally:
        session.ticket_queue.leave(ticket)
        live.touch(session)  # activity until it returns: an expiry finds it used
    info = StepInfo(stored.index, None, None, annotated=False)
    now = session.step_at(episode_id, stored.index)
    if now is not None and now.annotated:
        before = session.step_at(episode_id, stored.index - 1) if stored.index else None
        boundary = before is not None and before.trajectory_id != now.trajectory_id
        info = StepInfo(stored.index, now.trajectory_id, boundary)
    await live.events.emit("step_appended", session_id=session.id, repo=session.repo,
                           index=info.index, trajectory_id=info.trajectory_id,
                           boundary_detected=info.boundary_detected, annotated=info.annotated)
    return info


async def _unless_failed(live: Sessions, session: SessionRecord, episode_id: str,
                         step: StepRecord, op: Op | None) -> None:
    """Raises the model's failure that ended the annotation while `step`'s append waited, once
    `step` is removed, `op` unapplied (kept, to be annotated later: not the last, not removed)."""
    if (failure := session.model_failure(step.id)) is None:
        return
    async with session.lock:
        episode, now = session.episode, session.step_at(episode_id, step.index)
        if episode is None or now is None or now.annotated or episode.steps[-1] is not now:
            return
        try:
            with anyio.CancelScope(shield=True):  # a close must know whether it went
                version = await live.store.remove_step(session.id, episode_id, step.id)
        except StorageError as exc:
            log.warning("%s: a step the model failed on is kept: %r", session.id, exc)
            return
        if version is None:
            return
        if op is not None:
            op.applied = False
        session.advance(version)
        episode.steps.pop()  # unheld: the failed run let its claims go
    raise failure


async def _store(
    live: Sessions, session: SessionRecord, observation: str, action: str,
    metadata: dict[str, Any] | None,
) -> tuple[StepRecord, str]:
    """Stores the step (claimed for its annotation) and starts the annotation. When another
    Memory moved the session meanwhile (nothing written), the step goes to the episode as the
    store now holds it, or is refused."""
    # The store's state once this append's turn came: a move during it is `not_collecting`.
    await live.fetch(session.id, fresh=True)
    moved = False
    while True:
        if moved and not session.ended and session.state is not State.COLLECTING:
            raise SessionError("not_collecting", state=session.state, session_id=session.id)
        refuse_unless(session, "append")
        session.runtime.check_usable(session.repo)
        await live.register()  # a claim lasts while its holder is recorded
        async with session.lock:
            refuse_unless(session, "append")
            episode = session.episode
            assert episode is not None, "a collecting session has an episode"
            index = len(episode.steps)
            step = StepRecord(f"{episode.id}:{index}", index, "", observation, action, "", "",
                              NO_VECTOR, metadata=metadata)
            try:
                session.version = await live.store.add_step(
                    session.id, episode.id, step, version=session.version,
                    holder=live.holder_id,
                )
            except StaleSession:
                await live.reload(session, conflict=True)
                moved = True
                continue
            session.held.add(step.id)
            episode.steps.append(step)
            # Started at once: a cancelled append leaves no stored step nobody annotates.
            annotate(live, session)
            return step, episode.id


def annotate(live: Sessions, session: SessionRecord) -> None:
    """Starts the annotation of the open episode's stored steps (one task a session; none once
    the Memory closed: the next one on the store annotates them)."""
    if not session.annotating:
        session.annotating = True
        try:
            live.spawn(session, annotation, live, session)
        except RuntimeError:
            session.annotating = False


async def annotation(live: Sessions, session: SessionRecord) -> None:
    """Annotates the stored steps in order until none is left: a step another live Memory
    holds is waited for, one whose holder is gone is taken over."""
    step: StepRecord | None = None
    try:
        while session.state in (State.COLLECTING, State.EXTRACTING) and not session.ended:
            episode, pending = session.episode, session.unannotated()
            if episode is None or not pending:
                break
            step = pending[0]
            if step.id in session.held:
                await _annotate(live, session, episode, step)
                continue
            token = await live.coordination.change_token()
            mine = await claim(live, session, [step])
            if not mine:
                await store_moved(live, token)  # another Memory's annotation of it
            async with session.lock:
                await live.reload(session)  # annotated meanwhile, by the claim's last holder?
            now = session.step_at(episode.id, step.index)
            if mine and (now is None or now.annotated):
                await release(live, session, mine)
            elif mine:
                session.held.add(step.id)
        session.annotation_failure = None
    except NotFoundError:
        pass  # ended through another Memory: nothing is left to annotate
    except Exception as exc:
        log.warning("%s: a step's annotation failed: %r", session.id, exc)
        session.annotation_failure = exc
        session.failed_step = None if step is None else step.id
        held = [s for s in session.unannotated() if s.id in session.held]
        session.held.clear()
        await release(live, session, held)
    finally:
        session.annotating = False
        session.notify()


async def _annotate(
    live: Sessions, session: SessionRecord, episode: EpisodeRecord, step: StepRecord
) -> None:
    """Annotates one stored step (within `append_timeout + extraction_timeout`) and writes it
    with the previous step's reward."""
    runtime = session.runtime
    previous = episode.steps[step.index - 1] if step.index else None
    done, reward = await annotate_step(
        lambda: live.repos.limits.llm_for(runtime.llm, runtime.config, session.repo,
                                          session.id), runtime.embedder,
        runtime.config, episode.goal, step, episode.steps[:step.index],
        new_trajectory=f"trajectory_{uuid.uuid4().hex}", name=f"{session.id} step {step.index}",
    )
    boundary = previous is not None and done.trajectory_id != previous.trajectory_id
    scored = None if previous is None else replace(previous, reward=reward)
    async with session.lock:
        version = await live.store.annotate_step(session.id, episode.id, done, scored,
                                                 holder=live.holder_id)
        session.held.discard(step.id)
        here = session.step_at(episode.id, step.index)
        if version is None or here is None:
            # Annotated by another Memory, or the episode moved on: the store says how.
            await live.reload(session, conflict=True)
        else:
            session.advance(version)
            for name in ("trajectory_id", "state_summary", "subgoal", "subgoal_vec"):
                setattr(here, name, getattr(done, name))
            before = session.step_at(episode.id, step.index - 1) if step.index else None
            if before is not None:
                before.reward = reward
    session.notify()
    if boundary and session.config.auto_commit and (ready := session.finished_steps()):
        live.effects(live, session, CommitSteps(ready))


async def claim(
    live: Sessions, session: SessionRecord, steps: Sequence[StepRecord]
) -> list[StepRecord]:
    """The steps among `steps` this Memory holds for its extraction now (those another live
    holder claims are left to it); StorageError: the store could not be written."""
    if not steps:
        return []
    ids = [s.id for s in steps]
    granted = await claimed(live, lambda cut, gone: live.coordination.claim_steps(
        session.id, ids, live.holder_id, unseen_since=cut, gone=gone),
        lambda granted: len(granted) == len(ids))
    return [s for s in steps if s.id in granted]


async def claimed(live: Sessions, attempt: Callable[[datetime, Sequence[str]], Awaitable[T]],
                  enough: Callable[[T], bool]) -> T:
    """`attempt(unseen_since, gone)` of a claim for this Memory (registered first); when not
    `enough`, again with this host's holders whose process is gone (only then worth reading)."""
    await live.register()
    cut = live.coordination.now() - live.lease
    result = await attempt(cut, ())
    if not enough(result) and (gone := await live.gone()):
        result = await attempt(cut, gone)
    return result


async def release(live: Sessions, session: SessionRecord, steps: Sequence[StepRecord]) -> None:
    """Gives up this Memory's claims on `steps` (best effort: a kept claim lapses at close)."""
    if not steps:
        return
    try:
        await live.coordination.release_steps(session.id, live.holder_id,
                                              [s.id for s in steps])
    except StorageError as exc:
        log.warning("%s: its claim on %d steps is kept: %r", session.id, len(steps), exc)


async def store_moved(live: Sessions, token: int) -> None:
    """Returns once the store's change token is no longer `token` (polled every
    `SETTLE_INTERVAL`), or after `RECHECK` seconds; StorageError if it cannot be read."""
    for _ in range(math.ceil(RECHECK / SETTLE_INTERVAL)):
        await anyio.sleep(SETTLE_INTERVAL)
        if await live.coordination.change_token() != token:
            return
