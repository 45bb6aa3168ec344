"""`Sessions`: what the session modules share: the live sessions of one Memory, the ports they
work through, this Memory as a holder of background work, and the task group their work runs
in; and the step claims that say which Memory extracts which steps.

Step claims (`Coordination.claim_steps`): a boundary's background commit, a flush and a close
each claim the uncommitted steps they are about to extract; what another live holder claimed
is left to it, so that no model is asked about a step twice. A claim lasts until the step is
committed, the claimer gives it up, or the claimer leaves. A close first waits for the claims
of others (`settle`), at most an extraction's time limit, then extracts what is still open
itself (the graph still takes each step once: `StepsCommitted`).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import anyio
from anyio.abc import TaskGroup

from mnemo.config import Config
from mnemo.episode import StepRecord
from mnemo.errors import NotFoundError, StorageError
from mnemo.graph.ports import GraphStore
from mnemo.inputs import check_id
from mnemo.ports import LLM, Events
from mnemo.session.machine import Callback, Effect, Runtime, SessionRecord, State, new_machine
from mnemo.session.ports import Coordination, HolderInfo, LiveSession, SessionStore

log = logging.getLogger("mnemo")

HOST = socket.gethostname()
# How often a wait for work another Memory holds looks at the store's change token.
POLL_INTERVAL = 0.05
# A wait for another Memory's claims looks at the store's change token this often, and
# again at least every `RECHECK` seconds though it has not moved: a claimer that died writes
# nothing, its claims lapse.
SETTLE_INTERVAL = 0.2
RECHECK = 1.0


class Sessions:
    """Every live session of one Memory, with the store, graph, events and LLMs they use."""

    def __init__(
        self,
        *,
        store: SessionStore,
        coordination: Coordination,
        graph: GraphStore,
        events: Events,
        repo_runtime: Callable[[str], Runtime],
        llm_for: Callable[[Runtime, str, str | None], LLM],
        learn_repo: Callable[[str], Awaitable[None]],
        refresh_repo: Callable[[str, int], Awaitable[Runtime]],
        lease_timeout: float,
        idle_timeout: float,
        effects: Callable[[Sessions, SessionRecord, Effect], None],
        answer_ended: Callable[[Sessions, SessionRecord], Awaitable[None]],
    ) -> None:
        self.store = store
        self.coordination = coordination
        self.graph = graph
        self.events = events
        self.repo_runtime = repo_runtime
        self.llm_for = llm_for
        self.learn_repo = learn_repo
        # Brings a repo's runtime up to its record when another Memory re-embedded it
        # (`Repos.refresh`): a commit of work embedded before then embeds it again.
        self.refresh_repo = refresh_repo
        # Starts what a move asks for (an `Effect`) in the session's own tasks, and answers
        # what a session ended elsewhere still owes: given at construction, so that the
        # machine's moves name their effects without importing what runs them.
        self._effects = effects
        self._answer_ended = answer_ended
        # This Memory as a holder of background work (`Coordination.register`): recorded at
        # its first claim, alive while its heartbeat renews its leases (`timers.beat`).
        self.holder_id = f"holder_{uuid.uuid4().hex}"
        self.lease = timedelta(seconds=lease_timeout)
        self.registered = anyio.Event()
        self._registering = anyio.Lock()
        # Operations this Memory accepted and stored for work another Memory holds, by
        # session: (op id, kind, callback), in the order accepted.
        self.remote: dict[str, list[tuple[str, str, Callback | None]]] = {}
        self.machine = new_machine()
        self.by_id: dict[str, SessionRecord] = {}
        self.tg: TaskGroup | None = None
        # The Memory is closing: its tasks have ended, and what it owed is being answered;
        # nothing more is stored for another Memory.
        self.closing = False
        self.timer_wake = anyio.Event()
        self.timed: set[str] = set()  # ids of auto-commit sessions, the only ones with timers
        # The shortest `Config.idle_session_timeout` of this Memory and the sessions it knows:
        # the most the idle sweep waits before it looks at the store again.
        self.shortest_idle = idle_timeout
        self.idle_wake = anyio.Event()
        self.look = anyio.Event()  # set: the takeover task looks for work now

    def start(self, session: SessionRecord, effect: Effect) -> None:
        """Starts `effect` for `session` in the background work's group (cancelled with it)."""
        self._effects(self, session, effect)

    def lease_until(self) -> datetime:
        return self.coordination.now() + self.lease

    async def register(self) -> None:
        """Records this Memory as a holder, once (before its first claim): a Memory that
        only reads writes nothing."""
        if self.registered.is_set():
            return
        async with self._registering:
            if not self.registered.is_set():
                now = self.coordination.now()
                await self.coordination.register(
                    HolderInfo(self.holder_id, HOST, os.getpid(), now, now))
                self.registered.set()

    async def gone(self) -> list[str]:
        """The holders on this host, other than this one, whose process is gone."""
        return [h.id for h in await self.coordination.holders()
                if h.id != self.holder_id and h.host == HOST and not _alive(h.pid)]

    def add(
        self, session_id: str, repo: str, state: State, config: Config, override: Runtime | None
    ) -> SessionRecord:
        session = SessionRecord(session_id, repo, self.repo_runtime(repo), override, config)
        self.machine.add_model(session, initial=state)
        self.by_id[session_id] = session
        self.idle_within(config.idle_session_timeout)
        return session

    def idle_within(self, seconds: float) -> None:
        """An idle session may come due `seconds` after its last change: the idle sweep looks
        at the store at least that often."""
        if seconds < self.shortest_idle:
            self.shortest_idle = seconds
            self.idle_wake.set()

    async def fetch(self, session_id: str, *, fresh: bool = False) -> SessionRecord:
        """The session's record, read from the store when this Memory does not know it yet
        (another Memory started it), and, when `fresh`, read again if the store's version is
        newer (another Memory moved it). Reads only: loading starts no work.

        Raises:
            NotFoundError: no live session has this id.
            InvalidInputError: an id that is no session id: not a string, or one no store
                can hold (blank, NUL, a lone surrogate).
        """
        session = self.by_id.get(check_id(session_id, "session_id"))
        if session is None:
            row = await self.store.load_one(session_id)
            if row is None:
                raise NotFoundError("session", session_id)
            await self.learn_repo(row.repo)  # opened through another Memory, maybe
            session = self.by_id.get(session_id)  # loaded meanwhile by another call
            if session is None:
                session = self.adopt(row)
            return session
        if fresh:
            version = await self.store.version(session_id)
            # Versions only grow: an older one is a read that began before a write here and
            # answered after it, not a move.
            moved = version is None or version > session.version
            # Not while this Memory holds the session's lock: it is writing the session, and
            # what the store holds may be that very write, which the move ends with (taken
            # in half-way, the session looked extracted by another Memory, or its move lost
            # its event). Looked at after the read: the write may have begun during it.
            if moved and not session.lock.locked():
                await self.reload(session)
        return session

    def restore(self, rows: list[LiveSession]) -> None:
        """Knows the sessions a store holds that had not ended. An extraction among them goes
        on when it is nobody's any more and this Memory's model for its repo is the one it
        started with (`timers.take_over`: the API contract, work is resumed only by a
        matching model)."""
        for row in rows:
            if row.id not in self.by_id:  # the takeover task may have taken it already
                self.adopt(row)
        self.look.set()

    def adopt(self, row: LiveSession) -> SessionRecord:
        """A record for a session the store holds (restored, or started elsewhere)."""
        session = self.add(row.id, row.repo, row.state, row.config, None)
        session.recorded = True
        session.metadata = dict(row.metadata)
        # Idle since its last use as stored, or, for a row without one, since now.
        session.last_activity = self.clock_of(row.active_at)
        self._take_row(session, row)
        return session

    def _take_row(self, session: SessionRecord, row: LiveSession) -> None:
        """The row's episode, changeset, model and version in the record; the session is this
        Memory's to drive only when the store names it the holder; and the store's time of
        its last use, when it moved, starts its idle time (an expiry under way keeps its
        `math.inf` mark, and sees the move through `active_at`)."""
        session.episode = row.episode
        session.changeset = row.changeset
        session.extraction_model = row.model
        session.version = row.version
        session.driven = row.holder is not None and row.holder == self.holder_id
        if row.active_at is None or row.active_at == session.active_at:
            return
        session.active_at = row.active_at
        if session.last_activity == math.inf:
            return
        session.last_activity = max(session.last_activity, self.clock_of(row.active_at))

    def clock_of(self, moment: datetime | None) -> float:
        """A time from the store on the event loop's clock, by the store's clock
        (`Coordination.now`); None: now."""
        now = anyio.current_time()
        if moment is None:
            return now
        return now - max((self.coordination.now() - moment).total_seconds(), 0.0)

    async def reload(self, session: SessionRecord, *, conflict: bool = False) -> None:
        """Reads the session again from the store, which another Memory changed.

        A row no newer than the record is left out: a read that began before this Memory's
        own write and answered after it (PostgreSQL's connections answer in any order), taken
        in, put the session back where it was. `conflict`: read under the session's lock after
        the store refused a write of the record's version, so no write of this Memory is under
        way: any other version is the store's truth, an older one too.

        Raises:
            NotFoundError: it ended meanwhile (its record goes too, and what it owed is
                answered `session_ended`).
        """
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

    async def end(self, session: SessionRecord, *, version: int | None = None) -> None:
        """Ends the session in the store (given `version`, only while it is still at it,
        else `StaleSession`: nothing changes), then here (`forget`)."""
        await self.store.end(session.id, version=version)
        await self.forget(session)

    async def forget(self, session: SessionRecord) -> None:
        """Drops a session the store no longer holds (ended by a call, another Memory, or the
        idle sweep): its background work is cancelled, its id is unknown here, and what it
        owed is answered `session_ended`."""
        if session.ended:
            return
        session.ended = True
        self.by_id.pop(session.id, None)
        self.machine.remove_model(session)
        for scope in [*session.scopes, *session.waits]:
            scope.cancel()
        session.notify()
        # Shielded: the caller may be one of the session's own tasks (its expiry, an
        # operation whose callback ends it), just cancelled, and the callbacks are owed.
        with anyio.CancelScope(shield=True):
            await self._answer_ended(self, session)

    async def wait_moved(self, session: SessionRecord) -> None:
        """Waits until the session may have moved: its event here, or, while another Memory
        extracts it, a change in the store (the change token, looked at every
        `POLL_INTERVAL` seconds; the session is then read again)."""
        event = session.changed  # taken before any await: a notify from now on wakes us
        if session.scopes or session.state is not State.EXTRACTING:
            await event.wait()
            return
        token = await self.coordination.change_token()
        # The session is read again after the token is taken: a change between the caller's
        # read and the token (the other Memory's extraction ending) is seen here, and any
        # later one moves the token, so it is not left for the next write by anyone.
        await self.fetch(session.id, fresh=True)
        if event.is_set() or session.state is not State.EXTRACTING:
            return
        while True:
            with anyio.move_on_after(POLL_INTERVAL):
                await event.wait()
                return
            if session.scopes or session.state is not State.EXTRACTING:
                return  # its work runs here now, or it moved while we looked at the store
            current = await self.coordination.change_token()
            if current != token:
                await self.fetch(session.id, fresh=True)
                return

    def touch(self, session: SessionRecord) -> None:
        """Records activity; an auto-commit session this Memory drives may now have an earlier
        deadline (a first uncommitted step starts its flush clock), so the timers look again.
        Other sessions have no timers here: waking for them cost every append a scan of every
        session, and one another Memory drives is timed there (from the store's `active_at`,
        which this activity moved)."""
        session.last_activity = anyio.current_time()
        if session.driven:
            self.drive(session)

    def drive(self, session: SessionRecord) -> None:
        """This Memory drives the session's timers now (the store names it the holder)."""
        session.driven = True
        if session.config.auto_commit:
            self.timed.add(session.id)
            self.timer_wake.set()

    async def claim(self, session: SessionRecord) -> bool:
        """Holds the session's background work and drives its timers: a compare-and-set on
        the version the record holds; False when another Memory moved the session first."""
        await self.register()
        version = await self.coordination.claim(
            session.id, version=session.version, holder_id=self.holder_id,
            lease_until=self.lease_until(),
        )
        if version is None:
            return False
        session.version = version
        self.drive(session)
        return True

    def spawn(
        self, session: SessionRecord, fn: Callable[..., Awaitable[None]], *args: Any,
        waiting: bool = False,
    ) -> None:
        """Starts `fn(*args)` in the background work's group, cancellable by `end_session`:
        work on the session (`session.scopes`), or, `waiting`, a task that only waits on the store
        (`session.waits`).

        Raises:
            RuntimeError: the Memory has closed (its group starts no new task).
        """
        assert self.tg is not None, "the Memory is not open"
        scopes = session.waits if waiting else session.scopes
        # Counted from now, not from when the task first runs: in between, a session
        # extracting here looked extracted by another Memory, and an operation submitted
        # right behind a `close_async` went to the store's queue, ahead of the local one.
        # A cancel before the task runs cancels it as soon as it enters the scope.
        scope = anyio.CancelScope()
        scopes.add(scope)

        async def owned() -> None:
            with scope:
                try:
                    await fn(*args)
                except Exception:
                    # A bug in one session's work must not take every session down with the
                    # task group: it is logged, and the session stays in its persisted state.
                    log.exception("%s: background work crashed", session.id)
                finally:
                    scopes.discard(scope)

        try:
            self.tg.start_soon(owned)
        except RuntimeError:  # the group has ended (the Memory closed): nothing started
            scopes.discard(scope)
            raise


