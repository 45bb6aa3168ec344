"""The session machine's moves, and what the calls that move it write. A state change happens
in `move`: under the session's lock it asks the table, persists, fires the trigger, starts what
the move asks for (an `Effect`), then reports a "transition" event. An append stores its step,
then `annotate`s the stored steps in order, each claimed in the store so that two Memories never
ask the model about one step; a failed annotation is retried by the next append, the close or a
takeover. Extraction and the operation queue sit above this module.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from mnemo.episode import NO_VECTOR, EpisodeRecord, StepInfo, StepRecord, annotate_step
from mnemo.errors import NotFoundError, SessionError, StorageError
from mnemo.extraction.contradiction import intent_policy
from mnemo.graph.model import Changeset, CommitReceipt
from mnemo.graph.ports import StepsCommitted
from mnemo.ports import model_name
from mnemo.session import registry
from mnemo.session.machine import (
    STALE,
    CommitSteps,
    Effect,
    Extract,
    Op,
    SessionRecord,
    State,
    appends_before,
    check_step,
    refusal,
    refuse_close,
    refuse_unless,
)
from mnemo.session.ports import StaleSession
from mnemo.session.registry import Sessions

log = logging.getLogger("mnemo")

S = State


async def move(
    live: Sessions,
    session: SessionRecord,
    event: str,
    persist: Callable[[], Awaitable[object]] | None = None,
    *,
    op: Op | None = None,
    data: Callable[[], dict[str, Any]] | None = None,
    refuse: Callable[[], None] | None = None,
    then: Effect | None = None,
    facts: Callable[[], dict[str, object]] | None = None,
) -> bool:
    """Persists and fires `event` if the table still allows it; False for a stale result.
    `then` is started right after the event fires, before anything else may run. `persist`
    writes with the record's version and returns the new one; on `StaleSession` the record
    is read again and the table asked again. `refuse` raises what else refuses the move,
    checked under the lock; `facts` (the condition's arguments) are taken once. SessionError
    where the table refuses `event`; NotFoundError when the session ended.
    """
    async with session.lock:
        for attempt in range(_ATTEMPTS):
            if session.ended:
                return False
            before = session.state
            given = facts() if facts else {}
            reason = refusal(session, event, **given)
            if reason == STALE:
                log.info("%s: stale %s in state %s dropped", session.id, event, before)
                return False
            if reason is not None:
                raise SessionError(reason, state=before, session_id=session.id)
            if refuse is not None:
                refuse()
            if persist is None:
                break
            try:
                written = await persist()
            except StaleSession as exc:
                if attempt == _ATTEMPTS - 1:
                    raise StorageError(
                        "busy", f"{session.id}: other Memory objects keep moving it"
                    ) from exc
                await live.reload(session, conflict=True)
                continue
            if isinstance(written, int):
                session.version = written
            break
        if session.state is not before:
            # A read took in this very write (`Sessions.reload` forced the record to the
            # stored state): the move is still this one's to fire, with its event.
            live.machine.set_state(before, model=session)
        session.trigger(event, **given)
        after = session.state
        if then is not None:
            live.start(session, then)
        if op is not None:
            op.applied = True
    session.notify()
    if session.config.auto_commit:
        # The timers skip a session while it extracts: once it moves, a passed deadline is due.
        live.timer_wake.set()
    if before is not after:
        await live.events.emit(
            "transition", session_id=session.id, repo=session.repo,
            **{"from": before, "to": after}, **(data() if data else {}),
        )
    return True


# A write that finds the session moved reads it and asks the table again, this many times.
_ATTEMPTS = 3


async def start_episode(
    live: Sessions, session: SessionRecord, goal: str, op: Op | None = None
) -> None:
    episode = EpisodeRecord(f"episode_{uuid.uuid4().hex}", goal)

    async def persist() -> int:
        version = await live.store.start_episode(session.id, episode, version=session.version)
        session.episode = episode
        session.last_receipt = None
        return version

    await move(live, session, "start_episode", persist, op=op)
    live.touch(session)


async def refuse_checked(live: Sessions, session: SessionRecord, event: str) -> None:
    """`refuse_unless` for append and start_episode, which start from the record this Memory
    holds: a refusal is final, so it is checked against the store first (read under the
    session's lock, taken in only when newer)."""
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
    """A caller's append: the step checked, then stored in call order (`run_append`)."""
    session = await live.fetch(session_id)
    check_step(session.config, observation, action, metadata)
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
    metadata: dict[str, Any] | None,
) -> StepInfo:
    """Stores the step when the ticket queue reaches `ticket` (steps keep their call order)
    and starts the annotation; returns once the step is annotated, or `append_timeout` after
    it was stored (annotated later)."""
    await session.ticket_queue.wait(ticket)
    try:
        try:
            stored, episode_id = await _store(live, session, observation, action, metadata)
        finally:
            session.ticket_queue.leave(ticket)
        with anyio.move_on_after(session.runtime.config.append_timeout):
            while True:
                changed = session.changed
                now = session.step_at(episode_id, stored.index)
                if now is None or now.annotated or not session.annotating:
                    break
                await changed.wait()
    finally:
        live.touch(session)  # activity until it returns: an expiry finds it used
    info = StepInfo(stored.index, None, None, annotated=False)
    now = session.step_at(episode_id, stored.index)
    if now is not None and now.annotated:
        before = session.step_at(episode_id, stored.index - 1) if stored.index else None
        boundary = before is not None and before.trajectory_id != now.trajectory_id
        info = StepInfo(stored.index, now.trajectory_id, boundary)
    await live.events.emit(
        "step_appended", session_id=session.id, repo=session.repo, index=info.index,
        trajectory_id=info.trajectory_id, boundary_detected=info.boundary_detected,
        annotated=info.annotated,
    )
    return info


async def _store(
    live: Sessions, session: SessionRecord, observation: str, action: str,
    metadata: dict[str, Any] | None,
) -> tuple[StepRecord, str]:
    # The store's state once this append's turn came: only a move during the append is
    # `not_collecting`.
    await live.fetch(session.id, fresh=True)
    moved = False
    while True:
        if moved and not session.ended and session.state is not S.COLLECTING:
            # Closed through another Memory while this append was under way.
            raise SessionError("not_collecting", state=session.state, session_id=session.id)
        refuse_unless(session, "append")
        stored = await _try(live, session, observation, action, metadata)
        if stored is not None:
            return stored
        # Another Memory moved the session: store against the episode as it now is, or refuse.
        async with session.lock:
            await live.reload(session, conflict=True)
        moved = True


async def _try(
    live: Sessions, session: SessionRecord, observation: str, action: str,
    metadata: dict[str, Any] | None,
) -> tuple[StepRecord, str] | None:
    """Stores the step (claimed for its annotation) and starts the annotation; None when the
    session moved in the store meanwhile (nothing written)."""
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
                session.id, episode.id, step, version=session.version, holder=live.holder_id,
            )
        except StaleSession:
            return None
        session.held.add(step.id)
        episode.steps.append(step)
        # Started at once: a cancelled append leaves no stored step nobody annotates.
        annotate(live, session)
    return step, episode.id


