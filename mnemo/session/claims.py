"""Which `Memory` extracts which steps of an auto-commit session (`Coordination.claim_steps`).

A boundary's background commit, a flush and a close each claim the uncommitted steps they
are about to extract; what another live holder has claimed is left to it, so that no model
is asked about a step twice. A claim lasts until the step is committed, the claimer gives it
up (its commit failed), or the claimer leaves (closed, unseen for a lease, its process gone).
A close, which must see every step committed before its session is idle, first waits for
the claims of others (`settle`), at most an extraction's time limit; then it extracts what is
still open itself, even what is still claimed, which is what happened before claims existed
(the graph still takes each step once: `StepsCommitted`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anyio

from mnemo.episode.model import StepRecord
from mnemo.errors import NotFoundError, StorageError
from mnemo.session.records import SessionRecord
from mnemo.session.registry import Sessions

log = logging.getLogger("mnemo")

# A wait for another Memory's claims looks at the store's change token this often (every
# commit on the store moves it, so each look that finds it moved reads the episode and claims
# again: at most five times a second), and looks again at least every `RECHECK` seconds
# though the token has not moved: a claimer that died writes nothing, its claims lapse.
SETTLE_INTERVAL = 0.2
RECHECK = 1.0


async def claim(
    live: Sessions, session: SessionRecord, steps: Sequence[StepRecord]
) -> list[StepRecord]:
    """The steps among `steps` this Memory holds for its extraction now: all of them where
    no holder is set up (one Memory alone on its store).

    Raises:
        StorageError: the store could not be written.
    """
    if live.claim_steps is None or not steps:
        return list(steps)
    granted = await live.claim_steps(session.id, [s.id for s in steps])
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
    if live.holder_id is None or not steps:
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
