"""Who does a session's background work when several `Memory` objects share a store.

Each open Memory is a holder (`Coordination.register`), alive while its heartbeat renews
`seen_at` and the leases it holds, every third of `Config.lease_timeout`. A Memory that starts
an extraction claims the session with a compare-and-set on its version, so that exactly one
holds it. A takeover task in every Memory looks for extractions nobody holds any more (a lease that
ended, a holder not seen for a lease, one that closed, or, on this host, one whose process is
gone) and takes one over by the same compare-and-set, if its model for the repo is the one
the work started with; so is the annotation of stored steps whose claim such a holder left.
It also calls back, as failed, the operations this Memory stored that
such a holder took and left without a result. It looks when the Memory opens, when a repo is
opened, and twice a lease; a Memory closing retires, and its leases end at once.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import anyio

from mnemo.errors import MnemoError, NotFoundError
from mnemo.ports import model_name
from mnemo.session import stored
from mnemo.session.machine import State
from mnemo.session.ports import HolderInfo
from mnemo.session.records import (
    Annotate,
    CommitSteps,
    Extract,
    SessionRecord,
    finished_steps,
)
from mnemo.session.registry import Sessions

log = logging.getLogger("mnemo")

HOST = socket.gethostname()
# A holder not seen for this long (and for a lease at least) is gone for good: what it took
# for a Memory that has closed since is forgotten (`Coordination.forget_orphans`). A live
# holder beats every third of a lease.
ORPHAN_GRACE = timedelta(hours=1)


class Holder:
    """This Memory as a holder of background work: its heartbeat and its takeover task."""

    def __init__(self, live: Sessions, lease_timeout: float) -> None:
        self.id = f"holder_{uuid.uuid4().hex}"
        self._live = live
        self._lease = timedelta(seconds=lease_timeout)
        self._look = anyio.Event()
        self._registered = anyio.Event()
        self._registering = anyio.Lock()
        live.holder_id, live.lease_until = self.id, self.lease_until
        live.register_holder = self.register
        live.claim_steps = self.claim_steps

    def lease_until(self) -> datetime:
        return self._now() + self._lease

    def _now(self) -> datetime:
        """The store's time (`Coordination.now`): a lease or a heartbeat stamped with this
        host's own clock is judged wrong by a Memory on a host whose clock differs."""
        return self._live.coordination.now()

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Looks for work to take over until cancelled and, once this Memory holds work,
        beats; retires when cancelled (its leases end, so another Memory may go on at once).
        A Memory that only reads writes nothing: it registers when it first claims work."""
        co = self._live.coordination
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._beat)
                tg.start_soon(self._takeover_loop)
                task_status.started()
        finally:
            if self._registered.is_set():
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    try:
                        await co.retire(self.id, self._now())
                    except MnemoError as exc:
                        log.warning("could not retire %s: %r", self.id, exc)

    async def register(self) -> None:
        """Records this Memory as a holder, once (before its first claim)."""
        if self._registered.is_set():
            return
        async with self._registering:
            if not self._registered.is_set():
                now = self._now()
                await self._live.coordination.register(
                    HolderInfo(self.id, HOST, os.getpid(), now, now)
                )
                self._registered.set()
                self._live.registered = True

    def look(self) -> None:
        """Asks the takeover task to look for work now (a repo was opened)."""
        self._look.set()

    async def claim_steps(self, session_id: str, step_ids: Sequence[str]) -> set[str]:
        """Claims steps for this Memory's extraction (`Coordination.claim_steps`): those
        another live holder claims are left to it; one that left (closed, unseen for a
        lease, or its process gone from this host) has left its claims."""
        await self.register()
        co = self._live.coordination
        cut = self._now() - self._lease
        granted = await co.claim_steps(session_id, step_ids, self.id, unseen_since=cut)
        if len(granted) < len(step_ids):
            # Only then is it worth the read of the holders: one whose process is gone from
            # this host has left its claims already, not a lease from now.
            gone = await self._gone()
            if gone:
                granted = await co.claim_steps(session_id, step_ids, self.id,
                                               unseen_since=cut, gone=gone)
        return granted

    async def _gone(self) -> list[str]:
        """The holders on this host, other than this one, whose process is gone."""
        return [h.id for h in await self._live.coordination.holders()
                if h.id != self.id and h.host == HOST and not _alive(h.pid)]

    async def claim(self, session: SessionRecord) -> bool:
        """Holds the session's work (compare-and-set on the version the record holds)."""
        return await self._live.claim(session)

    async def _beat(self) -> None:
        period = self._lease.total_seconds() / 3
        await self._registered.wait()
        while True:
            try:
                await self._live.coordination.beat(self.id, self._now(), self.lease_until())
            except MnemoError as exc:
                log.warning("%s: heartbeat failed: %r", self.id, exc)
            await anyio.sleep(period)

    async def _takeover_loop(self) -> None:
        period = self._lease.total_seconds() / 2
        while True:
            self._look = anyio.Event()
            try:
                await self._take_over()
            except MnemoError as exc:
                log.warning("%s: looking for work failed: %r", self.id, exc)
            with anyio.move_on_after(period):
                await self._look.wait()

    async def _take_over(self) -> None:
        co, live = self._live.coordination, self._live
        try:
            await co.sync_clock()
        except MnemoError as exc:
            log.warning("%s: could not read the store's clock (the last measure stays): %r",
                        self.id, exc)
        now = self._now()
        # Reads only: a holder whose process is gone is treated as gone, not retired here.
        gone = await self._gone()
        for lease in await co.takeable(now, now - self._lease, gone):
            if lease.holder == self.id:
                continue  # this Memory's own work, starting or running
            try:
                session = await live.fetch(lease.id, fresh=True)
            except (NotFoundError, MnemoError):
                continue
            if session.state in (State.COLLECTING, State.IDLE) and lease.state is not (
                State.EXTRACTING
            ):
                await self._take_timers(session)
                continue
            if session.state is not State.EXTRACTING or session.scopes:
                continue  # moved on, or its work already runs here
            if not _same_model(session):
                continue
            if await self.claim(session):
                log.info("%s: taking over its extraction", session.id)
                live.start(session, Extract())
        for session_id in await co.unannotated(now - self._lease, gone):
            try:
                session = await live.fetch(session_id, fresh=True)
            except MnemoError:
                continue
            if session.state is State.COLLECTING and not session.annotating and (
                _same_model(session)
            ):
                log.info("%s: taking over the annotation of its stored steps", session.id)
                live.start(session, Annotate())
        try:
            await stored.answer_abandoned(live, now - self._lease, gone)
        except MnemoError as exc:
            log.warning("%s: looking for operations left by a gone holder failed: %r",
                        self.id, exc)
        try:
            # What a holder took for a Memory that has closed since, and left: nobody would
            # run it again or read it. Judged over a longer time than a lease (a live but
            # late holder still runs what it took, nobody waiting for it).
            forgotten = await co.forget_orphans(now - max(self._lease, ORPHAN_GRACE), gone,
                                                me=self.id)
        except MnemoError as exc:
            log.warning("%s: looking for operations nobody waits for failed: %r",
                        self.id, exc)
        else:
            if forgotten:
                log.info("%s: forgot %d stored operations a gone holder left, for a Memory "
                         "that has closed", self.id, forgotten)


    async def _take_timers(self, session: SessionRecord) -> None:
        """Drives the auto-commit timers of a session whose holder went away, if this
        Memory's model for its repo may do its work."""
        config = session.config
        if session.driven or not config.auto_commit:
            return
        if config.flush_timeout is None and config.session_timeout is None and not (
            finished_steps(session)
        ):
            return  # no timers and nothing started: nothing to drive, so nothing written
        if not _same_model(session):
            return
        if await self.claim(session):
            log.info("%s: taking over its auto-commit timers", session.id)
            # A boundary handed the finished trajectories to a background commit, which
            # went with its holder: it runs again here now, not at the next flush.
            finished = finished_steps(session)
            if finished:
                self._live.start(session, CommitSteps(finished))


def _same_model(session: SessionRecord) -> bool:
    """Whether this Memory's model for the session's repo is the one its work started with
    (the API contract: work is taken over only by a matching model)."""
    try:
        here = model_name(session.repo_runtime.llm)
    except NotFoundError:
        return False  # a repo this Memory has not opened
    if session.extraction_model is not None and session.extraction_model != here:
        log.info("%s: its work started with %s, not %s: left to a Memory with that model",
                 session.id, session.extraction_model, here)
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