def annotate(live: Sessions, session: SessionRecord) -> None:
    """Starts the annotation of the open episode's stored steps (one task a session)."""
    if not session.annotating:
        session.annotating = True
        live.spawn(session, annotation, live, session)


async def annotation(live: Sessions, session: SessionRecord) -> None:
    """Annotates the stored steps in order until none is left: a step another live Memory
    holds is waited for, one whose holder is gone is taken over."""
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
            mine = await registry.claim(live, session, [step])
            if not mine:
                await registry.store_moved(live, token)  # another Memory's annotation of it
            async with session.lock:
                await live.reload(session)  # annotated meanwhile, by the claim's last holder?
            now = session.step_at(episode.id, step.index)
            if mine and (now is None or now.annotated):
                await registry.release(live, session, mine)
            elif mine:
                session.held.add(step.id)
        session.annotation_failure = None
    except NotFoundError:
        pass  # ended through another Memory: nothing is left to annotate
    except Exception as exc:
        log.warning("%s: a step's annotation failed; the step is kept and annotated later: "
                    "%r", session.id, exc)
        session.annotation_failure = exc
        held = [s for s in session.unannotated() if s.id in session.held]
        session.held.clear()
        await registry.release(live, session, held)
    finally:
        session.annotating = False
        session.notify()


