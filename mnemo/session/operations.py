"""The async operation queue of each session (the API contract, "The async operation queue").

`submit` accepts an operation: it runs now when the session is free, else it waits in the
session's `pending` queue, accepted only if the projected state (`queue.project`) allows it.
`start_next` starts the next one once nothing holds the session (no running operation, no
extraction, no background commit). Each accepted operation gets exactly one callback: its
result, or a `SessionError` when it, or one before it, failed, or the session ended.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio

from mnemo.errors import (
    MnemoError,
    SessionError,
)
from mnemo.inputs import check_text
from mnemo.session import transitions
from mnemo.session.machine import Move, State, answer
from mnemo.session.queue import VALUES, Callback, Op, OpResult, deliver, project
from mnemo.session.records import SessionRecord, check_step
from mnemo.session.registry import Sessions

S = State

log = logging.getLogger("mnemo")


def submit(
    live: Sessions,
    session: SessionRecord,
    kind: str,
    args: tuple[Any, ...],
    callback: Callback | None,
) -> None:
    """Accepts an async operation: runs it now when the session is free, else queues it.

    Raises:
        SessionError: "session_failed", "pending_queue_full", "invalid_operation" or
            "invalid_queued_operation" (the API contract's queue rules).
    """
    session_id = session.id
    check_args(session, kind, args)
    if session.state is S.FAILED:
        raise SessionError("session_failed", state=session.state, session_id=session_id)
    op = Op(kind, args, callback)
    if session.busy or awaits_handover(live, session):
        stored = _stored_here(live, session)
        if len(stored) + len(session.pending) >= session.config.max_pending_ops:
            raise SessionError(
                "pending_queue_full", state=session.state, session_id=session_id
            )
        if _projection(session, [*stored, *session.pending, op]) is None:
            raise SessionError(
                "invalid_queued_operation", state=session.state, session_id=session_id
            )
        accept(session, op)
        session.pending.append(op)
        return
    verdict = answer(session.state, kind)
    if not isinstance(verdict, Move) or (kind == "close" and session.appends_in_flight):
        raise SessionError("invalid_operation", state=session.state, session_id=session_id)
    accept(session, op)
    session.running = op
    live.spawn(session, _run_op, live, session, op)


def check_args(session: SessionRecord, kind: str, args: tuple[Any, ...]) -> None:
    """Raises InvalidInputError for an operation's text past the session's bounds."""
    if kind == "append":
        check_step(session.config, args[0], args[1], None)
    elif kind == "start_episode":
        check_text(args[0], "goal", limit=session.config.max_text_chars)


def accept(session: SessionRecord, op: Op) -> None:
    if op.kind == "append":
        session.appends_in_flight += 1
        op.ticket = session.ticket_queue.take()


def awaits_handover(live: Sessions, session: SessionRecord) -> bool:
    """Operations this Memory stored are being handed over to the session's queue (by its
    extraction's end, or a take): they were accepted first, so a call made now queues behind
    them, and the queue waits for them (a `start_episode` made then was checked against
    `ready` alone, and refused)."""
    return session.handing_over > 0 and bool(live.remote.get(session.id))


@contextmanager
def handing_over(live: Sessions, session: SessionRecord) -> Iterator[None]:
    """Marks work that ends by handing stored operations over (`awaits_handover`); once it
    ends, however, the session's queue starts."""
    session.handing_over += 1
    try:
        yield
    finally:
        session.handing_over -= 1
        session.notify()
        start_next(live, session)


def _stored_here(live: Sessions, session: SessionRecord) -> list[Op]:
    """The operations this Memory stored for the session while another Memory held its
    extraction, not yet taken: accepted before any it queued since it took the work over,
    so they come first in its queue (they are taken to its front: `stored.run_stored`)."""
    return [Op(kind, (), None) for _, kind, _ in live.remote.get(session.id, [])]


def _projection(session: SessionRecord, queued: list[Op]) -> State | None:
    """The state after the running operation (if not applied yet) and `queued`."""
    auto = session.config.auto_commit
    if session.state is S.EXTRACTING:
        start = S.IDLE if auto else S.READY
        ops: list[Op] = []
    else:
        start = session.state
        ops = [session.running] if session.running and not session.running.applied else []
    return project(start, [*ops, *queued], auto_commit=auto)


async def _run_op(live: Sessions, session: SessionRecord, op: Op) -> None:
    """Runs an accepted operation and reports it: exactly one callback, whatever happens
    (an error that is not a `MnemoError` clears `running` too, so the
    session's queue moves on and the callback comes)."""
    try:
        await _still_taken(live, op)
        await _execute(live, session, op)
    except Exception as exc:
        # Shielded: finding the session ended drops it, which cancels this task, and the
        # callbacks are owed all the same.
        with anyio.CancelScope(shield=True):
            ended = not await _still_live(live, session)
            # The later ones are taken out at once: while the callbacks run, nothing else (a
            # background commit ending) may start one of them.
            later = _take_pending(session)
            if ended:
                # Ended through another Memory (the store no longer knows it, and the record
                # went): what `end_session` answers for the operations it stops.
                await _finish_op(session, op, OpResult(False, None, SessionError(
                    "session_ended", state=session.state, session_id=session.id)))
                await _fail(session, later, "session_ended")
            else:
                await _finish_op(
                    session, op, OpResult(False, None, _as_session_error(exc, session))
                )
                await _fail(session, later, "preceding_op_failed")
    except BaseException:
        # Cancelled: by `end_session` or by the Memory closing. The callback still comes.
        with anyio.CancelScope(shield=True):
            reason = "session_ended" if session.ended else "memory_closed"
            await _finish_op(session, op, OpResult(False, None, SessionError(
                reason, state=session.state, session_id=session.id)))
        raise
    else:
        await _finish_op(session, op, OpResult(True, VALUES[op.kind]))
    start_next(live, session)


async def _still_live(live: Sessions, session: SessionRecord) -> bool:
    """Whether the session of a failed operation still exists: ended through another Memory
    meanwhile (which may be why the operation failed: the Memory that stored it answered it
    `session_ended` and dropped its row), the operations behind it are answered
    `session_ended`, not `preceding_op_failed`. A store that cannot say counts as live."""
    try:
        return await live.still_live(session)
    except MnemoError as exc:
        log.warning("%s: could not tell whether it still exists: %r", session.id, exc)
        return not session.ended


async def _still_taken(live: Sessions, op: Op) -> None:
    """Raises when `op` came from the store and the Memory that accepted it has answered it
    meanwhile, having taken this one for gone (a heartbeat late for a lease): run now, it
    would have been done after its caller heard it failed.

    Raises:
        MnemoError: saying so (`_run_op` reports it as "operation_failed", its cause).
    """
    if op.stored is None or live.holder_id is None:
        return
    if not await live.coordination.still_taken(op.stored, live.holder_id):
        raise MnemoError(
            f"{op.kind} {op.stored} was answered as failed by the Memory that accepted it, "
            "which took this one for gone: not run"
        )


async def _finish_op(session: SessionRecord, op: Op, result: OpResult) -> None:
    """Ends the operation, then calls it back: what the callback does next (a close after
    an append's "appended") finds it over, not in progress."""
    op.done = True
    if op.kind == "append":
        session.appends_in_flight -= 1
    if session.running is op:
        session.running = None
    session.notify()
    await deliver(op.callback, result)


async def _execute(live: Sessions, session: SessionRecord, op: Op) -> None:
    if op.kind == "append":
        assert op.ticket is not None
        observation, action = op.args
        await transitions.Append(live, session, observation, action, None).run(op.ticket)
    elif op.kind == "close":
        transitions.refuse_close(session, queued=True)
        await transitions.close(live, session, op)
    else:
        transitions.refuse_unless(session, op.kind)
        if op.kind == "commit":
            await transitions.commit(live, session, op)
        elif op.kind == "discard":
            await transitions.discard(live, session, op)
        else:
            await transitions.start_episode(live, session, op.args[0], op=op)


def start_next(live: Sessions, session: SessionRecord) -> None:
    """Starts the next queued operation if nothing holds the session."""
    if session.ended or session.running is not None or not session.pending:
        return
    if awaits_handover(live, session):
        return  # started once what this Memory stored is queued
    if session.state is S.EXTRACTING or session.background:
        return
    op = session.pending.popleft()
    session.running = op
    live.spawn(session, _run_op, live, session, op)


async def fail_pending(session: SessionRecord, reason: str) -> None:
    """Answers every queued operation with a `SessionError(reason)` and empties the queue:
    all are taken out before the first callback runs, so none of them starts meanwhile."""
    await _fail(session, _take_pending(session), reason)


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


async def _fail(session: SessionRecord, ops: list[Op], reason: str) -> None:
    for op in ops:
        error = SessionError(reason, state=session.state, session_id=session.id)
        await deliver(op.callback, OpResult(False, None, error))


def _as_session_error(exc: Exception, session: SessionRecord) -> SessionError:
    """The `SessionError` an async operation's callback receives for `exc`."""
    if isinstance(exc, SessionError):
        return exc
    # The API contract: whatever it was (an LLMError, an EmbeddingError, a foreign error), the
    # caller tells it by the cause, not by a reason of its own.
    error = SessionError("operation_failed", state=session.state, session_id=session.id)
    error.__cause__ = exc
    return error
