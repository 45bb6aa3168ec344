"""The async operation queue of each session, and the operations stored with their session for
work another `Memory` holds: each accepted operation gets exactly one callback. While another
Memory extracts the session, an operation accepted here is stored (`_store_for`); whoever ends
that work runs it and records its result, and this Memory calls back (`deliver_results`). Every
path that calls back a waiting operation takes it out of `Sessions.remote` first, at once: one
callback each, never none, never two. An operation queued here behind the session's work is
stored too (`_queue`), and forgotten just before it runs or is answered: if this Memory dies
first, the Memory that takes its work over runs it."""

from __future__ import annotations

import heapq
import itertools
import logging
import uuid
from collections.abc import Collection, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from typing import Any

import anyio

from mnemo.errors import InvalidInputError, MnemoError, NotFoundError, SessionError, StorageError
from mnemo.session import registry, transitions
from mnemo.session.machine import (
    CALLED_BACK,
    VALUES,
    Callback,
    Op,
    OpResult,
    SessionRecord,
    State,
    accept,
    as_session_error,
    check_args,
    check_queue,
    deliver,
    failure,
    projection,
    refusal,
)
from mnemo.session.ports import StoredOp, StoredResult
from mnemo.session.registry import Sessions

log = logging.getLogger("mnemo")


async def submit(
    live: Sessions, session_id: str, kind: str, args: tuple[Any, ...], callback: Callback | None
) -> None:
    """Accepts an async operation: runs it now when the session is free, else queues it;
    while another Memory extracts the session, stores it with the session (`_store_for`).
    InvalidInputError: a bad callback; SessionError: "session_failed", "pending_queue_full",
    "invalid_operation" or "invalid_queued_operation"."""
    if callback is not None and not callable(callback):
        raise InvalidInputError(f"callback must be callable or None, got {callback!r}")
    session = await live.fetch(session_id, fresh=True)
    try:
        await _accept(live, session, kind, args, callback)
    except SessionError as refused:
        if refused.reason not in (
            "invalid_operation", "invalid_queued_operation", "session_failed"
        ):
            raise
        # Checked against the store first, as a sync call's refusal is.
        async with session.lock:
            await live.reload(session)
        await _accept(live, session, kind, args, callback)


async def _accept(live: Sessions, session: SessionRecord, kind: str, args: tuple[Any, ...],
                  callback: Callback | None) -> None:
    check_args(session, kind, args)
    if session.state is State.EXTRACTING and not session.extracts:
        await _store_for(live, session, kind, args, callback)  # another Memory extracts it
        return
    if session.state is State.FAILED:
        raise SessionError("session_failed", state=session.state, session_id=session.id)
    op = Op(kind, args, callback)
    if session.busy or awaits_handover(live, session):
        await _queue(live, session, op)
        return
    if refusal(session, kind, appends=session.appends_in_flight) is not None:
        raise SessionError("invalid_operation", state=session.state, session_id=session.id)
    accept(session, op)
    _start(live, session, op)


async def _queue(live: Sessions, session: SessionRecord, op: Op) -> None:
    """Queues `op` behind the session's work, stored first (`Op.queued`); checked at once, and
    again after the write, during which the work, the session or this Memory may have ended
    (NotFoundError, RuntimeError as `_store_for`). While the session extracts, the queue is
    every Memory's stored operations (`_check_stored`)."""

    async def check(op_id: str | None) -> None:
        if live.closing:  # its close answers only what was queued before
            raise RuntimeError("the Memory has closed")
        if session.ended:
            raise NotFoundError("session", session.id)
        if session.state is State.EXTRACTING:
            await _check_stored(live, session, op.kind, op_id)
            return
        # What this Memory stored while another held the extraction comes first in the queue.
        kinds = [k for _, k, _ in live.remote.get(session.id, [])]
        kinds += [o.kind for o in session.pending]
        check_queue(session, len(kinds), projection(session, [*kinds, op.kind]))

    await check(None)
    # From the check to the append, one call at a time; a cancelled caller leaves no row unrun.
    async with session.storing:
        with anyio.CancelScope(shield=True):
            co = live.coordination
            stored = StoredOp(f"op_{uuid.uuid4().hex}", session.id, op.kind, list(op.args),
                              live.holder_id, co.now())
            await live.register()  # it beats: while it does, nobody takes the row over
            await co.queue_op(stored, own=True)
            try:
                await check(stored.id)
            except (MnemoError, RuntimeError):
                await co.drop_ops([stored.id])
                raise
        op.queued, op.at = stored.id, stored.created_at
        accept(session, op)
        session.pending.append(op)
    start_next(live, session)