async def _annotate(
    live: Sessions, session: SessionRecord, episode: EpisodeRecord, step: StepRecord
) -> None:
    """Annotates one stored step (within `episode.annotation_timeout`) and writes it with the
    previous step's reward."""
    runtime = session.runtime
    note, boundary = await annotate_step(
        lambda: live.llm_for(runtime, session.repo, session.id),
        runtime.embedder,
        runtime.config,
        goal=episode.goal,
        observation=step.observation,
        action=step.action,
        steps=episode.steps[:step.index],
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
        here = session.step_at(episode.id, step.index)
        if version is None or here is None:
            # Annotated by another Memory, or the episode moved on: the store says how.
            await live.reload(session, conflict=True)
        else:
            if version == session.version + 1:  # else another Memory wrote meanwhile
                session.version = version
            for name in ("trajectory_id", "state_summary", "subgoal", "subgoal_vec"):
                setattr(here, name, getattr(done, name))
            before = session.step_at(episode.id, step.index - 1) if step.index else None
            if before is not None:
                before.reward = note.previous_reward
    session.notify()
    if boundary and session.config.auto_commit:
        ready = session.finished_steps()
        if ready:
            live.start(session, CommitSteps(ready))


async def start_extraction(
    live: Sessions, session: SessionRecord, event: str, op: Op | None,
    refuse: Callable[[], None] | None = None,
    facts: Callable[[], dict[str, object]] | None = None,
) -> None:
    """Moves the session to `extracting` (recording its repo's model: who may take the work
    over) and asks for its extraction; `refuse` as `move`'s."""
    # The repo's model (only a Memory with it may resume the work); overrides are not persisted.
    model = model_name(session.repo_runtime.llm)

    async def persist() -> int:
        # Extracting and held by this Memory in one compare-and-set (never nobody's).
        await live.register()
        version = await live.coordination.claim(
            session.id, version=session.version, holder_id=live.holder_id,
            lease_until=live.lease_until(), state=S.EXTRACTING, model=model,
        )
        if version is None:
            raise StaleSession(session.id)
        live.drive(session)  # held here now: so are its timers once it is idle again
        session.extraction_model = model
        return version

    # Started with the move: else a call in between takes it for another Memory's extraction.
    if not await move(live, session, event, persist, op=op, refuse=refuse, then=Extract(),
                      facts=facts):
        live.start(session, Extract())


async def close(live: Sessions, session: SessionRecord, op: Op | None = None) -> None:
    """Starts the episode's extraction, refused as `refuse_close` under the move's lock (an
    `op` is a queued close)."""
    await start_extraction(live, session, "close", op, facts=lambda: {
        "appends": appends_before(session, queued=op is not None)})


async def commit(
    live: Sessions, session: SessionRecord, op: Op | None = None
) -> CommitReceipt | None:
    """`ready`: applies the changeset (state `idle`); `failed`: extracts again, returns None."""
    if session.state is S.FAILED:
        session.failure = None
        await start_extraction(live, session, "commit", op)
        return None
    receipt: CommitReceipt | None = None

    async def persist() -> None:
        nonlocal receipt
        changeset, episode = session.changeset, session.episode
        assert changeset is not None, "a ready session holds its changeset"
        wanted = set(changeset.step_ids)
        steps = [s for s in episode.steps if s.id in wanted] if episode else []
        receipt = await commit_steps(live, session, changeset, steps, S.IDLE)
        session.changeset = session.episode = None
        session.last_receipt = receipt

    if not await move(live, session, "commit", persist, op=op,
                      data=lambda: {"node_ids": receipt.node_ids if receipt else []}):
        raise NotFoundError("session", session.id)
    assert receipt is not None
    await live.events.emit(
        "changeset_applied", session_id=session.id, repo=session.repo,
        node_ids=receipt.node_ids, changeset_id=receipt.changeset_id,
    )
    return receipt


async def discard(live: Sessions, session: SessionRecord, op: Op | None = None) -> None:
    async def persist() -> int:
        episode_id = session.episode.id if session.episode else None
        version = await live.store.discard(session.id, episode_id, version=session.version)
        session.changeset = None
        session.episode = None
        session.failure = None
        return version

    await move(live, session, "discard", persist, op=op)


async def call(
    live: Sessions, session: SessionRecord, kind: str, args: tuple[Any, ...] = (),
    op: Op | None = None,
) -> CommitReceipt | None:
    """A caller's `close`, `commit`, `discard` or `start_episode`, refused as the table says
    (`op`: run from the session's queue)."""
    if kind == "close":
        refuse_close(session, queued=op is not None)
        await close(live, session, op)
        return None
    refuse_unless(session, kind)
    if kind == "commit":
        return await commit(live, session, op)
    if kind == "discard":
        await discard(live, session, op)
    else:
        await start_episode(live, session, args[0], op)
    return None


async def commit_steps(
    live: Sessions,
    session: SessionRecord,
    changeset: Changeset,
    steps: list[StepRecord],
    state: State | None,
) -> CommitReceipt:
    """Applies `changeset` with the session's side (steps committed, and `state` unless None)
    in one transaction, then marks the steps committed in memory."""
    episode_id = session.episode.id if session.episode else None
    side = StepsCommitted(
        session.id,
        episode_id,
        changeset.id,
        tuple((s.id, s.reward) for s in steps),
        None if state is None else state.value,
        # A commit that moves the session checks that no other Memory moved it first.
        None if state is None else session.version,
    )
    runtime = session.runtime
    policy = intent_policy(runtime.config, runtime.embedder,
                           live.llm_for(runtime, session.repo, session.id), session.repo,
                           live.refresh_repo)
    receipt = await live.graph.apply(changeset, intents=policy, also=[side])
    if side.version is not None:
        # The version the write made: a read that took the write in already holds it.
        session.version = side.version + 1
    for step in steps:
        step.committed_in = changeset.id
    return receipt
