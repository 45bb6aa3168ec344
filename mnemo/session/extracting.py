"""What the session machine's moves start (`start`), and the extraction runner: a close's
extraction (`Extraction.run`) never stays extracting with nobody working on it;
`commit_in_background` commits an auto-commit session's finished trajectories while it collects;
`take_work` takes over the work a gone holder left."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum

import anyio

from mnemo.adapters.recorded import UnavailableLLM
from mnemo.episode import EpisodeRecord, StepRecord
from mnemo.errors import LLMTimeout, MnemoError, NotFoundError, StorageError
from mnemo.extraction.memo import TaskMemo
from mnemo.extraction.pipeline import Source, extract
from mnemo.graph.model import Changeset, CommitReceipt
from mnemo.ports import check_dim, model_name
from mnemo.session import operations, registry, transitions
from mnemo.session.machine import (
    CommitSteps,
    Effect,
    Extract,
    SessionRecord,
    State,
)
from mnemo.session.ports import StepsCommittedElsewhere
from mnemo.session.registry import Sessions

log = logging.getLogger("mnemo")


def start(live: Sessions, session: SessionRecord, effect: Effect) -> None:
    """Starts `effect` for `session` in the background work's group (cancelled with it)."""
    if isinstance(effect, Extract):
        session.extracts = True
        try:
            live.spawn(session, _extraction, live, session)
        except BaseException:
            session.extracts = False
            raise
        return
    session.claimed.update(s.id for s in effect.steps)
    session.background += 1
    live.spawn(session, _background_commit, live, session, effect.steps)


async def _extraction(live: Sessions, session: SessionRecord) -> None:
    """The close's extraction, then what was queued behind it (which fails with
    "extraction_failed" when it did), the session busy until then (`operations.handing_over`)."""
    with operations.handing_over(live, session):
        try:
            ended = await Extraction(live, session).run()
        finally:
            session.extracts = False
        if ended is Ended.FAILED:
            await operations.fail_pending(live, session, "extraction_failed")
        if ended is not Ended.STALE:
            # Not taken, they stay stored: their accepting Memories' watchers run them.
            try:
                await operations.run_stored(live, session)
            except StorageError as exc:
                log.warning("%s: stored operations not taken: %r", session.id, exc)


async def _background_commit(
    live: Sessions, session: SessionRecord, steps: list[StepRecord]
) -> None:
    """A background commit, then the queue (failed with "extraction_failed" if it failed)."""
    if await Extraction(live, session).commit_in_background(steps):
        operations.start_next(live, session)
    else:
        await operations.fail_pending(live, session, "extraction_failed")


class Ended(Enum):
    """How a close's extraction ended: the session moved on, moved to `failed`, or stale."""

    MOVED = "moved"
    FAILED = "failed"
    STALE = "stale"


# Extractions of an auto-commit close that another Memory's commits overtook before giving up.
_ATTEMPTS = 3
# Seconds a close's extraction waits before it tries again after a busy store.
BUSY_PAUSE = 0.1