async def _check_stored(live: Sessions, session: SessionRecord, kind: str,
                        op_id: str | None = None) -> None:
    """`check_queue` for `kind` behind the session's stored operations, whichever Memory
    accepted them, unanswered, accepted before `op_id` (None: all of them)."""
    queued = await live.coordination.queued_ops(session.id)
    ids = [i for i, _, _ in queued]
    if op_id is not None and op_id not in ids:
        return  # answered already (run where the work ended): it was accepted
    kinds = [k for _, k, _ in queued[:ids.index(op_id) if op_id in ids else len(ids)]]
    check_queue(session, len(kinds), projection(session, [*kinds, kind]))


def _start(live: Sessions, session: SessionRecord, op: Op) -> None:
    """Runs `op`; an append takes its turn among the appends now (a queued one when it starts:
    a sync append in the callback of the operation before it goes first)."""
    if op.kind == "append" and op.ticket is None:
        op.ticket = session.ticket_queue.take()
    session.running = op
    live.spawn(session, _run_op, live, session, op)


def awaits_handover(live: Sessions, session: SessionRecord) -> bool:
    """Stored operations are being handed over to the queue: a call made now queues behind them."""
    return session.handing_over > 0 and bool(live.remote.get(session.id))


@contextmanager
def handing_over(live: Sessions, session: SessionRecord) -> Iterator[None]:
    """Marks work that ends by handing stored operations over; once it ends, the queue starts."""
    session.handing_over += 1
    try:
        yield
    finally:
        session.handing_over -= 1
        session.notify()
        start_next(live, session)


async def _run_op(live: Sessions, session: SessionRecord, op: Op) -> None:
    """Runs an accepted operation and reports it: exactly one callback, whatever happens."""
    try:
        co = live.coordination
        if op.queued is not None and not await co.drop_queued(op.queued, live.holder_id):
            raise MnemoError(f"{op.kind} {op.queued} was taken over by a Memory that took this "
                             "one for gone: not run here")
        if op.stored is not None and not await co.still_taken(op.stored, live.holder_id):
            raise MnemoError(f"{op.kind} {op.stored} was answered as failed by the Memory that "
                             "accepted it, which took this one for gone: not run")
        if op.kind == "append":
            assert op.ticket is not None
            observation, action = op.args
            await registry.run_append(live, session, op.ticket, observation, action, None, op)
        else:
            await transitions.call(live, session, op.kind, op.args, op)
    except Exception as exc:
        # Shielded: finding the session ended cancels this task; the callbacks are owed.
        with anyio.CancelScope(shield=True):
            ended = not await _still_live(live, session)
            # The later ones are taken out at once: nothing may start one while callbacks run.
            later = _take_pending(session)
            # Ended through another Memory: answered as `end_session` answers.
            await _finish_op(session, op, failure(session, "session_ended") if ended
                             else OpResult(False, None, as_session_error(exc, session)))
            await _fail(live, session, later, "session_ended" if ended else "preceding_op_failed")
    except BaseException:
        with anyio.CancelScope(shield=True):  # a stored step is appended, annotated later
            stored = op.kind == "append" and op.applied and not session.ended
            reason = "session_ended" if session.ended else "memory_closed"
            await _finish_op(session, op, OpResult(True, VALUES[op.kind]) if stored
                             else failure(session, reason))
        raise
    else:
        await _finish_op(session, op, OpResult(True, VALUES[op.kind]))
    start_next(live, session)


