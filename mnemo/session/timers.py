"""The session timers. Auto-commit's: an idle trajectory is flushed (extracted and committed
in the background) after `Config.flush_timeout`, and an idle session expires after
`Config.session_timeout`: what is left is committed, then the session ends. Every mode's: a
session idle between episodes (state `idle`) and unchanged for `Config.idle_session_timeout`
ends (`sweep`), whichever working Memory sees it due: one that a process left behind is ended
by the next Memory that opens the store (`end_idle`, before it restores the live sessions)
or by any open one's sweep.

Only auto-commit sessions this Memory drives have timers here (`Sessions.timed`): the store
names one holder per session, the Memory that started it, claimed its work or took it over,
so a Memory that only reads or restores a session never flushes or expires it. Idle time runs
from the session's last use as the store knows it (`active_at`: an append through any Memory
counts). A deadline that comes due is checked against the store first (`_due`): if the session
moved, its deadlines run again from what the store holds; a flush claims the session by a
compare-and-set on its version, and an expiry's close and end are compare-and-sets too, so
an append elsewhere in between keeps the session alive. `Sessions.touch` wakes the loop when a
deadline may have moved.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

import anyio

from mnemo.errors import NotFoundError, SessionError, StorageError
from mnemo.session import claims, transitions
from mnemo.session.machine import State
from mnemo.session.ports import StaleSession
from mnemo.session.records import CommitSteps, SessionRecord, current_state, uncommitted
from mnemo.session.registry import Sessions

log = logging.getLogger("mnemo")

S = State

# Ends the session if it is still at the given version (else `StaleSession`).
End = Callable[[str, int], Awaitable[None]]

# Seconds before a deadline is looked at again when the store could not be read.
STORE_RETRY = 1.0
# The most idle sessions one sweep ends (one statement): a store that gathered many is swept
# in rounds, the first while the Memory opens.
SWEEP_LIMIT = 100


async def end_idle(live: Sessions) -> float:
    """Ends the idle sessions of the store that came due (`Coordination.end_idle`, at most
    `SWEEP_LIMIT`): their records here are dropped, what they owed is answered, and each is
    reported as "session_expired". Returns the seconds until the next comes due (0: more are
    due now; inf: none is idle).

    Raises:
        StorageError: the store could not be read or written; nothing was ended.
    """
    swept = await live.coordination.end_idle(SWEEP_LIMIT)
    for session_id, repo in swept.ended:
        session = live.by_id.get(session_id)
        if session is not None:
            await live.ended_elsewhere(session)
        await live.events.emit(
            "session_expired", session_id=session_id, repo=repo, state=S.IDLE, committed=False
        )
    return math.inf if swept.next_due is None else swept.next_due


async def sweep(live: Sessions) -> None:
    """Ends idle sessions as they come due (`end_idle`), looking at the store again when the
    next is due, and at least every `Sessions.shortest_idle` seconds (a session this Memory,
    or another, leaves idle later comes due no sooner); runs until cancelled."""
    while True:
        live.idle_wake = anyio.Event()
        try:
            due = await end_idle(live)
        except StorageError as exc:
            log.warning("idle sessions could not be ended: %r", exc)
            due = STORE_RETRY
        with anyio.move_on_after(min(due, live.shortest_idle)):
            await live.idle_wake.wait()


async def run(live: Sessions, end: End) -> None:
    """Flushes idle trajectories and expires idle sessions of auto-commit repos (ending them
    through `end`); runs until cancelled."""
    while True:
        now = anyio.current_time()
        next_due = math.inf
        for session_id in list(live.timed):
            session = live.by_id.get(session_id)
            if session is None:
                live.timed.discard(session_id)
                continue
            due = _check_deadlines(live, end, session, now)
            next_due = min(next_due, due)
        live.timer_wake = anyio.Event()
        with anyio.move_on_after(max(next_due - anyio.current_time(), 0.0)):
            await live.timer_wake.wait()


def _check_deadlines(live: Sessions, end: End, session: SessionRecord, now: float) -> float:
    """Starts a look at the store (`_due`) when a deadline of `session` is due; returns when
    it next needs a look."""
    config = session.config
    if not config.auto_commit or session.ended or not session.driven:
        live.timed.discard(session.id)  # another Memory drives it; `drive` adds it again
        return math.inf
    if session.state not in (S.COLLECTING, S.IDLE) or session.checking:
        return math.inf
    expiry, flush_at = _deadlines(session)
    if now >= min(expiry, flush_at):
        session.checking = True
        live.spawn(session, _due, live, end, session)
        return math.inf
    return min(expiry, flush_at)


def _deadlines(session: SessionRecord) -> tuple[float, float]:
    """When the session expires, and when its uncommitted steps are flushed (inf: never).
    A flush is looked at with no step waiting here too: steps appended through another
    Memory are known only once the store is read (`_due`, which then waits a full timeout
    before it looks again)."""
    config = session.config
    expiry = flush_at = math.inf
    if config.session_timeout is not None:
        expiry = session.last_activity + config.session_timeout
    if config.flush_timeout is not None:
        # Idle here too: an episode started and steps appended through another Memory are
        # seen only by reading the store.
        flush_at = max(session.last_activity, session.flush_after) + config.flush_timeout
    return expiry, flush_at


async def _due(live: Sessions, end: End, session: SessionRecord) -> None:
    """Acts on a due deadline once the store agrees: the session is read again (used
    through another Memory, its deadlines run from that use; held by another, its timers are
    that one's), and a flush claims the session by a compare-and-set on its version, so that
    no other Memory extracts the same steps."""
    try:
        await live.fetch(session.id, fresh=True)  # read again only when its version moved
        if not session.driven or session.state not in (S.COLLECTING, S.IDLE):
            return
        now = anyio.current_time()
        expiry, flush_at = _deadlines(session)
        if now >= expiry:
            session.last_activity = math.inf  # once
            live.spawn(session, _expire, live, end, session)
            return
        if now < flush_at:
            return  # used meanwhile: the loop waits for the new deadline
        waiting = uncommitted(session)
        if not waiting:
            session.flush_after = now  # nothing to flush: look again a timeout from now
            return
        # The steps first (`claims`): those committed elsewhere, or claimed by another
        # Memory's commit under way, are nothing to flush here, and the session is not
        # claimed (its version moved) for nothing.
        mine = await claims.claim(live, session, waiting)
        if not mine:
            session.flush_after = now
            await claims.take_commits(live, session)
            return
        async with session.lock:
            claimed = session.state is S.COLLECTING and await live.claim(session)
            if not claimed:
                # Moved meanwhile: the loop looks again.
                await live.reload(session, conflict=True)
        if not claimed:
            # Given back, but for those a boundary's commit here took meanwhile (the store's
            # claims are this Memory's, not one task's).
            await claims.release(live, session,
                                 [s for s in mine if s.id not in session.claimed])
            return
        # By id: a reload meanwhile made new records (equal ones, whose vectors do not
        # compare as a truth value).
        ids = {s.id for s in mine}
        waiting = [s for s in uncommitted(session) if s.id in ids]
        if waiting:
            live.start(session, CommitSteps(waiting))
    except NotFoundError:
        return  # ended through another Memory
    except StorageError as exc:
        # The store is away: the deadline is looked at again once it may be back (it was
        # logged as a crash, with its traceback, at every look).
        log.warning("%s: timers could not read the store: %r", session.id, exc)
        await anyio.sleep(STORE_RETRY)
    finally:
        session.checking = False
        live.timer_wake.set()


async def _expire(live: Sessions, end: End, session: SessionRecord) -> None:
    """Commits what is left of an expired session, then ends it. Work under way (an
    operation running or queued, an append, a background commit, an extraction) finishes
    first, and again after the expiry's own close: if any of it was activity (an append, an
    episode started, here or through another Memory), the session has not been idle that long
    after all. (The close was skipped while work was under way and the session ended anyway,
    cancelling a background commit: its steps and the rest were never committed; and a sync
    append in progress was not counted, so its session was closed and ended under it.)
    The close and the end are compare-and-sets on the session's version: an append through
    another Memory in between moves it, and the session lives on."""
    seen = session.active_at

    def used() -> bool:
        return (session.last_activity != math.inf or session.active_at != seen
                or not session.driven)

    def refuse() -> None:
        transitions.refuse_close(session)
        if used():
            raise SessionError("not_idle", state=session.state, session_id=session.id)

    while True:
        while (_working(session) or current_state(session) is S.EXTRACTING) and not (
            session.ended
        ):
            if session.scopes or _working(session):
                await session.changed.wait()
            else:
                await live.wait_moved(session)  # extracted through another Memory
        if session.ended:
            return
        if used():
            _restart(live, session)  # used meanwhile: its deadline runs again from that use
            return
        if current_state(session) is S.FAILED:
            # Ending it would leave its steps out of the graph: keep it for a retry.
            log.warning("%s: expired, but its last extraction failed; kept", session.id)
            return
        if current_state(session) is not S.COLLECTING:
            break
        try:
            # Refused, as any close, while an append runs (`transitions.refuse_close`), and
            # when the store says it was used meanwhile (read again after a conflict).
            await transitions.start_extraction(live, session, "close", None, refuse=refuse)
        except SessionError:
            _restart(live, session)  # a call got in first (an append): not idle after all
            return
    state, committed = session.state, bool(session.last_receipt)
    moved = False
    # Ended before it is reported: whoever hears "session_expired" finds the id unknown.
    # Shielded: this task is one of the session's, so ending the session cancels it, and the
    # event was lost at the first await of an async `on_event`.
    with anyio.CancelScope(shield=True):
        try:
            await end(session.id, session.version)
        except StaleSession:
            moved = True  # used through another Memory since the close (a new episode)
        else:
            await live.events.emit(
                "session_expired", session_id=session.id, repo=session.repo,
                state=state, committed=committed,
            )
    if moved:
        try:
            async with session.lock:
                await live.reload(session, conflict=True)
        except NotFoundError:
            return
        _restart(live, session)


def _restart(live: Sessions, session: SessionRecord) -> None:
    """The session was used after all: its idle time runs from its last use (here, or as
    the store holds it), and the loop looks at it again."""
    if session.last_activity == math.inf:
        session.last_activity = live.clock_of(session.active_at)
    live.timer_wake.set()


def _working(session: SessionRecord) -> bool:
    """An operation runs or waits, an append runs (a sync one too), or steps commit in the
    background."""
    return (
        session.running is not None
        or bool(session.pending)
        or session.appends_in_flight > 0
        or session.background > 0
    )