@dataclass(frozen=True, slots=True)
class Extraction:
    live: Sessions
    session: SessionRecord

    async def _extract_steps(self, episode: EpisodeRecord, steps: list[StepRecord]) -> Changeset:
        live, session = self.live, self.session
        runtime = session.runtime
        check_dim(session.repo, runtime.embedder, runtime.dim)
        if session.memo is None or session.memo.episode_id != episode.id:
            # What an earlier extraction of this episode kept is asked no more.
            session.memo = TaskMemo(episode.id, await live.store.kept_results(episode.id))
        changeset = await extract(
            episode,
            steps,
            repo=session.repo,
            source=Source(f"source_{episode.id}", episode.goal, {
                "session_id": session.id, "episode_id": episode.id, "goal": episode.goal}),
            llm=live.repos.limits.llm_for(runtime.llm, runtime.config, session.repo, session.id),
            embedder=runtime.embedder,
            generation=runtime.generation,
            time_limit=runtime.config.extraction_timeout,
            score_last_step=bool(steps) and steps[-1].reward is None,
            memo=session.memo,
            partial=runtime.config.partial_commits,
        )
        return replace(changeset, metadata=session.metadata) if session.metadata else changeset

    async def run(self) -> Ended:
        """The close's extraction: ready (auto-commit: committed and idle) or failed; whatever
        fails on the way, storing the result included, ends in `failed`. A store busy past its
        `busy_timeout` (a lock another Memory held) is tried again while the extraction's time
        lasts: its writes are single transactions and its results are kept (`memo`), so nothing
        is asked twice."""
        live, session = self.live, self.session
        started = anyio.current_time()
        try:
            await self._annotated()
            while session.background:
                await session.changed.wait()
            while True:
                try:
                    moved = await (self._auto_commit_rest(started) if session.config.auto_commit
                                   else self._ready())
                    break
                except StorageError as exc:
                    limit = started + session.runtime.config.extraction_timeout
                    if exc.reason != "busy" or anyio.current_time() + BUSY_PAUSE >= limit:
                        raise
                    log.info("%s: the store was busy (%r); extracting again", session.id, exc)
                    await anyio.sleep(BUSY_PAUSE)
        except Exception as exc:
            log.warning("%s: extraction failed: %r", session.id, exc)
            session.failure = exc
            await self._store_kept()
            if session.config.auto_commit:
                await registry.release(live, session, session.uncommitted())
            try:
                failed = await transitions.move(
                    live, session, "extraction_failed",
                    lambda: live.store.set_state(session.id, State.FAILED, version=session.version),
                )
            except StorageError as error:
                # The store refuses even the failure: the session fails here all the same; the
                # store still says extracting, so a reopened store (or a retry) extracts again.
                log.warning("%s: could not store the failed state: %r", session.id, error)
                failed = await transitions.move(live, session, "extraction_failed")
            return Ended.FAILED if failed else Ended.STALE
        return Ended.MOVED if moved else Ended.STALE

    async def _ready(self) -> bool:
        """Stores the episode's changeset and moves the session to `ready`; False if stale."""
        live, session = self.live, self.session
        steps = session.uncommitted()
        changeset = await self._changeset(steps)

        async def persist() -> int:
            version = await live.store.save_extraction(
                session.id, changeset, steps[-1:], version=session.version
            )
            session.changeset = changeset
            return version

        return await transitions.move(live, session, "extraction_succeeded", persist)

    async def _annotated(self) -> None:
        """Waits until every stored step of the episode is annotated (starting the annotation
        if it does not run), at most `extraction_timeout` seconds without progress (then
        LLMTimeout); raises what stopped their annotation."""
        live, session = self.live, self.session
        if not session.unannotated():
            return
        registry.annotate(live, session)
        limit = session.runtime.config.extraction_timeout
        left = -1
        while (session.unannotated() and left != len(session.unannotated())
               and session.annotating):
            left = len(session.unannotated())
            with anyio.move_on_after(limit):
                while len(session.unannotated()) == left and session.annotating:
                    await session.changed.wait()
        if not session.unannotated():
            return
        if not session.annotating and session.annotation_failure is not None:
            raise session.annotation_failure
        raise LLMTimeout(f"{session.id}: {len(session.unannotated())} steps not annotated, "
                         f"none for {limit}s")

    async def _changeset(self, steps: list[StepRecord]) -> Changeset:
        session = self.session
        episode = session.episode
        if episode is None:
            return Changeset(f"changeset_{uuid.uuid4().hex}", session.repo,
                             metadata=session.metadata)
        return await self._extract_steps(episode, steps)

    async def _auto_commit_rest(self, started: float) -> bool:
        """An auto-commit close: extracts and commits the steps no background commit has, then
        `idle`; what another Memory's commits leave is extracted again, up to `_ATTEMPTS` times."""
        live, session = self.live, self.session
        for attempt in range(_ATTEMPTS):
            await take_commits(live, session)
            steps = session.uncommitted()
            mine = {s.id for s in await claim_or_all(live, session, steps)}
            if len(mine) < len(steps):
                limit = started + session.runtime.config.extraction_timeout
                await settle(live, session, [s for s in steps if s.id not in mine],
                             within=max(limit - anyio.current_time(), 0.0))
                steps = session.uncommitted()
            changeset = await self._changeset(steps)
            try:
                return await self._auto_commit_close(changeset, steps)
            except StepsCommittedElsewhere:
                if attempt == _ATTEMPTS - 1:
                    raise
                log.info("%s: steps committed by another Memory meanwhile; extracting the rest",
                         session.id)
        raise AssertionError("unreachable")

    async def _store_kept(self) -> None:
        """Stores what a failed extraction kept, so a retry asks only what failed (best effort)."""
        live, session = self.live, self.session
        memo = session.memo
        if memo is None:
            return
        for kept in memo.unsaved():
            try:
                await live.store.keep_result(memo.episode_id, kept)
            except StorageError as exc:
                log.warning("%s: could not store a kept %s result: %r", session.id, kept.task, exc)
                return

    async def _auto_commit_close(self, changeset: Changeset, steps: list[StepRecord]) -> bool:
        """Commits the close's changeset and moves the session to `idle`; False if stale."""
        live, session = self.live, self.session
        receipts: list[CommitReceipt] = []

        async def persist() -> None:
            receipts.append(
                await transitions.commit_steps(live, session, changeset, steps, State.IDLE))
            session.last_receipt = receipts[0]
            session.episode = None

        moved = await transitions.move(
            live, session, "auto_committed", persist,
            data=lambda: {"node_ids": receipts[0].node_ids},
        )
        if moved:
            await live.events.applied(session.repo, receipts[0].node_ids,
                                      receipts[0].changeset_id, session_id=session.id)
        return moved

    async def commit_in_background(self, steps: list[StepRecord]) -> bool:
        """Auto-commit of finished steps while the session keeps collecting (`steps` claimed
        and counted in `background` by the caller); False when it failed."""
        live, session = self.live, self.session
        episode = session.episode
        try:
            assert episode is not None
            mine = {s.id for s in await claim_or_all(live, session, steps)}
            if len(mine) < len(steps):
                # Left to another Memory's commit; a flush looks again a full timeout from now.
                session.claimed.difference_update(s.id for s in steps if s.id not in mine)
                session.flush_after = anyio.current_time()
                await self._read_commits()
                steps = [s for s in steps if s.id in mine]
            if not steps:
                _background_done(session, steps)
                return True
            changeset = await self._extract_steps(episode, steps)
            receipt = await transitions.commit_steps(live, session, changeset, steps, None)
        except StepsCommittedElsewhere:
            log.info("%s: %d steps were committed by another Memory", session.id, len(steps))
            await self._read_commits()
            await registry.release(live, session, steps)
            _background_done(session, steps)
            return True
        except Exception as exc:
            log.warning("%s: auto-commit of %d steps failed: %r", session.id, len(steps), exc)
            await self._store_kept()
            await registry.release(live, session, steps)
            session.flush_after = anyio.current_time()  # the next flush waits a full timeout
            live.timer_wake.set()
            _background_done(session, steps)
            return False
        _background_done(session, steps)
        trajectories = sorted({s.trajectory_id for s in steps})
        await live.events.applied(session.repo, receipt.node_ids, receipt.changeset_id,
                                  session_id=session.id)
        await live.events.emit(
            "trajectory_committed", session_id=session.id, repo=session.repo,
            node_ids=receipt.node_ids, trajectory_ids=trajectories,
            step_indices=[s.index for s in steps],
        )
        return True

    async def _read_commits(self) -> None:
        """`take_commits`, best effort (read again at the next close or refusal)."""
        live, session = self.live, self.session
        try:
            await take_commits(live, session)
        except StorageError as exc:
            log.warning("%s: could not read its steps again: %r", session.id, exc)