async def _still_live(live: Sessions, session: SessionRecord) -> bool:
    """Whether the store still holds the session of a failed operation (one ended elsewhere is
    dropped here); a store that cannot say counts as live."""
    if session.ended:
        return False
    try:
        if await live.store.version(session.id) is not None:
            return True
    except MnemoError as exc:
        log.warning("%s: could not tell whether it still exists: %r", session.id, exc)
        return True
    await live.forget(session)
    return False


async def _finish_op(session: SessionRecord, op: Op, result: OpResult) -> None:
    """Ends the operation, then calls it back (a close in the callback finds it over, an
    append in it its turn passed on, by one that failed before its turn too)."""
    if op.kind == "append":
        session.appends_in_flight -= 1
        if op.ticket is not None:
            session.ticket_queue.leave(op.ticket)
    if session.running is op:
        session.running = None
    session.notify()
    called = CALLED_BACK.set(session)
    try:
        await deliver(op.callback, result)
    finally:
        CALLED_BACK.reset(called)


def start_next(live: Sessions, session: SessionRecord) -> None:
    """Starts the next queued operation if nothing holds the session."""
    if session.ended or session.running is not None or not session.pending:
        return
    if awaits_handover(live, session):
        return  # started once what this Memory stored is queued
    if session.state is State.EXTRACTING or session.background:
        return
    _start(live, session, session.pending.popleft())


async def fail_pending(live: Sessions, session: SessionRecord, reason: str) -> None:
    """Answers every queued operation with `SessionError(reason)`, all taken out of the queue
    before the first callback runs."""
    await _fail(live, session, _take_pending(session), reason)


def _take_pending(session: SessionRecord) -> list[Op]:
    """Empties the queue (an append taken out is in flight no more); returns what it held."""
    taken = list(session.pending)
    session.pending.clear()
    for op in taken:
        if op.kind == "append":
            session.appends_in_flight -= 1
            if op.ticket is not None:
                session.ticket_queue.leave(op.ticket)
    if taken:
        session.notify()
    return taken


async def _fail(live: Sessions, session: SessionRecord, ops: list[Op], reason: str) -> None:
    """Answers `ops` unrun, their rows forgotten first (a row left is logged: run by a
    Memory that takes this one's work over)."""
    queued = [op.queued for op in ops if op.queued is not None]
    try:
        await live.coordination.drop_ops(queued)
    except (MnemoError, RuntimeError) as exc:  # RuntimeError: the store has closed
        log.warning("%s: %d queued operations answered %r left in the store: %r",
                    session.id, len(queued), reason, exc)
    for op in ops:
        await deliver(op.callback, failure(session, reason))


# After storage faults in a row, the watcher pauses up to this many intervals.
WATCH_BACKOFF = 64


def watch(live: Sessions, session: SessionRecord) -> None:
    """Waits, while operations this Memory stored wait for work held elsewhere, for their
    results (then calls back), or for the work to end with nobody to run them (runs them)."""
    if session.watching:
        return
    session.watching = True

    async def wait_for_the_store() -> None:
        token: int | None = None
        faults = 0
        try:
            while live.remote.get(session.id):
                try:
                    current = await live.coordination.change_token()
                    if current == token:
                        await anyio.sleep(transitions.POLL_INTERVAL)
                        continue
                    await deliver_results(live, session)
                    if not live.remote.get(session.id):
                        break
                    try:
                        await live.fetch(session.id, fresh=True)
                    except NotFoundError:
                        await fail_remote(live, session, "session_ended")
                        break
                    if session.state is not State.EXTRACTING:
                        await run_stored(live, session)
                except StorageError as exc:
                    # The results are in the store: a fault ends nothing.
                    faults += 1
                    log.warning("%s: waiting for operations held elsewhere: %s (attempt %d)",
                                session.id, exc, faults)
                    await anyio.sleep(transitions.POLL_INTERVAL * min(2**faults, WATCH_BACKOFF))
                    continue
                token, faults = current, 0
        finally:
            session.watching = False

    try:
        live.spawn(session, wait_for_the_store, waiting=True)
    except RuntimeError:  # the Memory closed after the entry was kept: its close answers it
        session.watching = False


