"""The session machine's moves and the effects of the calls that move it.

A state change happens in `move`: under the session's lock it re-checks the table (`answer`),
persists, fires the trigger, then reports a "transition" event. The calls' effects
(`start_episode`, `append`, `close`, `commit`, `discard`) check the table first (`refuse_unless`)
and move through `move`, except `commit`, which fires under the lock it applies the changeset
in. A close hands the episode to `extracting`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from mnemo.episode.annotation import annotate, starts_trajectory
from mnemo.episode.model import EpisodeRecord, StepInfo, StepRecord
from mnemo.errors import LLMTimeout, MnemoError, NotFoundError, SessionError
from mnemo.graph.model import CommitReceipt
from mnemo.session import extracting
from mnemo.session.machine import Machines, Refuse, Stale, State, answer
from mnemo.session.queue import Op
from mnemo.session.records import SessionRecord
from mnemo.session.registry import Sessions

log = logging.getLogger("mnemo")

S = State


def refuse_unless(session: SessionRecord, event: str) -> None:
    """Raises NotFoundError for an ended session, SessionError where the table refuses."""
    if session.ended:  # ended while this call waited for its turn
        raise NotFoundError("session", session.id)
    verdict = answer(session.state, event)
    if isinstance(verdict, Refuse):
        raise SessionError(verdict.reason, state=session.state, session_id=session.id)


def refuse_close(session: SessionRecord) -> None:
    refuse_unless(session, "close")
    if session.appends_in_flight:
        raise SessionError("append_in_progress", state=session.state, session_id=session.id)


async def move(
    live: Sessions,
    session: SessionRecord,
    event: str,
    persist: Callable[[], Awaitable[object]] | None = None,
    *,
    op: Op | None = None,
    data: Callable[[], dict[str, Any]] | None = None,
) -> bool:
    """Persists and fires `event` if the table still allows it; False for a stale result.

    Raises:
        SessionError: the table refuses `event` in the current state.
    """
    async with session.lock:
        if session.ended:
            return False
        before = session.state
        verdict = answer(before, event)
        if isinstance(verdict, Refuse):
            raise SessionError(verdict.reason, state=before, session_id=session.id)
        if isinstance(verdict, Stale):
            log.info("%s: stale %s in state %s dropped", session.id, event, before)
            return False
        if persist is not None:
            await persist()
        after = Machines.fire(session.model, event)
        if op is not None:
            op.applied = True
    session.notify()
    if before is not after:
        await live.events.emit(
            "transition", session_id=session.id, repo=session.repo,
            **{"from": before, "to": after}, **(data() if data else {}),
        )
    return True


async def start_episode(
    live: Sessions, session: SessionRecord, goal: str, op: Op | None = None
) -> None:
    episode = EpisodeRecord(f"episode_{uuid.uuid4().hex}", goal)

    async def persist() -> None:
        await live.store.start_episode(session.id, episode)
        session.episode = episode
        session.last_receipt = None

    await move(live, session, "start_episode", persist, op=op)
    live.touch(session)


async def append(
    live: Sessions,
    session: SessionRecord,
    ticket: int,
    observation: str,
    action: str,
    metadata: dict[str, Any] | None,
) -> StepInfo:
    """Stores the step when the turnstile reaches `ticket`, so steps keep their call order."""
    await session.turnstile.wait(ticket)
    try:
        return await _annotate_and_store(live, session, observation, action, metadata)
    finally:
        session.turnstile.leave(ticket)


async def _annotate_and_store(
    live: Sessions,
    session: SessionRecord,
    observation: str,
    action: str,
    metadata: dict[str, Any] | None,
) -> StepInfo:
    refuse_unless(session, "append")
    episode = session.episode
    assert episode is not None, "a collecting session has an episode"
    runtime = session.runtime
    runtime.check_dim(session.repo)
    previous = episode.steps[-1] if episode.steps else None
    timeout = runtime.config.append_timeout
    try:
        with anyio.fail_after(timeout):
            note = await annotate(
                live.llm_for(runtime, session.repo, session.id),
                runtime.embedder,
                goal=episode.goal,
                observation=observation,
                action=action,
                previous=previous,
                recent=[step.line for step in episode.steps[-3:]],
            )
    except TimeoutError as exc:
        if isinstance(exc, MnemoError):
            raise
        raise LLMTimeout(f"{session.id}: append timed out after {timeout}s") from exc
    boundary = starts_trajectory(
        previous, note.subgoal_vec, runtime.config.trajectory_threshold
    )
    trajectory = (
        f"trajectory_{uuid.uuid4().hex}"
        if previous is None or boundary
        else previous.trajectory_id
    )
    step = StepRecord(
        id=f"{episode.id}:{len(episode.steps)}",
        index=len(episode.steps),
        trajectory_id=trajectory,
        observation=observation,
        action=action,
        state_summary=note.state_summary,
        subgoal=note.subgoal,
        subgoal_vec=note.subgoal_vec,
        metadata=metadata,
    )
    if previous is not None:
        previous_reward = previous.reward
        previous.reward = note.previous_reward
    async with session.lock:
        refuse_unless(session, "append")
        try:
            await live.store.add_step(session.id, episode.id, step, previous)
        except BaseException:
            if previous is not None:
                previous.reward = previous_reward
            raise
        episode.steps.append(step)
    live.touch(session)
    info = StepInfo(step.index, trajectory, boundary)
    await live.events.emit(
        "step_appended", session_id=session.id, repo=session.repo, index=step.index,
        trajectory_id=trajectory, boundary_detected=boundary,
    )
    if boundary and session.config.auto_commit:
        ready = [s for s in episode.steps[:-1] if extracting.extractable(session, s)]
        if ready:
            extracting.start_background(live, session, ready)
    return info


async def close(live: Sessions, session: SessionRecord, op: Op | None = None) -> None:
    await extracting.start(live, session, "close", op)


async def commit(
    live: Sessions, session: SessionRecord, op: Op | None = None
) -> CommitReceipt | None:
    """`ready`: applies the changeset (state `idle`); `failed`: extracts again, returns None."""
    if session.state is S.FAILED:
        session.failure = None
        await extracting.start(live, session, "commit", op)
        return None
    changeset = session.changeset
    episode = session.episode
    assert changeset is not None, "a ready session holds its changeset"
    wanted = set(changeset.step_ids)
    steps = [s for s in episode.steps if s.id in wanted] if episode else []
    async with session.lock:
        refuse_unless(session, "commit")
        receipt = await extracting.commit_steps(live, session, changeset, steps, S.IDLE)
        Machines.fire(session.model, "commit")
        if op is not None:
            op.applied = True
        session.changeset = None
        session.episode = None
        session.last_receipt = receipt
    session.notify()
    await live.events.emit(
        "changeset_applied", session_id=session.id, repo=session.repo,
        node_ids=receipt.node_ids, changeset_id=receipt.changeset_id,
    )
    await live.events.emit(
        "transition", session_id=session.id, repo=session.repo,
        **{"from": S.READY, "to": S.IDLE, "node_ids": receipt.node_ids},
    )
    return receipt


async def discard(live: Sessions, session: SessionRecord, op: Op | None = None) -> None:
    episode_id = session.episode.id if session.episode else None

    async def persist() -> None:
        await live.store.discard(session.id, episode_id)
        session.changeset = None
        session.episode = None
        session.failure = None

    await move(live, session, "discard", persist, op=op)