def _background_done(session: SessionRecord, steps: list[StepRecord]) -> None:
    session.claimed.difference_update(s.id for s in steps)
    session.background -= 1
    session.notify()


async def take_work(live: Sessions, now: datetime, gone: list[str]) -> None:
    """Takes over the work nobody holds any more (as of `now`; `gone`: holders whose process
    left this host) when this Memory's model for the repo is the one it started with, and the
    operations a gone holder queued behind work that ended."""
    co = live.coordination
    for lease in await co.takeable(now, now - live.lease, gone):
        if lease.holder == live.holder_id:
            continue  # this Memory's own work, starting or running
        try:
            session = await live.fetch(lease.id, fresh=True)
        except MnemoError:
            continue
        if session.state in (State.COLLECTING, State.IDLE) and lease.state is not State.EXTRACTING:
            await _take_timers(live, session)
            continue
        if session.state is not State.EXTRACTING or session.scopes:
            continue  # moved on, or its work already runs here
        if _same_model(session) and await transitions.hold(live, session):
            log.info("%s: taking over its extraction", session.id)
            live.effects(live, session, Extract())
    async for session in _fresh(live, await co.unannotated(now - live.lease, gone)):
        if session.state is State.COLLECTING and not session.annotating and _same_model(session):
            log.info("%s: taking over the annotation of its stored steps", session.id)
            registry.annotate(live, session)
    async for session in _fresh(live, await co.left_queues(now - live.lease, gone)):
        if session.state is not State.EXTRACTING and not session.extracts:
            log.info("%s: taking over the operations a gone holder queued", session.id)
            live.spawn(session, operations.run_stored, live, session)


