"""`Sessions`: what the session modules share (the live sessions of one Memory, their ports,
this Memory as a holder of background work, the task group), and the step claims that say which
Memory extracts which steps: what another live holder claimed is left to it, and a close first
waits for others' claims (`settle`) before extracting what is still open itself.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from functools import partial
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
# A wait for another Memory's claims looks at the store's change token this often, and at
# least every `RECHECK` seconds regardless (a claimer that died writes nothing).
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
        # Brings a repo's runtime up to its record after another Memory re-embedded it.
        self.refresh_repo = refresh_repo
        # `start(session, effect)` starts what a move asks for (an `Effect`) in the session's
        # tasks, in the background work's group; `_answer_ended` answers what a session ended
        # elsewhere owes (given here, so the machine does not import its runner).
        self.start: Callable[[SessionRecord, Effect], None] = partial(effects, self)
        self._answer_ended = answer_ended
        # This Memory as a holder of background work, recorded at its first claim, alive while
        # its heartbeat renews its leases.
        self.holder_id = f"holder_{uuid.uuid4().hex}"
        self.lease = timedelta(seconds=lease_timeout)
        self.registered = anyio.Event()
        self._registering = anyio.Lock()
        # Operations accepted here for work another Memory holds, by session, in order.
        self.remote: dict[str, list[tuple[str, str, Callback | None]]] = {}
        self.machine = new_machine()
        self.by_id: dict[str, SessionRecord] = {}
        self.tg: TaskGroup | None = None
        # The Memory is closing: nothing more is stored for another Memory.
        self.closing = False
        self.timer_wake = anyio.Event()
        self.timed: set[str] = set()  # ids of auto-commit sessions, the only ones with timers
        # The shortest `idle_session_timeout` known: the most the idle sweep waits.
        self.shortest_idle = idle_timeout
        self.idle_wake = anyio.Event()
        self.look = anyio.Event()  # set: the takeover task looks for work now

    def lease_until(self) -> datetime:
        return self.coordination.now() + self.lease

    async def register(self) -> None:
        """Records this Memory as a holder, once, before its first claim."""
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
        at least that often."""
        if seconds < self.shortest_idle:
            self.shortest_idle = seconds
            self.idle_wake.set()

    async def fetch(self, session_id: str, *, fresh: bool = False) -> SessionRecord:
        """The session's record, read from the store when unknown here, and, when `fresh`,
        read again if the store's version is newer; reads only. NotFoundError: no live session
        has this id; InvalidInputError: an id no store can hold."""
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
            # Not while this Memory holds the session's lock: what the store holds may be its
            # own write under way, which the move ends with. Looked at after the read: the
            # write may have begun during it.
            if moved and not session.lock.locked():
                await self.reload(session)
        return session

    def restore(self, rows: list[LiveSession]) -> None:
        """Knows the sessions a store holds that had not ended. An extraction among them goes
        on when it is nobody's and this Memory's model for its repo is the one it started with."""
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
        Memory's to drive only when the store names it the holder; a moved row's `active_at`
        starts its idle time (an expiry under way keeps its `math.inf` mark)."""
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
        """A time from the store on the event loop's clock (`Coordination.now`); None: now."""
        now = anyio.current_time()
        if moment is None:
            return now
        return now - max((self.coordination.now() - moment).total_seconds(), 0.0)

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

    async def end(self, session: SessionRecord, *, version: int | None = None) -> None:
        """Ends the session in the store (given `version`, only while it is still at it,
        else `StaleSession`: nothing changes), then here (`forget`)."""
        await self.store.end(session.id, version=version)
        await self.forget(session)

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
            await self._answer_ended(self, session)

    async def wait_moved(self, session: SessionRecord) -> None:
        """Waits until the session may have moved: its event here, or, while another Memory
        extracts it, a change of the store's change token (polled every `POLL_INTERVAL`)."""
        event = session.changed  # taken before any await: a notify from now on wakes us
        if session.scopes or session.state is not State.EXTRACTING:
            await event.wait()
            return
        token = await self.coordination.change_token()
        # Read again after the token is taken: a change in between is seen here, and a later
        # one moves the token.
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
        deadline, so its timers look again (other sessions have no timers here: waking for
        them would scan every session at each append)."""
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
        """Holds the session's background work and drives its timers (compare-and-set on the
        record's version); False when another Memory moved the session first."""
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
            with scope:
                try:
                    await fn(*args)
                except Exception:
                    # A bug in one session's work is logged; it must not take every session
                    # down with the group.
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
    """The steps among `steps` this Memory holds for its extraction now: those another live
    holder claims are left to it (one that left has left its claims). StorageError: the store
    could not be written."""
    if not steps:
        return []
    await live.register()
    ids, co = [s.id for s in steps], live.coordination
    cut = co.now() - live.lease
    granted = await co.claim_steps(session.id, ids, live.holder_id, unseen_since=cut)
    if len(granted) < len(ids):
        # Only then is the read of the holders worth it (a gone process's claims lapse).
        gone = await live.gone()
        if gone:
            granted = await co.claim_steps(session.id, ids, live.holder_id, unseen_since=cut,
                                           gone=gone)
    return [s for s in steps if s.id in granted]


async def claim_or_all(
    live: Sessions, session: SessionRecord, steps: Sequence[StepRecord]
) -> list[StepRecord]:
    """`claim`, but a store that refuses the claim yields all of `steps`: at worst another
    Memory's work is done again, rather than failing for a write that only saves work."""
    try:
        return await claim(live, session, steps)
    except StorageError as exc:
        log.warning("%s: could not claim %d steps, extracting them unclaimed: %r", session.id,
                    len(steps), exc)
        return list(steps)


async def release(live: Sessions, session: SessionRecord, steps: Sequence[StepRecord]) -> None:
    """Gives up this Memory's claims on `steps` (best effort: a kept claim lapses at close)."""
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
    """Waits until each of `steps` (claimed by others) is committed or claimed by this Memory,
    at most `within` seconds; a storage fault is logged and looked past. NotFoundError: the
    session ended meanwhile."""
    open_steps = list(steps)
    co = live.coordination
    with anyio.move_on_after(within):
        while True:
            # Taken before the look: a change during it moves the token.
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
    """Returns once the store's change token is no longer `token` (polled every
    `SETTLE_INTERVAL`), or after `RECHECK` seconds; StorageError if it cannot be read."""
    waited = 0.0
    while waited < RECHECK:
        await anyio.sleep(SETTLE_INTERVAL)
        waited += SETTLE_INTERVAL
        if await live.coordination.change_token() != token:
            return


async def take_commits(live: Sessions, session: SessionRecord) -> None:
    """Marks the episode's steps with the changesets the store says committed them (another
    Memory's background commit moves no version); StorageError if it cannot be read."""
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
