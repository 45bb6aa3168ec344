"""`SessionService`: every live session of one Memory, and the calls a Memory makes on them.

The work is split by concern, each module a set of functions over one shared `Sessions`:

- `machine.py`: the state table that `transitions` drives, and the record it moves;
- `registry.py`: `Sessions`, this Memory as a holder of work, and step claims;
- `transitions.py`: the machine's moves (`move`) and what each call writes; a move names what
  it starts (`machine.Effect`), and does not start it itself;
- `extracting.py`: starts those effects: the annotation of steps, the extraction runner and
  auto-commit's background commits;
- `operations.py`: the async operation queue, and operations stored for another Memory;
- `timers.py`: auto-commit's deadlines, the end of idle sessions, the heartbeat and the
  takeover of work a gone holder left.

Imports point one way, down this list read from the bottom: no module imports one that
imports it. This module checks a call's input, finds its session, and hands it to them (an
append goes from `Memory.append` to `transitions.append` directly); it also restores the
sessions a store holds, and hosts the task group of their background work.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Callable
from typing import Any

import anyio

from mnemo.config import DEFAULT_IDLE_SESSION_TIMEOUT, Config
from mnemo.episode import EpisodeRecord
from mnemo.errors import (
    InvalidInputError,
    NotFoundError,
    PipelineError,
    SessionError,
    StorageError,
)
from mnemo.extraction.contradiction import intent_policy
from mnemo.extraction.pipeline import failure_reason
from mnemo.graph.model import CommitReceipt
from mnemo.graph.ports import IntentPolicy
from mnemo.graph.scope import Metadata
from mnemo.inputs import check_text
from mnemo.ports import LLM
from mnemo.session import operations, timers, transitions
from mnemo.session.machine import (
    Callback,
    Runtime,
    SessionContext,
    SessionInfo,
    SessionRecord,
    State,
    project,
    refuse_close,
)
from mnemo.session.ports import LiveSession, StoredOp
from mnemo.session.registry import Sessions

log = logging.getLogger("mnemo")

S = State


class SessionService:
    """All sessions of one `Memory`."""

    def __init__(
        self, live: Sessions, *, idle_session_timeout: float = DEFAULT_IDLE_SESSION_TIMEOUT,
        last_answer: Callable[[str], float | None] | None = None,
    ) -> None:
        # When a model call of a session last ended here: an extraction still being answered
        # is waited for past its deadline's length (its calls may queue for a slow server).
        self._last_answer = last_answer
        self._live = live
        live.idle_within(idle_session_timeout)
        self._host: asyncio.Task[None] | None = None
        self._stop = anyio.Event()

    # ---- life of the service -------------------------------------------------------------

    async def start(self) -> None:
        """Starts the background work (`run`) in a task group hosted by a dedicated asyncio
        task; returns once it started. Not in the caller's task: a task group must be left by
        the task that entered it, and pytest-asyncio (or any framework that opens a resource
        in one task and closes it in another) closes a Memory from another task.

        Raises:
            Exception: whatever `run` raised before it started.
        """
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stop = anyio.Event()

        async def host() -> None:
            try:
                async with anyio.create_task_group() as tg:
                    await tg.start(self.run)
                    started.set_result(None)
                    await self._stop.wait()
                    tg.cancel_scope.cancel()
            except BaseException as exc:
                if not started.done():
                    started.set_exception(exc)
                    return
                raise

        self._host = asyncio.get_running_loop().create_task(host(), name="mnemo-host")
        await started

    async def stop(self) -> bool:
        """Cancels the background work and waits until it is gone; False when it was not
        running."""
        task, self._host = self._host, None
        if task is None:
            return False
        self._stop.set()
        with anyio.CancelScope(shield=True):
            await asyncio.wait({task})
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
        return True

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Owns every background task; returns when cancelled."""
        live = self._live
        try:
            async with anyio.create_task_group() as tg:
                live.tg = tg
                tg.start_soon(timers.run, live, self._expire_end)
                tg.start_soon(timers.sweep, live)
                await tg.start(timers.holder, live)
                task_status.started()
                await anyio.sleep_forever()
        finally:
            # Every accepted operation gets its callback, even when the Memory closes first;
            # one being stored for another Memory is waited for (`SessionRecord.storing`),
            # and answered with the rest.
            live.closing = True
            with anyio.CancelScope(shield=True):
                for session in list(live.by_id.values()):
                    await operations.fail_pending(session, "memory_closed")
                    async with session.storing:
                        await operations.fail_remote(live, session, "memory_closed")

    async def end_idle(self) -> None:
        """Ends the store's idle sessions that came due (`timers.end_idle`: at most one
        sweep's worth, the rest after); a store fault is logged, and the sweep tries again
        once the Memory runs."""
        try:
            await timers.end_idle(self._live)
        except StorageError as exc:
            log.warning("idle sessions could not be ended: %r", exc)

    def restore(self, live: list[LiveSession]) -> None:
        """Knows the sessions that had not ended. An extraction among them goes on when it
        is nobody's any more and this Memory's model for its repo is the one it started with
        (`timers.take_over`: the API contract, work is resumed only by a matching model)."""
        for row in live:
            if row.id not in self._live.by_id:  # the takeover task may have taken it already
                self._live.adopt(row)
        self._live.look.set()

    def resume_repo(self, repo: str) -> None:
        """A repo was opened (perhaps with the model an interrupted extraction needs): the
        takeover task looks for work again."""
        self._live.look.set()

    # ---- sessions --------------------------------------------------------------------------

    async def start_session(
        self, goal: str, *, repo: str, override: Runtime | None, config: Config,
        metadata: Metadata | None = None,
    ) -> str:
        check_text(goal, "goal", limit=config.max_text_chars)
        session_id = f"session_{uuid.uuid4().hex}"
        episode = EpisodeRecord(f"episode_{uuid.uuid4().hex}", goal)
        live = self._live
        holder = until = None
        if config.auto_commit:
            # Its timers are this Memory's: the store says so, so that no other Memory that
            # reads or restores it flushes or expires it, and another takes them over when
            # this one goes (`timers.take_over`).
            await live.register()
            holder, until = live.holder_id, live.lease_until()
        await live.store.create_session(
            session_id, repo, config, episode, holder=holder, lease_until=until,
            metadata=metadata,
        )
        session = live.add(session_id, repo, S.COLLECTING, config, override)
        session.metadata = dict(metadata or {})
        session.episode = episode
        session.driven = holder is not None
        live.touch(session)
        await self._live.events.emit(
            "transition", session_id=session_id, repo=repo, **{"from": None, "to": S.COLLECTING}
        )
        return session_id

    async def state_of(self, session_id: str) -> State:
        """The session's state as the store holds it now. Reads only."""
        return (await self._live.fetch(session_id, fresh=True)).state

    async def context(self, session_id: str, steps: int = 5) -> SessionContext | None:
        """Reads only."""
        session = await self._live.fetch(session_id, fresh=True)
        if session.state is S.IDLE or session.episode is None:
            return None
        recent = [step.line for step in session.episode.steps[-steps:]] if steps else []
        return SessionContext(session.episode.goal, recent)

    async def list_sessions(self) -> list[SessionInfo]:
        """Every live session in the store (started through any Memory), oldest first; an
        idle one with its last episode's goal. Reads only: it never resumes a restored
        session's extraction, nor ends an idle one, so looking does not start work."""
        return [
            SessionInfo(
                s.id,
                s.repo,
                s.state,
                s.goal,
                len(s.episode.steps) if s.episode is not None and s.state is not S.IDLE else 0,
                s.holder if s.state is S.EXTRACTING else None,
                s.lease_until if s.state is S.EXTRACTING else None,
            )
            for s in await self._live.store.load_live()
        ]

    async def _expire_end(self, session_id: str, version: int) -> None:
        await self.end_session(session_id, version=version)

    async def end_session(self, session_id: str, *, version: int | None = None) -> None:
        """Stops the session: its background work is cancelled, queued operations get
        "session_ended", and its id becomes unknown. Uncommitted steps stay in the log.

        Raises:
            StaleSession: given `version` (an expiry), the session moved on from it.
        """
        session = await self._live.fetch(session_id)
        # Stored first: if the store refuses, nothing has changed and the session goes on.
        await self._live.store.end(session_id, version=version)
        if session.ended:  # ended by another call while this one waited for the store
            return
        self._live.drop(session)
        # Shielded: the caller may be one of the session's own tasks (its expiry, or an
        # operation whose callback ends it), which the drop has just cancelled; the queued
        # operations still get their callbacks.
        with anyio.CancelScope(shield=True):
            await answer_ended(self._live, session)

    # ---- the sync calls ----------------------------------------------------------------------

    async def start_episode(self, session_id: str, goal: str) -> None:
        session = await self._live.fetch(session_id)
        check_text(goal, "goal", limit=session.config.max_text_chars)
        await transitions.refuse_checked(self._live, session, "start_episode")
        await transitions.start_episode(self._live, session, goal)

    async def close(self, session_id: str) -> None:
        await transitions.call(self._live, await self._live.fetch(session_id, fresh=True), "close")

    async def commit(self, session_id: str) -> CommitReceipt | None:
        session = await self._live.fetch(session_id, fresh=True)
        return await transitions.call(self._live, session, "commit")

    async def discard(self, session_id: str) -> None:
        await transitions.call(self._live, await self._live.fetch(session_id, fresh=True),
                               "discard")

    async def close_and_commit(
        self, session_id: str, *, max_retries: int, max_polls: int | None, poll_interval: float
    ) -> CommitReceipt:
        """Closes, waits for the extraction and commits; retries a failed extraction.

        Each wait lasts as long as the `extraction_timeout` the session's extraction runs
        with allows (plus a grace, so that the extraction's own timeout reports first; twice
        that in auto-commit, whose close may first wait for another Memory's commit), and
        again while its model calls keep being answered (calls queued for a slow server do
        not count against the extraction's time), or `max_polls * poll_interval` seconds when
        `max_polls` is given (it is woken by the state change, it does not poll).

        Raises:
            PipelineError: "extraction_failed" after `max_retries` failed retries (the
                message counts the extractions this call ran and names what failed), or
                "extraction_timeout" when an extraction outlasts the wait.
        """
        session = await self._live.fetch(session_id, fresh=True)
        runs = 0  # extractions this call started
        if session.state in (S.COLLECTING, S.IDLE):
            refuse_close(session)
            await transitions.close(self._live, session)
            runs = 1
        elif session.state is S.EXTRACTING:
            runs = 1
        retries = 0
        if max_polls is None:
            # An auto-commit close may first wait as long for its own background commits
            # and another Memory's commit of the same steps (`claims.settle`).
            phases = 2 if session.config.auto_commit else 1
            wait = session.runtime.config.extraction_timeout * 1.1 * phases + 1.0
        else:
            wait = max(max_polls, 1) * max(poll_interval, 0.0)
        while True:
            with anyio.move_on_after(wait if wait > 0 else math.inf) as scope:
                while session.state is S.EXTRACTING and not session.ended:
                    await self._live.wait_moved(session)
            if scope.cancelled_caught:
                if max_polls is None and self._answered_within(session_id, wait):
                    continue  # still being answered: its calls queued, they did not hang
                raise PipelineError("extraction_timeout", f"{session_id} still extracting")
            if session.ended:
                raise NotFoundError("session", session_id)
            state = session.state
            if state is S.READY:
                receipt = await self.commit(session_id)
                assert receipt is not None
                return receipt
            if state is S.IDLE and session.config.auto_commit and session.last_receipt:
                return session.last_receipt
            if state is S.FAILED and retries < max_retries:
                retries += 1
                runs += 1
                await self.commit(session_id)
                continue
            if state is S.FAILED:
                times = "once" if runs == 1 else f"{runs} times"
                raise PipelineError(
                    failure_reason(session.failure or Exception()),
                    f"{session_id}: the extraction failed {times} in this call, last: "
                    f"{session.failure}",
                ) from session.failure
            raise SessionError("not_ready", state=state, session_id=session_id)

    def _answered_within(self, session_id: str, seconds: float) -> bool:
        """Whether a model call of the session ended here in the last `seconds`."""
        last = self._last_answer(session_id) if self._last_answer is not None else None
        return last is not None and anyio.current_time() - last < seconds

    # ---- the async calls ------------------------------------------------------------------

    async def submit(self, session_id: str, kind: str, args: tuple[Any, ...],
                     callback: Callback | None) -> None:
        """Accepts an async operation: runs it now when the session is free, else queues it.

        Raises:
            InvalidInputError: a callback that is neither None nor callable.
            SessionError: "session_failed", "pending_queue_full", "invalid_operation" or
                "invalid_queued_operation" (the API contract's queue rules).
        """
        if callback is not None and not callable(callback):
            raise InvalidInputError(f"callback must be callable or None, got {callback!r}")
        session = await self._live.fetch(session_id, fresh=True)
        try:
            await self._accept(session, kind, args, callback)
        except SessionError as refused:
            if refused.reason not in (
                "invalid_operation", "invalid_queued_operation", "session_failed"
            ):
                raise
            # Checked against the store before it is raised, as a sync call's refusal is
            # (`transitions.refuse_checked`): nothing was accepted, so trying again accepts it
            # at most once.
            async with session.lock:
                await self._live.reload(session)
            await self._accept(session, kind, args, callback)

    async def _accept(self, session: SessionRecord, kind: str, args: tuple[Any, ...],
                      callback: Callback | None) -> None:
        if session.state is S.EXTRACTING and not session.scopes:
            # Another Memory extracts it: the operation is stored with the session.
            await _submit_remote(self._live, session, kind, args, callback)
            return
        operations.submit(self._live, session, kind, args, callback)

    def intent_policy(self, runtime: Runtime, llm: LLM, repo: str) -> IntentPolicy:
        """How commits made with `runtime` to `repo` deduplicate intents (merging through
        `llm`), and embed again a changeset made before the repo was re-embedded."""
        return intent_policy(runtime.config, runtime.embedder, llm, repo,
                             self._live.refresh_repo)


