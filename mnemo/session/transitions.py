"""The session machine's moves, and what the calls that move it write. A state change happens
in `move`: under the session's lock it asks the table, persists, fires the trigger, starts what
the move asks for (an `Effect`), then reports a "transition" event. A step's append and
annotation sit below this module (`registry`), extraction and the operation queue above it."""

from __future__ import annotations

import itertools
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from mnemo.episode import EpisodeRecord, StepRecord
from mnemo.errors import NotFoundError, SessionError, StorageError
from mnemo.extraction.contradiction import intent_policy
from mnemo.graph.model import Changeset, CommitReceipt
from mnemo.graph.ports import StepsCommitted
from mnemo.ports import model_name
from mnemo.session.machine import (
    STALE,
    Effect,
    Extract,
    Op,
    SessionRecord,
    State,
    appends_before,
    refusal,
    refuse_close,
    refuse_unless,
)
from mnemo.session.ports import StaleSession
from mnemo.session.registry import Sessions

log = logging.getLogger("mnemo")


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
    checked under the lock; `facts` (the condition's arguments) are taken once. False for a
    session ended before the move; SessionError where the table refuses `event`; NotFoundError
    when the session ends while its write is retried.
    """
    deadline = None
    async with session.lock:
        for attempt in itertools.count():
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
                now = anyio.current_time()
                deadline = now + session.config.busy_timeout if deadline is None else deadline
                if attempt >= _ATTEMPTS - 1 and now >= deadline:
                    raise StorageError("busy", f"{session.id}: other Memory objects kept moving"
                                       f" it for {session.config.busy_timeout:g} s") from exc
                # Backs off (jittered, at most `_MOST_WAIT`) so a writer in a loop lets it in.
                await anyio.sleep(random.uniform(0, min(_MOST_WAIT, 0.001 * 2**attempt)))
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
            live.effects(live, session, then)
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


# How often a wait for work another Memory holds looks at the store's change token.
POLL_INTERVAL = 0.05
# A write that finds the session moved reads it and asks the table again, at least this many
# times and until `Config.busy_timeout` has passed, waiting at most `_MOST_WAIT` s between.
_ATTEMPTS = 3
_MOST_WAIT = 0.05


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


async def start_extraction(
    live: Sessions, session: SessionRecord, event: str, op: Op | None,
    refuse: Callable[[], None] | None = None,
    facts: Callable[[], dict[str, object]] | None = None,
) -> None:
    """Moves the session to `extracting` (recording its repo's model, as overrides are not
    persisted: who may take the work over) and asks for its extraction; `refuse` as `move`'s."""
    model = model_name(session.repo_runtime.llm)

    async def persist() -> int:
        # Extracting and held by this Memory in one compare-and-set (never nobody's).
        if not await hold(live, session, state=State.EXTRACTING, model=model):
            raise StaleSession(session.id)
        session.extraction_model = model
        return session.version

    # Started with the move: else a call in between takes it for another Memory's extraction.
    if not await move(live, session, event, persist, op=op, refuse=refuse, then=Extract(),
                      facts=facts):
        live.effects(live, session, Extract())


async def commit(
    live: Sessions, session: SessionRecord, op: Op | None = None
) -> CommitReceipt | None:
    if session.state is State.FAILED:
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
        receipt = await commit_steps(live, session, changeset, steps, State.IDLE)
        session.changeset = session.episode = None
        session.last_receipt = receipt

    if not await move(live, session, "commit", persist, op=op,
                      data=lambda: {"node_ids": receipt.node_ids if receipt else []}):
        raise NotFoundError("session", session.id)
    assert receipt is not None
    await live.events.applied(session.repo, receipt.node_ids, receipt.changeset_id,
                              session_id=session.id)
    return receipt


async def discard(live: Sessions, session: SessionRecord, op: Op | None = None) -> None:
    async def persist() -> int:
        episode_id = session.episode.id if session.episode else None
        version = await live.store.discard(session.id, episode_id, version=session.version)
        session.changeset = session.episode = session.failure = None
        return version

    await move(live, session, "discard", persist, op=op)


async def call(
    live: Sessions, session: SessionRecord, kind: str, args: tuple[Any, ...] = (),
    op: Op | None = None,
) -> CommitReceipt | None:
    """A caller's `close`, `commit`, `discard` or `start_episode`, refused as the table says
    (`op`: run from the session's queue)."""
    if kind == "close":  # refused as `refuse_close`, and again under the move's lock
        refuse_close(session, queued=op is not None)
        await start_extraction(live, session, "close", op, facts=lambda: {
            "appends": appends_before(session, queued=op is not None)})
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
    side = StepsCommitted(
        session.id,
        session.episode.id if session.episode else None,
        changeset.id,
        tuple((s.id, s.reward) for s in steps),
        None if state is None else state.value,
        # A commit that moves the session checks that no other Memory moved it first.
        None if state is None else session.version,
    )
    runtime = session.runtime
    llm = live.repos.limits.llm_for(runtime.llm, runtime.config, session.repo, session.id)
    policy = intent_policy(runtime.config, runtime.embedder, llm, session.repo, live.repos.refresh)
    receipt = await live.graph.apply(changeset, intents=policy, also=[side])
    if side.version is not None:
        # The version the write made: a read that took the write in already holds it.
        session.version = side.version + 1
    for step in steps:
        step.committed_in = changeset.id
    return receipt


async def hold(
    live: Sessions, session: SessionRecord, *, state: State | None = None, model: str | None = None
) -> bool:
    """Holds the session's background work and drives its timers (compare-and-set on the
    record's version, moving it to `state` and recording `model` when given); False when
    another Memory moved the session first."""
    await live.register()
    version = await live.coordination.claim(
        session.id, version=session.version, holder_id=live.holder_id,
        lease_until=live.lease_until(), state=state, model=model,
    )
    if version is None:
        return False
    session.version = version
    live.drive(session)
    return True


async def wait_moved(live: Sessions, session: SessionRecord) -> None:
    """Waits until the session may have moved: its event here, or, while another Memory
    extracts it, a change of the store's change token (polled every `POLL_INTERVAL`)."""
    event = session.changed  # taken before any await: a notify from now on wakes us
    if session.scopes or session.state is not State.EXTRACTING:
        await event.wait()
        return
    token = await live.coordination.change_token()
    # Read again after the token is taken: a change in between is seen here, and a later
    # one moves the token.
    await live.fetch(session.id, fresh=True)
    if event.is_set() or session.state is not State.EXTRACTING:
        return
    while True:
        with anyio.move_on_after(POLL_INTERVAL):
            await event.wait()
            return
        if session.scopes or session.state is not State.EXTRACTING:
            return  # its work runs here now, or it moved while we looked at the store
        if await live.coordination.change_token() != token:
            await live.fetch(session.id, fresh=True)
            return