async def deliver_results(live: Sessions, session: SessionRecord) -> None:
    mine = live.remote.get(session.id, [])
    results = await live.coordination.op_results([op_id for op_id, _, _ in mine])
    if not results:
        return
    # Dropped from the store before forgotten here: after a fault the next look finds the same.
    await live.coordination.drop_ops([op_id for op_id, _, _ in mine if op_id in results])
    for op_id, _, callback in claim_waiting(live, session.id, results):
        await deliver(callback, results[op_id].result(session.state, session.id))


def claim_waiting(
    live: Sessions, session_id: str, op_ids: Collection[str]
) -> list[tuple[str, str, Callback | None]]:
    """Takes the entries of `op_ids` out of what this Memory waits for, in order, at once (no
    await in between): two paths that both found one answered call back once."""
    entries = live.remote.get(session_id, [])
    claimed = [entry for entry in entries if entry[0] in op_ids]
    entries[:] = [entry for entry in entries if entry[0] not in op_ids]
    return claimed


async def run_stored(live: Sessions, session: SessionRecord) -> None:
    """Takes the session's stored operations nobody took yet and queues them here in order
    (after a failed extraction they fail "extraction_failed"), each result going to the Memory
    that accepted it; then starts the queue. One taker at a time; a call made meanwhile
    queues behind them. StorageError: the stored operations could not be taken (they stay
    stored; the queue starts all the same)."""
    with handing_over(live, session):
        async with session.taking:
            with anyio.CancelScope(shield=True):
                await _take_stored(live, session)


async def _take_stored(live: Sessions, session: SessionRecord) -> None:
    await live.register()  # it beats: one that stops has left them (`answer_abandoned`)
    co = live.coordination
    # Also what a gone holder queued here, as the Memory that takes its work over.
    taken = await co.take_ops(session.id, live.holder_id, co.now() - live.lease,
                              await live.gone())
    # An operation whose Memory closed before it ran has nobody to call back: its row goes.
    orphans = [op.id for op in taken if not op.accepted_by]
    try:
        await live.coordination.drop_ops(orphans)
    except StorageError as exc:
        log.warning("%s: %d finished operation rows left in the store: %s",
                    session.id, len(orphans), exc)
    # Taken by the Memory that accepted them, they are its queue's (`Op.queued`).
    ops: list[Op] = []
    for stored in taken:
        claimed = claim_waiting(live, session.id, {stored.id})
        op = Op(stored.kind, tuple(stored.args), claimed[0][2] if claimed else None,
                at=stored.created_at)
        if claimed:
            op.queued = stored.id
        elif stored.accepted_by:
            # Its result goes to the store, for the Memory that accepted it.
            op.callback, op.stored = partial(_store_result, live, session, stored.id), stored.id
        ops.append(op)
    if session.state is State.FAILED:
        await _fail(live, session, ops, "extraction_failed")
        return
    for op in ops:
        accept(session, op)
    # In the order they were accepted, wherever; those this Memory queued itself keep theirs.
    merged = list(heapq.merge(session.pending, ops, key=lambda o: o.at.timestamp() if o.at else 0))
    session.pending.clear()
    session.pending.extend(merged)


# A result for another Memory is stored again after a fault, pausing from `POLL_INTERVAL` up,
# for this many seconds in the callback, then in the background while this Memory is open.
FINISH_BUDGET = 10.0


