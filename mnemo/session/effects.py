"""Starting what the session machine's moves ask for.

A move names its effect as a value (`records.Extract`, `records.CommitSteps`); the service
starts it here (`start`, installed as `Sessions.start`), as a task of the session's own. What
runs once the work is done is this module's too: the operations queued behind it (`operations`,
`stored`), so that the machine's moves (`transitions`) and the extraction runner
(`extracting`) import neither.
"""

from __future__ import annotations

import logging

from mnemo.episode.model import StepRecord
from mnemo.errors import StorageError
from mnemo.session import operations, stored
from mnemo.session.extracting import Ended, Extraction
from mnemo.session.records import CommitSteps, Effect, Extract, SessionRecord
from mnemo.session.registry import Sessions

log = logging.getLogger("mnemo")


def start(live: Sessions, session: SessionRecord, effect: Effect) -> None:
    """Starts `effect` for `session` in the service's group (cancelled with the session)."""
    if isinstance(effect, Extract):
        live.spawn(session, _extraction, live, session)
        return
    assert isinstance(effect, CommitSteps)
    session.claimed.update(s.id for s in effect.steps)
    session.background += 1
    live.spawn(session, _background_commit, live, session, effect.steps)


async def _extraction(live: Sessions, session: SessionRecord) -> None:
    """The close's extraction, then what was queued behind it (`_run_queue`), which fails
    with "extraction_failed" when it did. From its move until then the session stays busy
    (`operations.handing_over`): a call made in between queues behind what the store hands
    over, not ahead of it. A fault in the queue is no failed extraction (the failure's move
    from `ready` was stale, so nothing ran or failed the queue, and it stuck)."""
    with operations.handing_over(live, session):
        ended = await Extraction(live, session).run()
        if ended is Ended.FAILED:
            await operations.fail_pending(session, "extraction_failed")
        if ended is not Ended.STALE:
            await _run_queue(live, session)


async def _background_commit(
    live: Sessions, session: SessionRecord, steps: list[StepRecord]
) -> None:
    """A background commit, then the queue: what waited behind it runs, or, when it failed,
    fails with "extraction_failed"."""
    if await Extraction(live, session).commit_in_background(steps):
        operations.kick(live, session)
    else:
        await operations.fail_pending(session, "extraction_failed")


async def _run_queue(live: Sessions, session: SessionRecord) -> None:
    """Runs what waited for the extraction that just ended: the operations stored for it
    (`stored.run_stored`) and the session's own queue. If the store cannot hand over the
    stored ones, they stay stored, untaken, and the watchers of the Memories that accepted
    them run them; the queue here runs all the same."""
    try:
        await stored.run_stored(live, session)
    except StorageError as exc:
        log.warning("%s: stored operations not taken: %r", session.id, exc)
