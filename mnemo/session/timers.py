"""The background loops of one Memory's sessions: auto-commit's timers (`run`: flushes after
`Config.flush_timeout`, expiry after `Config.session_timeout`), only for the sessions this Memory
holds, from their last use as the store knows it; the sweep of sessions idle past
`Config.idle_session_timeout`; the holder's heartbeat and takeover (`holder`). Every due
deadline is checked against the store, and every move is a compare-and-set on the version."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import anyio

from mnemo.errors import MnemoError, NotFoundError, SessionError, StorageError
from mnemo.session import extracting, operations, registry, transitions
from mnemo.session.machine import (
    CommitSteps,
    OpResult,
    SessionRecord,
    State,
    current_state,
    deliver,
    refuse_close,
    working,
    working_for,
)
from mnemo.session.ports import LiveSession, StaleSession
from mnemo.session.registry import Sessions

log = logging.getLogger("mnemo")

# A holder not seen for this long (and for a lease at least) is gone for good: what it took
# for a closed Memory is forgotten.
ORPHAN_GRACE = timedelta(hours=1)

# Seconds before a deadline is looked at again when the store could not be read.
STORE_RETRY = 1.0
# The most idle sessions one sweep ends; more are swept in rounds.
SWEEP_LIMIT = 100


class BackgroundWork:
    """The task group that hosts one Memory's background work: the loops below and every
    session's own tasks. It runs in a dedicated asyncio task, since a task group must be left
    by the task that entered it, and a framework may close a Memory from another task."""

    def __init__(self, live: Sessions) -> None:
        self.live = live
        self._host: asyncio.Task[None] | None = None
        self._stop = anyio.Event()

    async def start(self, restored: list[LiveSession]) -> None:
        """Starts the work with the sessions a store holds that had not ended; returns once
        it runs (raising what the work raised before)."""
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stop = anyio.Event()
        self.live.passes_end = None

        async def host() -> None:
            working(self.live)
            try:
                async with anyio.create_task_group() as tg:
                    await tg.start(self._run)
                    started.set_result(None)
                    await self._stop.wait()
                    self.live.passes_end = anyio.Event()
                    if self.live.passes:  # the passes under way run on, 2 seconds at most
                        with anyio.move_on_after(2.0):
                            await self.live.passes_end.wait()
                    tg.cancel_scope.cancel()
            except BaseException as exc:
                if not started.done():
                    started.set_exception(exc)
                    return
                raise

        self._host = asyncio.get_running_loop().create_task(host(), name="mnemo-host")
        await started
        for row in restored:
            if row.id not in self.live.by_id:  # the takeover task may have taken it already
                self.live.adopt(row)
        self.live.look.set()

    def hosts_this_task(self) -> bool:
        """Whether the running task is part of this work (an operation's callback, an event
        handler): a stop from it would wait for itself."""
        return self._host is not None and working_for(self.live)

    async def stop(self) -> bool:
        """Cancels the work and waits until it is gone; False when it was not running."""
        task, self._host = self._host, None
        if task is None:
            return False
        self.live.closing = True  # from now on nothing is stored for another Memory
        self._stop.set()
        with anyio.CancelScope(shield=True):
            await asyncio.wait({task})
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
        return True

    async def _run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        live = self.live
        try:
            async with anyio.create_task_group() as tg:
                live.tg = tg
                tg.start_soon(run, live)
                tg.start_soon(sweep, live)
                await tg.start(holder, live)
                task_status.started()
                await anyio.sleep_forever()
        finally:
            # Every accepted operation gets its callback, even when the Memory closes first
            # (one being stored for another Memory is waited for).
            live.closing = True
            with anyio.CancelScope(shield=True):
                for session in list(live.by_id.values()):
                    await operations.fail_pending(live, session, "memory_closed")
                    async with session.storing:
                        await operations.fail_remote(live, session, "memory_closed")


@asynccontextmanager
async def background_pass(live: Sessions) -> AsyncIterator[None]:
    """One pass of a background loop at the store: a closing Memory starts none, and lets those
    under way end before it cancels its loops (a cancelled query costs a pooled connection)."""
    if live.passes_end is not None:
        await anyio.sleep_forever()
    live.passes += 1
    try:
        yield
    finally:
        live.passes -= 1
        if live.passes_end is not None and not live.passes:
            live.passes_end.set()


async def end_idle(live: Sessions) -> float:
    """Ends the idle sessions of the store that came due (at most `SWEEP_LIMIT`), drops their
    records here, answers what they owed, and reports each as "session_expired". Returns the
    seconds until the next comes due (0: more are due now; inf: none is idle); when the store
    failed, nothing was ended (logged), and it is looked at again in `STORE_RETRY` seconds."""
    try:
        swept = await live.coordination.end_idle(SWEEP_LIMIT)
    except StorageError as exc:
        log.warning("idle sessions could not be ended: %r", exc)
        return STORE_RETRY
    for session_id, repo in swept.ended:
        if (session := live.by_id.get(session_id)) is not None:
            await live.forget(session)
        await live.events.emit(
            "session_expired", session_id=session_id, repo=repo, state=State.IDLE, committed=False
        )
    return math.inf if swept.next_due is None else swept.next_due


async def sweep(live: Sessions) -> None:
    """Ends idle sessions as they come due, looking at the store when the next is due and at
    least every `Sessions.shortest_idle` seconds; runs until cancelled."""
    working(live)
    while True:
        live.idle_wake = anyio.Event()
        async with background_pass(live):
            due = await end_idle(live)
        with anyio.move_on_after(min(due, live.shortest_idle)):
            await live.idle_wake.wait()


async def run(live: Sessions) -> None:
    """Flushes idle trajectories and expires idle auto-commit sessions until cancelled."""
    working(live)
    while True:
        now = anyio.current_time()
        next_due = math.inf
        for session_id in list(live.timed):
            session = live.by_id.get(session_id)
            if session is None or session.ended or not session.driven:
                live.timed.discard(session_id)  # gone, or another Memory's (`drive` adds it)
                continue
            if session.state not in (State.COLLECTING, State.IDLE) or session.checking:
                continue
            due = min(_deadlines(session))
            if now < due:
                next_due = min(next_due, due)
            else:  # `_due` acts once the store agrees
                session.checking = True
                live.spawn(session, _due, live, session)
        live.timer_wake = anyio.Event()
        with anyio.move_on_after(max(next_due - anyio.current_time(), 0.0)):
            await live.timer_wake.wait()


def _deadlines(session: SessionRecord) -> tuple[float, float]:
    """When the session expires, and when its uncommitted steps are flushed (inf: never); a
    flush is looked at with no step here too (steps appended elsewhere are seen in the store)."""
    config = session.config
    expiry = flush_at = math.inf
    if config.session_timeout is not None:
        expiry = session.last_activity + config.session_timeout
    if config.flush_timeout is not None:
        # Idle here too: work through another Memory is seen only by reading the store.
        flush_at = max(session.last_activity, session.flush_after) + config.flush_timeout
    return expiry, flush_at


async def _due(live: Sessions, session: SessionRecord) -> None:
    """Acts on a due deadline once the store agrees (the session read again); a flush claims
    the session by a compare-and-set on its version, so no other Memory extracts its steps."""
    try:
        await live.fetch(session.id, fresh=True)  # read again only when its version moved
        if not session.driven or session.state not in (State.COLLECTING, State.IDLE):
            return
        now = anyio.current_time()
        expiry, flush_at = _deadlines(session)
        if now >= expiry:
            session.last_activity = math.inf  # once
            live.spawn(session, _expire, live, session)
            return
        if now < flush_at:
            return  # used meanwhile: the loop waits for the new deadline
        waiting = session.uncommitted()
        if not waiting:
            session.flush_after = now  # nothing to flush: look again a timeout from now
            return
        # The steps first: those committed or claimed elsewhere are nothing to flush, and
        # the session is not claimed for nothing.
        mine = await registry.claim(live, session, waiting)
        if not mine:
            session.flush_after = now
            await extracting.take_commits(live, session)
            return
        async with session.lock:
            claimed = session.state is State.COLLECTING and await transitions.hold(live, session)
            if not claimed:
                # Moved meanwhile: the loop looks again.
                await live.reload(session, conflict=True)
        if not claimed:
            # Given back, but for those a boundary's commit here took meanwhile.
            await registry.release(live, session,
                                 [s for s in mine if s.id not in session.claimed])
            return
        # By id: a reload made new, equal records (whose vectors have no truth value).
        ids = {s.id for s in mine}
        waiting = [s for s in session.uncommitted() if s.id in ids]
        if waiting:
            live.effects(live, session, CommitSteps(waiting))
    except NotFoundError:
        return  # ended through another Memory
    except StorageError as exc:
        log.warning("%s: timers could not read the store: %r", session.id, exc)
        await anyio.sleep(STORE_RETRY)
    finally:
        session.checking = False
        live.timer_wake.set()


async def _expire(live: Sessions, session: SessionRecord) -> None:
    """Commits what is left of an expired session, then ends it, once work under way finishes
    (and again after its own close). The close and the end are compare-and-sets on the version,
    so an append through another Memory in between keeps the session alive."""
    seen = session.active_at

    def used() -> bool:
        return (session.last_activity != math.inf or session.active_at != seen
                or not session.driven)

    def refuse() -> None:
        refuse_close(session)
        if used():
            raise SessionError("not_idle", state=session.state, session_id=session.id)

    while True:
        while (_working(session) or current_state(session) is State.EXTRACTING) and (
                not session.ended):
            if session.scopes or _working(session):
                await session.changed.wait()
            else:
                await transitions.wait_moved(live, session)  # extracted through another Memory
        if session.ended:
            return
        if used():
            _restart(live, session)  # used meanwhile: its deadline runs again from that use
            return
        if current_state(session) is State.FAILED:
            # Ending it would leave its steps out of the graph: keep it for a retry.
            log.warning("%s: expired, but its last extraction failed; kept", session.id)
            return
        if current_state(session) is not State.COLLECTING:
            break
        try:
            await transitions.start_extraction(live, session, "close", None, refuse=refuse)
        except SessionError:
            _restart(live, session)  # a call got in first (an append): not idle after all
            return
    state, committed = session.state, bool(session.last_receipt)
    # Ended before it is reported: whoever hears "session_expired" finds the id unknown.
    # Shielded: ending the session cancels this task, and the event must still go out.
    with anyio.CancelScope(shield=True):
        try:
            await live.store.end(session.id, version=session.version)
            await live.forget(session)
        except StaleSession:
            pass  # used through another Memory since the close (a new episode)
        else:
            await live.events.emit(
                "session_expired", session_id=session.id, repo=session.repo,
                state=state, committed=committed,
            )
            return
    try:
        async with session.lock:
            await live.reload(session, conflict=True)
    except NotFoundError:
        return
    _restart(live, session)


def _restart(live: Sessions, session: SessionRecord) -> None:
    """The session was used after all: its idle time restarts, and the loop looks again."""
    if session.last_activity == math.inf:
        session.last_activity = live.clock_of(session.active_at)
    live.timer_wake.set()


def _working(session: SessionRecord) -> bool:
    return (
        session.running is not None
        or bool(session.pending)
        or session.appends_in_flight > 0
        or session.background > 0
    )


async def holder(live: Sessions, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    """Looks for work to take over and, once this Memory holds work, beats; retires when
    cancelled (its leases end at once)."""
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_beat, live)
            tg.start_soon(_takeover_loop, live)
            task_status.started()
    finally:
        if live.registered.is_set():
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                try:
                    await live.coordination.retire(live.holder_id, live.coordination.now())
                except MnemoError as exc:
                    log.warning("could not retire %s: %r", live.holder_id, exc)


async def _beat(live: Sessions) -> None:
    await live.registered.wait()
    while True:
        await anyio.sleep(live.lease.total_seconds() / 3)
        try:
            async with background_pass(live):
                await live.coordination.beat(live.holder_id, live.coordination.now(),
                                             live.lease_until())
        except MnemoError as exc:
            log.warning("%s: heartbeat failed: %r", live.holder_id, exc)


async def _takeover_loop(live: Sessions) -> None:
    working(live)  # it may call back what a gone Memory left
    while True:
        live.look = anyio.Event()
        try:
            async with background_pass(live):
                await take_over(live)
        except MnemoError as exc:
            log.warning("%s: looking for work failed: %r", live.holder_id, exc)
        with anyio.move_on_after(live.lease.total_seconds() / 2):
            await live.look.wait()


async def take_over(live: Sessions) -> None:
    """One look of the takeover task: work nobody holds is taken over, and the operations a
    gone holder took and left are answered."""
    co = live.coordination
    try:
        await co.sync_clock()
    except MnemoError as exc:
        log.warning("%s: could not read the store's clock (the last measure stays): %r",
                    live.holder_id, exc)
    now = co.now()
    # Reads only: a holder whose process is gone is treated as gone, not retired here.
    gone = await live.gone()
    await extracting.take_work(live, now, gone)
    try:
        await answer_abandoned(live, now - live.lease, gone)
    except MnemoError as exc:
        log.warning("%s: looking for operations left by a gone holder failed: %r",
                    live.holder_id, exc)
    try:
        # What was answered for, or taken and left by, a holder that closed or left: nobody
        # would run or read it. Judged over longer than a lease (a late holder still runs what
        # it took, a late Memory reads its answers).
        forgotten = await co.forget_orphans(now - max(live.lease, ORPHAN_GRACE), gone,
                                            me=live.holder_id)
    except MnemoError as exc:
        log.warning("%s: looking for operations nobody waits for failed: %r",
                    live.holder_id, exc)
    else:
        if forgotten:
            log.info("%s: forgot %d stored operations nobody waits for", live.holder_id,
                     forgotten)


async def answer_abandoned(
    live: Sessions, unseen_since: datetime, gone: list[str]
) -> None:
    """Calls back `operation_failed` for the operations this Memory stored that a holder took
    and left without a result (whether it took effect is unknown; none is run again), once
    forgotten in the store, so a late result goes nowhere."""
    waiting = {op_id: session_id for session_id, entries in live.remote.items()
               for op_id, _, _ in entries}
    if not waiting:
        return
    abandoned = set(await live.coordination.abandon_ops(
        list(waiting), unseen_since, gone, me=live.holder_id
    ))
    for session_id in dict.fromkeys(waiting[op_id] for op_id in abandoned):
        session = live.by_id.get(session_id)
        if session is None:
            await _answer_left(live, session_id, None, abandoned)
        else:
            live.spawn(session, _answer_left, live, session_id, session, abandoned)


async def _answer_left(
    live: Sessions, session_id: str, session: SessionRecord | None, abandoned: set[str]
) -> None:
    state = None if session is None else session.state
    for op_id, kind, callback in operations.claim_waiting(live, session_id, abandoned):
        log.warning("%s: %s %s was taken by a Memory that left before it recorded a result",
                    session_id, kind, op_id)
        error = SessionError("operation_failed", state=state, session_id=session_id)
        error.__cause__ = MnemoError(
            f"the Memory that took {kind} {op_id} to run it left before it recorded a "
            "result: whether it took effect is unknown (the session's state tells)"
        )
        await deliver(callback, OpResult(False, None, error))