async def _store_result(
    live: Sessions, session: SessionRecord, op_id: str, outcome: OpResult
) -> None:
    """Stores another Memory's operation's result, trying again after a fault (`FINISH_BUDGET`)."""
    result = StoredResult.of(outcome)
    with anyio.move_on_after(FINISH_BUDGET):
        await _keep_storing(live, op_id, result)
        return
    try:
        live.spawn(session, _keep_storing, live, op_id, result, waiting=True)
    except RuntimeError:  # the Memory is closing: its group runs no new task
        log.error("%s: its result could not be stored in %.0f s, and this Memory closes: "
                  "the Memory that accepted it answers it once this one retires", op_id,
                  FINISH_BUDGET)
        return
    log.error("%s: its result could not be stored in %.0f s; still trying", op_id,
              FINISH_BUDGET)


async def _keep_storing(live: Sessions, op_id: str, result: StoredResult) -> None:
    for attempt in itertools.count(1):
        try:
            await live.coordination.finish_op(op_id, result)
            return
        except StorageError as exc:
            log.warning("%s: storing its result failed (attempt %d): %r", op_id, attempt, exc)
        await anyio.sleep(transitions.POLL_INTERVAL * 2 ** min(attempt - 1, 6))


async def fail_remote(live: Sessions, session: SessionRecord, reason: str) -> None:
    """Answers every operation this Memory stored for the session: one that ran first with its
    stored result, the others with `reason`; on a close they stay stored, an ended session's
    are dropped."""
    with suppress(MnemoError, RuntimeError):  # unread (a fault, a closed store): `reason`
        await deliver_results(live, session)
    entries = live.remote.pop(session.id, [])
    ids = [op_id for op_id, _, _ in entries]
    try:
        if ids and reason == "memory_closed":
            await live.coordination.orphan_ops(ids)
        elif ids and reason == "session_ended":
            await live.coordination.drop_ops(ids)
    except (MnemoError, RuntimeError) as exc:  # RuntimeError: the store has closed
        log.warning("%s: could not leave or drop its stored operations: %r", session.id, exc)
    for _, _, callback in entries:
        await deliver(callback, failure(session, reason))


async def _store_for(live: Sessions, session: SessionRecord, kind: str,
                     args: tuple[Any, ...], callback: Callback | None) -> None:
    """Accepts an operation for a session whose extraction another Memory holds: stored with
    the session, run by whoever ends that work, called back here. Raises SessionError as
    `submit`, NotFoundError if the session ended, RuntimeError once the Memory has closed."""
    if live.closing:  # a callback of the close itself, say, which holds `storing`
        raise RuntimeError("the Memory has closed")
    # From the check to the append, one call at a time (else both could pass the bound).
    async with session.storing:
        if session.ended:
            raise NotFoundError("session", session.id)
        if live.closing:
            raise RuntimeError("the Memory has closed")
        await _check_stored(live, session, kind)
        op_id = f"op_{uuid.uuid4().hex}"
        await live.register()  # it beats: its answer is kept for it (`forget_orphans`)
        co = live.coordination
        # Once written, a cancelled caller leaves no row without its watcher.
        with anyio.CancelScope(shield=True):
            await co.queue_op(StoredOp(op_id, session.id, kind, list(args), live.holder_id,
                                       co.now()))
            live.remote.setdefault(session.id, []).append((op_id, kind, callback))
            if session.ended:  # while its row was written: the end did not answer it
                await fail_remote(live, session, "session_ended")
                return
            try:  # another Memory's, accepted meanwhile, may come before it
                await _check_stored(live, session, kind, op_id)
            except MnemoError:
                if claim_waiting(live, session.id, {op_id}):  # else answered: accepted
                    await co.drop_ops([op_id])
                    raise
    watch(live, session)


async def answer_ended(live: Sessions, session: SessionRecord) -> None:
    """Answers `session_ended` to what an ended session owed: queued and stored operations."""
    await fail_pending(live, session, "session_ended")
    await fail_remote(live, session, "session_ended")
