"""The auto-commit timers: an idle trajectory is flushed (extracted and committed in the
background) after `Config.flush_timeout`, and an idle session expires after
`Config.session_timeout`: what is left is committed, then the session ends.

Only auto-commit sessions have timers (`Sessions.timed`); `Sessions.touch` wakes the loop when
a deadline may have moved.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

import anyio

from mnemo.errors import SessionError
from mnemo.session import extracting, transitions
from mnemo.session.machine import State
from mnemo.session.records import SessionRecord, current_state
from mnemo.session.registry import Sessions

log = logging.getLogger("mnemo")

S = State

End = Callable[[str], Awaitable[None]]


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
            live.spawn(session, _expire, live, end, session)
            return math.inf
        due = expiry
    if config.flush_timeout is not None and session.state is S.COLLECTING:
        episode = session.episode
        waiting = (
            [s for s in episode.steps if extracting.extractable(session, s)] if episode else []
        )
        if waiting:
            flush_at = max(session.last_activity, session.flush_after) + config.flush_timeout
            if now >= flush_at:
                extracting.start_background(live, session, waiting)
            else:
                due = min(due, flush_at)
    return due


async def _expire(live: Sessions, end: End, session: SessionRecord) -> None:
    """Commits what is left of an expired session, then ends it. Work under way (an
    operation running or queued, an append, a background commit, an extraction) finishes
    first, and again after the expiry's own close: if any of it was activity (an append, an
    episode started), the session has not been idle that long after all. (The close was
    skipped while work was under way and the session ended anyway, cancelling a background
    commit: its steps and the rest were never committed; and a sync append in progress was
    not counted, so its session was closed and ended under it.)"""
    while True:
        while (_working(session) or current_state(session) is S.EXTRACTING) and not (
            session.ended
        ):
            await session.changed.wait()
        if session.ended:
            return
        if session.last_activity != math.inf:
            return  # used meanwhile: its deadline runs again from that use
        if current_state(session) is S.FAILED:
            # Ending it would leave its steps out of the graph: keep it for a retry.
            log.warning("%s: expired, but its last extraction failed; kept", session.id)
            return
        if current_state(session) is not S.COLLECTING:
            break
        try:
            # Refused, as any close, while an append runs (`transitions.close`).
            await transitions.close(live, session)
        except SessionError:
            live.touch(session)  # a call got in first (an append): not idle after all
            return
    state, committed = session.state, bool(session.last_receipt)
    # Ended before it is reported: whoever hears "session_expired" finds the id unknown.
    # Shielded: this task is one of the session's, so ending the session cancels it, and the
    # event was lost at the first await of an async `on_event`.
    with anyio.CancelScope(shield=True):
        await end(session.id)
        await live.events.emit(
            "session_expired", session_id=session.id, repo=session.repo,
            state=state, committed=committed,
        )


def _working(session: SessionRecord) -> bool:
    """An operation runs or waits, an append runs (a sync one too), or steps commit in the
    background."""
    return (
        session.running is not None
        or bool(session.pending)
        or session.appends_in_flight > 0
        or session.background > 0
    )