async def claim(
    live: Sessions, session: SessionRecord, steps: Sequence[StepRecord]
) -> list[StepRecord]:
    """The steps among `steps` this Memory holds for its extraction now
    (`Coordination.claim_steps`): those another live holder claims are left to it; one that
    left (closed, unseen for a lease, or its process gone from this host) has left its claims.

    Raises:
        StorageError: the store could not be written.
    """
    if not steps:
        return []
    await live.register()
    ids, co = [s.id for s in steps], live.coordination
    cut = co.now() - live.lease
    granted = await co.claim_steps(session.id, ids, live.holder_id, unseen_since=cut)
    if len(granted) < len(ids):
        # Only then is the read of the holders worth it: one whose process is gone from
        # this host has left its claims already, not a lease from now.
        gone = await live.gone()
        if gone:
            granted = await co.claim_steps(session.id, ids, live.holder_id, unseen_since=cut,
                                           gone=gone)
    return [s for s in steps if s.id in granted]


async def claim_or_all(
    live: Sessions, session: SessionRecord, steps: Sequence[StepRecord]
) -> list[StepRecord]:
    """`claim`, but a store that refuses the claim (busy, away) yields all of `steps`: the
    extraction goes on as it did before claims, at worst doing another Memory's work again,
    rather than failing for a write that only saves work (the commit's own write reports a
    store that stays away)."""
    try:
        return await claim(live, session, steps)
    except StorageError as exc:
        log.warning("%s: could not claim %d steps, extracting them unclaimed: %r", session.id,
                    len(steps), exc)
        return list(steps)