async def _fresh(live: Sessions, session_ids: list[str]) -> AsyncIterator[SessionRecord]:
    """The records of these sessions, each read again from the store; one that cannot be read
    (ended meanwhile, or the store failed) is skipped."""
    for session_id in session_ids:
        try:
            yield await live.fetch(session_id, fresh=True)
        except MnemoError:
            continue


async def _take_timers(live: Sessions, session: SessionRecord) -> None:
    """Drives the timers of a session whose holder went away, given a matching model."""
    config = session.config
    if session.driven or not config.auto_commit:
        return
    if (config.flush_timeout is None and config.session_timeout is None
            and not session.finished_steps()):
        return  # no timers and nothing started: nothing to drive, so nothing written
    if _same_model(session) and await transitions.hold(live, session):
        log.info("%s: taking over its auto-commit timers", session.id)
        # A background commit that went with its holder runs again here now.
        finished = session.finished_steps()
        if finished:
            live.effects(live, session, CommitSteps(finished))


def _same_model(session: SessionRecord) -> bool:
    """Whether this Memory's model for the session's repo is the one its work started with."""
    try:
        llm = session.repo_runtime.llm
    except NotFoundError:
        return False  # a repo this Memory has not opened
    if isinstance(llm, UnavailableLLM):
        return False  # a stand-in of the model's name: the model cannot run here
    here = model_name(llm)
    if session.extraction_model is not None and session.extraction_model != here:
        log.info("%s: its work started with %s, not %s: left to a Memory with that model",
                 session.id, session.extraction_model, here)
        return False
    return True


async def claim_or_all(
    live: Sessions, session: SessionRecord, steps: Sequence[StepRecord]
) -> list[StepRecord]:
    """`claim`, but a store that refuses the claim yields all of `steps` (done twice at worst)."""
    try:
        return await registry.claim(live, session, steps)
    except StorageError as exc:
        log.warning("%s: could not claim %d steps, extracting them unclaimed: %r", session.id,
                    len(steps), exc)
        return list(steps)


async def settle(
    live: Sessions, session: SessionRecord, steps: Sequence[StepRecord], *, within: float
) -> None:
    """Waits until each of `steps` (claimed by others) is committed or claimed by this Memory,
    at most `within` seconds; a storage fault is logged and looked past. NotFoundError: the
    session ended meanwhile."""
    open_steps = list(steps)
    co = live.coordination
    with anyio.move_on_after(within):
        while True:
            # Taken before the look: a change during it moves the token.
            try:
                token = await co.change_token()
                lease = await co.lease(session.id)
                if lease is None or lease.ended:
                    raise NotFoundError("session", session.id)
                await take_commits(live, session)
                open_steps = [s for s in open_steps if s.committed_in is None]
                mine = {s.id for s in await registry.claim(live, session, open_steps)}
                open_steps = [s for s in open_steps if s.id not in mine]
                if not open_steps:
                    return
                await registry.store_moved(live, token)
            except StorageError as exc:
                log.warning("%s: could not look at the claims of others: %r", session.id, exc)
                await anyio.sleep(registry.RECHECK)
    log.warning("%s: %d steps still claimed by another Memory after %.0f s: extracted here",
                session.id, len(open_steps), within)


async def take_commits(live: Sessions, session: SessionRecord) -> None:
    """Marks the episode's steps with the changesets the store says committed them (another
    Memory's background commit moves no version); StorageError if it cannot be read."""
    episode = session.episode
    stored = None if episode is None else await live.store.episode(episode.id)
    if episode is None or stored is None:
        return
    committed = {s.id: s.committed_in for s in stored.steps}
    for step in episode.steps:
        step.committed_in = committed.get(step.id) or step.committed_in