async def answer_ended(live: Sessions, session: SessionRecord) -> None:
    """Answers what an ended session owed, `session_ended`: its queued operations, and those
    it stored for another Memory's extraction (their watcher was cancelled with the rest, and
    nothing else would call them back). Its end here, or seen in the store."""
    await operations.fail_pending(session, "session_ended")
    await operations.fail_remote(live, session, "session_ended")


async def _submit_remote(live: Sessions, session: SessionRecord, kind: str,
                         args: tuple[Any, ...], callback: Callback | None) -> None:
    """Accepts an operation for a session whose extraction another Memory holds: it is stored
    with the session, whoever ends that work runs it, and its callback runs here.

    Raises:
        SessionError: as `submit`.
        NotFoundError: the session ended while the call waited for another one's row.
        RuntimeError: the Memory has closed (as a call that would start a task does).
    """
    operations.check_args(session, kind, args)
    if live.closing:  # a callback of the close itself, say, which holds `storing`
        raise RuntimeError("the Memory has closed")
    # From the check to the append, one call at a time: the store's insert is awaited, and a
    # second call checked meanwhile would pass the bound and the rules without the first.
    async with session.storing:
        if session.ended:
            raise NotFoundError("session", session.id)
        if live.closing:
            raise RuntimeError("the Memory has closed")
        waiting = live.remote.get(session.id, [])
        if len(waiting) >= session.config.max_pending_ops:
            raise SessionError("pending_queue_full", state=session.state, session_id=session.id)
        auto = session.config.auto_commit
        queued = [k for _, k, _ in waiting]
        if project(S.IDLE if auto else S.READY, [*queued, kind], auto_commit=auto) is None:
            raise SessionError(
                "invalid_queued_operation", state=session.state, session_id=session.id
            )
        op_id = f"op_{uuid.uuid4().hex}"
        await live.coordination.queue_op(StoredOp(
            op_id, session.id, kind, list(args), live.holder_id, live.coordination.now()
        ))
        live.remote.setdefault(session.id, []).append((op_id, kind, callback))
        if session.ended:
            # Ended while its row was written: the end answered what it found, not this, and
            # cancelled the watcher. Accepted all the same: answered here.
            with anyio.CancelScope(shield=True):
                await operations.fail_remote(live, session, "session_ended")
            return
    operations.watch(live, session)