async def release(live: Sessions, session: SessionRecord, steps: Sequence[StepRecord]) -> None:
    """Gives up this Memory's claims on `steps` (best effort: a claim the store keeps lapses
    when this Memory closes, and this Memory may claim it again meanwhile)."""
    if not steps:
        return
    try:
        await live.coordination.release_steps(session.id, live.holder_id,
                                              [s.id for s in steps])
    except StorageError as exc:
        log.warning("%s: could not give up its claim on %d steps: %r", session.id, len(steps),
                    exc)


async def settle(
    live: Sessions, session: SessionRecord, steps: Sequence[StepRecord], *, within: float
) -> None:
    """Waits until each of `steps` (claimed by other holders) is committed, or claimed by
    this Memory (its claimer gave it up or left), at most `within` seconds. The steps'
    `committed_in` is read from the store. A storage fault is logged, and looked past.

    Raises:
        NotFoundError: the session ended meanwhile (through another Memory).
    """
    open_steps = list(steps)
    co = live.coordination
    with anyio.move_on_after(within):
        while True:
            # Taken before the look: a commit or a release landing during it moves the token,
            # and is looked at again at once.
            try:
                token = await co.change_token()
                lease = await co.lease(session.id)
                if lease is None or lease.ended:
                    # Ended through another Memory: nothing is left to wait for or extract.
                    raise NotFoundError("session", session.id)
                await take_commits(live, session)
                open_steps = [s for s in open_steps if s.committed_in is None]
                mine = {s.id for s in await claim(live, session, open_steps)}
                open_steps = [s for s in open_steps if s.id not in mine]
                if not open_steps:
                    return
                await store_moved(live, token)
            except StorageError as exc:
                # Busy, or away for a moment: the wait goes on, and looks again.
                log.warning("%s: could not look at the claims of others: %r", session.id, exc)
                await anyio.sleep(RECHECK)
    log.warning("%s: %d steps still claimed by another Memory after %.0f s: extracted here",
                session.id, len(open_steps), within)


async def store_moved(live: Sessions, token: int) -> None:
    """Returns once the store's change token is no longer `token` (looked at every
    `SETTLE_INTERVAL` seconds), or after `RECHECK` seconds: a claimer that died writes nothing.

    Raises:
        StorageError: the store could not be read.
    """
    waited = 0.0
    while waited < RECHECK:
        await anyio.sleep(SETTLE_INTERVAL)
        waited += SETTLE_INTERVAL
        if await live.coordination.change_token() != token:
            return


async def take_commits(live: Sessions, session: SessionRecord) -> None:
    """Marks the episode's steps with the changesets the store says committed them: another
    Memory's background commit moves no version, so a reload does not see it.

    Raises:
        StorageError: the store could not be read.
    """
    episode = session.episode
    stored = None if episode is None else await live.store.episode(episode.id)
    if episode is None or stored is None:
        return
    committed = {s.id: s.committed_in for s in stored.steps}
    for step in episode.steps:
        step.committed_in = committed.get(step.id) or step.committed_in


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
