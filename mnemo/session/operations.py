"""The async operation queue of each session (API.md, "The async operation queue").

`submit` accepts an operation: it runs now when the session is free, else it waits in the
session's `pending` queue, accepted only if the projected state (`queue.project`) allows it.
`kick` starts the next one once nothing holds the session (no running operation, no
extraction, no background commit). Each accepted operation gets exactly one callback: its
result, or a `SessionError` when it, or one before it, failed, or the session ended.
"""

from __future__ import annotations

from typing import Any

import anyio

from mnemo.errors import EmbeddingError, LLMError, SessionError
from mnemo.inputs import check_text
from mnemo.session import transitions
from mnemo.session.machine import Move, State, answer
from mnemo.session.queue import VALUES, Callback, Op, OpResult, deliver, project
from mnemo.session.records import SessionRecord, check_step
from mnemo.session.registry import Sessions

S = State


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
            "invalid_queued_operation" (API.md's queue rules).
    """
    session_id = session.id
    if kind == "append":
        check_step(session.config, args[0], args[1], None)
    elif kind == "start_episode":
        check_text(args[0], "goal", limit=session.config.max_text_chars)
    if session.state is S.FAILED:
        raise SessionError("session_failed", state=session.state, session_id=session_id)
    op = Op(kind, args, callback)
    if session.busy:
        if len(session.pending) >= session.config.max_pending_ops:
            raise SessionError(
                "pending_queue_full", state=session.state, session_id=session_id
            )
        if _projection(session, op) is None:
            raise SessionError(
                "invalid_queued_operation", state=session.state, session_id=session_id
            )
        _accept(session, op)
        session.pending.append(op)
        if session.state is S.EXTRACTING and not session.scopes:
            watch(live, session)
        return
    verdict = answer(session.state, kind)
    if not isinstance(verdict, Move) or (kind == "close" and session.appends_in_flight):
        raise SessionError("invalid_operation", state=session.state, session_id=session_id)
    _accept(session, op)
    session.running = op
    live.spawn(session, _run_op, live, session, op)


def _accept(session: SessionRecord, op: Op) -> None:
    if op.kind == "append":
        session.appends_in_flight += 1
        op.ticket = session.turnstile.take()


def _projection(session: SessionRecord, op: Op) -> State | None:
    auto = session.config.auto_commit
    if session.state is S.EXTRACTING:
        start = S.IDLE if auto else S.READY
        ops: list[Op] = []
    else:
        start = session.state
        ops = [session.running] if session.running and not session.running.applied else []
    return project(start, [*ops, *session.pending, op], auto_commit=auto)


async def _run_op(live: Sessions, session: SessionRecord, op: Op) -> None:
    """Runs an accepted operation and reports it: exactly one callback, whatever happens
    (issue 9: an error that was not a `MnemoError` used to leave `running` set, so the
    session's queue never moved again and no callback came)."""
    try:
        await _execute(live, session, op)
    except Exception as exc:
        await _finish_op(session, op, OpResult(False, None, _as_session_error(exc, session)))
        await fail_pending(session, "preceding_op_failed")
    except BaseException:
        # Cancelled: by `end_session` or by the Memory closing. The callback still comes.
        with anyio.CancelScope(shield=True):
            reason = "session_ended" if session.ended else "memory_closed"
            await _finish_op(session, op, OpResult(False, None, SessionError(
                reason, state=session.state, session_id=session.id)))
        raise
    else:
        await _finish_op(session, op, OpResult(True, VALUES[op.kind]))
    finally:
        if op.kind == "append":
            session.appends_in_flight -= 1
        if session.running is op:
            session.running = None
    kick(live, session)


async def _finish_op(session: SessionRecord, op: Op, result: OpResult) -> None:
    op.done = True
    if session.running is op:
        session.running = None
    await deliver(op.callback, result)


async def _execute(live: Sessions, session: SessionRecord, op: Op) -> None:
    if op.kind == "append":
        assert op.ticket is not None
        observation, action = op.args
        await transitions.append(live, session, op.ticket, observation, action, None)
    elif op.kind == "close":
        transitions.refuse_close(session)
        await transitions.close(live, session, op)
    else:
        transitions.refuse_unless(session, op.kind)
        if op.kind == "commit":
            await transitions.commit(live, session, op)
        elif op.kind == "discard":
            await transitions.discard(live, session, op)
        else:
            await transitions.start_episode(live, session, op.args[0], op=op)


# How often a session whose work another Memory holds looks at the store's change token
# while operations wait for that work (a cheap read; the session is read again only when the
# token moved).
WATCH_INTERVAL = 0.05


def watch(live: Sessions, session: SessionRecord) -> None:
    """Waits, while another Memory extracts the session and operations queued here wait for
    it, until the store shows the extraction over; then runs them (or fails them, after a
    failed extraction), here, where they were accepted."""
    if session.watching:
        return
    session.watching = True

    async def wait_for_the_store() -> None:
        token: int | None = None
        try:
            while session.pending and not session.ended and session.state is S.EXTRACTING:
                current = await live.coordination.change_token()
                if current != token:
                    token = current
                    await live.fetch(session.id, fresh=True)
                    continue
                await anyio.sleep(WATCH_INTERVAL)
        finally:
            session.watching = False
        if session.state is S.FAILED:
            await fail_pending(session, "extraction_failed")
        else:
            kick(live, session)

    live.spawn(session, wait_for_the_store)


def kick(live: Sessions, session: SessionRecord) -> None:
    """Starts the next queued operation if nothing holds the session."""
    if session.ended or session.running is not None or not session.pending:
        return
    if session.state is S.EXTRACTING or session.background:
        return
    op = session.pending.popleft()
    session.running = op
    live.spawn(session, _run_op, live, session, op)


async def fail_pending(session: SessionRecord, reason: str) -> None:
    """Answers every queued operation with a `SessionError(reason)` and empties the queue."""
    while session.pending:
        op = session.pending.popleft()
        if op.kind == "append":
            session.appends_in_flight -= 1
            if op.ticket is not None:
                session.turnstile.leave(op.ticket)
        error = SessionError(reason, state=session.state, session_id=session.id)
        await deliver(op.callback, OpResult(False, None, error))


def _as_session_error(exc: Exception, session: SessionRecord) -> SessionError:
    """The `SessionError` an async operation's callback receives for `exc`."""
    if isinstance(exc, SessionError):
        return exc
    reason = (
        "llm_failed" if isinstance(exc, LLMError)
        else "embedding_failed" if isinstance(exc, EmbeddingError)
        else "operation_failed"
    )
    error = SessionError(reason, state=session.state, session_id=session.id)
    error.__cause__ = exc
    return error
