"""Starting what the session machine's moves ask for, and the annotation of stored steps.

A move names its effect as a value (`records.Extract`, `records.CommitSteps`,
`records.Annotate`); the service starts it here (`start`, installed as `Sessions.start`), as a
task of the session's own. What runs once the work is done is this module's too: the
operations queued behind it (`operations`, `stored`), so that the machine's moves
(`transitions`) and the extraction runner (`extracting`) import neither.

A step is stored before it is annotated (durable first). `_annotation` then annotates the
open episode's stored steps one at a time, in order (a step's boundary needs the previous
subgoal's vector, and its annotation scores the previous step's reward), each claimed in the
store (`claims`: the Memory that stored it holds the claim), so that two Memories never ask
the model about one step: a step another live Memory holds is waited for, one whose holder is
gone is taken over. A step whose annotation fails stays stored, unannotated, and its claim is
given up: the next append, the close (which waits for every step, `Extraction`) or another
Memory's takeover task (`leases`) starts it again.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid

from mnemo.episode.annotation import annotate_step
from mnemo.episode.model import EpisodeRecord, StepRecord
from mnemo.errors import NotFoundError, StorageError
from mnemo.session import claims, operations, stored
from mnemo.session.extracting import Ended, Extraction
from mnemo.session.machine import State
from mnemo.session.records import (
    Annotate,
    CommitSteps,
    Effect,
    Extract,
    SessionRecord,
    finished_steps,
    step_at,
    unannotated,
)
from mnemo.session.registry import Sessions

log = logging.getLogger("mnemo")


def start(live: Sessions, session: SessionRecord, effect: Effect) -> None:
    """Starts `effect` for `session` in the service's group (cancelled with the session)."""
    if isinstance(effect, Extract):
        live.spawn(session, _extraction, live, session)
        return
    if isinstance(effect, Annotate):
        if not session.annotating:  # one annotation task a session
            session.annotating = True
            live.spawn(session, _annotation, live, session)
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
        operations.start_next(live, session)
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


async def _annotation(live: Sessions, session: SessionRecord) -> None:
    """Annotates the stored steps in order until none is left (see the module doc)."""
    try:
        while session.state in (State.COLLECTING, State.EXTRACTING) and not session.ended:
            episode, pending = session.episode, unannotated(session)
            if episode is None or not pending:
                break
            step = pending[0]
            if step.id in session.held:
                await _annotate(live, session, episode, step)
                continue
            token = await live.coordination.change_token()
            mine = await claims.claim(live, session, [step])
            if not mine:
                await claims.store_moved(live, token)  # another Memory's annotation of it
            async with session.lock:
                await live.reload(session)  # annotated meanwhile, by the claim's last holder?
            now = step_at(session, episode.id, step.index)
            if mine and (now is None or now.annotated):
                await claims.release(live, session, mine)
            elif mine:
                session.held.add(step.id)
        session.annotation_failure = None
    except NotFoundError:
        pass  # ended through another Memory: nothing is left to annotate
    except Exception as exc:
        log.warning("%s: a step's annotation failed; the step is kept and annotated later: "
                    "%r", session.id, exc)
        session.annotation_failure = exc
        held = [s for s in unannotated(session) if s.id in session.held]
        session.held.clear()
        await claims.release(live, session, held)
    finally:
        session.annotating = False
        session.notify()


async def _annotate(
    live: Sessions, session: SessionRecord, episode: EpisodeRecord, step: StepRecord
) -> None:
    """Annotates one stored step (within `Config.annotation_timeout`) and writes it with the
    previous step's reward."""
    runtime = session.runtime
    config = runtime.config
    note, boundary = await annotate_step(
        lambda: live.llm_for(runtime, session.repo, session.id),
        runtime.embedder,
        goal=episode.goal,
        observation=step.observation,
        action=step.action,
        steps=episode.steps[:step.index],
        threshold=config.trajectory_threshold,
        time_limit=config.annotation_timeout,
        name=f"{session.id} step {step.index}",
    )
    previous = episode.steps[step.index - 1] if step.index else None
    trajectory = (f"trajectory_{uuid.uuid4().hex}" if previous is None or boundary
                  else previous.trajectory_id)
    done = dataclasses.replace(step, trajectory_id=trajectory, state_summary=note.state_summary,
                               subgoal=note.subgoal, subgoal_vec=note.subgoal_vec)
    scored = None if previous is None else dataclasses.replace(
        previous, reward=note.previous_reward)
    async with session.lock:
        version = await live.store.annotate_step(session.id, episode.id, done, scored,
                                                 holder=live.holder_id)
        session.held.discard(step.id)
        here = step_at(session, episode.id, step.index)
        if version is None or here is None:
            # Annotated by another Memory, or the episode moved on: the store says how.
            await live.reload(session, conflict=True)
        else:
            if version == session.version + 1:  # else another Memory wrote meanwhile
                session.version = version
            for name in ("trajectory_id", "state_summary", "subgoal", "subgoal_vec"):
                setattr(here, name, getattr(done, name))
            before = step_at(session, episode.id, step.index - 1) if step.index else None
            if before is not None:
                before.reward = note.previous_reward
    session.notify()
    if boundary and session.config.auto_commit:
        ready = finished_steps(session)
        if ready:
            start(live, session, CommitSteps(ready))
