"""The extraction runner: turns a session's steps into a changeset and commits it.

- `start` moves a session to `extracting` (recording the model that extracts) and runs
  `extract_episode` in the background: it ends `ready`, or, in auto-commit, committed and
  `idle`, or `failed`; never extracting with nobody working on it.
- `start_background` extracts and commits finished trajectories of an auto-commit session while
  it keeps collecting (its steps are `claimed` meanwhile, here and, unless the store refused
  the claim, in the store (`claims`): a flush or a close, through this Memory or another,
  leaves them to it while it lives, a close waiting at most an extraction's time limit).
- `commit_steps` applies a changeset together with the session's side of it, deduplicating
  intents by `intent_policy`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence

import anyio

from mnemo import deadline
from mnemo.calls.tasks import ask
from mnemo.episode.annotation import embed
from mnemo.episode.model import EpisodeRecord, StepRecord
from mnemo.errors import EmbeddingError, LLMError, StorageError
from mnemo.extraction.contradiction import contradiction_request, parse_contradiction
from mnemo.extraction.memo import TaskMemo
from mnemo.extraction.pipeline import Source, extract
from mnemo.extraction.prompts import (
    merge_intent_request,
    merge_intents_request,
    parse_merged_intent,
    parse_merged_intents,
)
from mnemo.graph.contradiction import Question
from mnemo.graph.model import Changeset, CommitReceipt, Vector
from mnemo.graph.ports import IntentPolicy, StepsCommitted
from mnemo.ports import LLM, model_name
from mnemo.session import claims, operations, stored, transitions
from mnemo.session.machine import State
from mnemo.session.ports import StaleSession, StepsCommittedElsewhere
from mnemo.session.queue import Op
from mnemo.session.records import Runtime, SessionRecord
from mnemo.session.registry import Sessions

log = logging.getLogger("mnemo")

S = State


async def start(
    live: Sessions, session: SessionRecord, event: str, op: Op | None,
    refuse: Callable[[], None] | None = None,
) -> None:
    """Moves the session to `extracting` (recording its repo's model: who may take the work
    over) and starts the extraction; `refuse` as `transitions.move`'s."""
    # The repo's model, not a per-session override's: overrides are not persisted, so the
    # session restored after its holder vanished runs its repo's model, and only a Memory
    # with that model may resume it (an override's name matched no Memory: it stayed
    # extracting for good).
    model = model_name(session.repo_runtime.llm)

    async def persist() -> int:
        if live.holder_id is None or live.lease_until is None or live.register_holder is None:
            version = await live.store.set_state(
                session.id, S.EXTRACTING, model=model, version=session.version
            )
        else:
            # Extracting and held by this Memory in one compare-and-set: no moment in which
            # the row is extracting and nobody's (a janitor would take it over).
            await live.register_holder()
            claimed = await live.coordination.claim(
                session.id, version=session.version, holder_id=live.holder_id,
                lease_until=live.lease_until(), state=S.EXTRACTING, model=model,
            )
            if claimed is None:
                raise StaleSession(session.id)
            version = claimed
            # Held here now: so are its timers once it is idle again (an expiry's end).
            live.drive(session)
        session.extraction_model = model
        return version

    started = False

    def extract() -> None:
        # Started with the move, before its event is delivered: in between, a call saw the
        # session extracting with no extraction here, and took it for another Memory's.
        nonlocal started
        started = True
        live.spawn(session, extract_episode, live, session)

    await transitions.move(live, session, event, persist, op=op, refuse=refuse, fired=extract)
    if not started:
        live.spawn(session, extract_episode, live, session)


def extractable(session: SessionRecord, step: StepRecord) -> bool:
    return step.committed_in is None and step.id not in session.claimed


def uncommitted(session: SessionRecord) -> list[StepRecord]:
    """The open episode's steps that no commit has and no background commit here is
    extracting: what a flush or a close extracts."""
    episode = session.episode
    return [s for s in episode.steps if extractable(session, s)] if episode else []


def _source(session: SessionRecord, episode: EpisodeRecord) -> Source:
    return Source(
        node_id=f"source_{episode.id}",
        text=episode.goal,
        data={"session_id": session.id, "episode_id": episode.id, "goal": episode.goal},
    )


async def _extract_steps(
    live: Sessions, session: SessionRecord, episode: EpisodeRecord, steps: list[StepRecord]
) -> Changeset:
    runtime = session.runtime
    runtime.check_dim(session.repo)
    if session.memo is None or session.memo.episode_id != episode.id:
        # What an earlier extraction of this episode kept (here, or in a Memory before a
        # restart) is asked no more.
        session.memo = TaskMemo(episode.id, await live.store.kept_results(episode.id))
    return await extract(
        episode,
        steps,
        repo=session.repo,
        source=_source(session, episode),
        llm=live.llm_for(runtime, session.repo, session.id),
        embedder=runtime.embedder,
        time_limit=runtime.config.extraction_timeout,
        score_last_step=bool(steps) and steps[-1].reward is None,
        memo=session.memo,
        partial=runtime.config.partial_commits,
    )


async def extract_episode(live: Sessions, session: SessionRecord) -> None:
    """The close's extraction: ready (or, in auto-commit, committed and idle) or failed.

    Whatever fails on the way, storing the result included, ends in `failed`: the session
    never stays extracting with nobody working on it. Once it has moved, what was queued
    behind it runs (`_run_queue`): a fault there is no failed extraction (the failure's move
    from `ready` was stale, so nothing ran or failed the queue, and it stuck). From its move
    until then the session stays busy (`handing_over`): a call made in between queues behind
    what the store hands over, not ahead of it."""
    with operations.handing_over(live, session):
        await _extract_episode(live, session)


async def _extract_episode(live: Sessions, session: SessionRecord) -> None:
    started = anyio.current_time()
    try:
        while session.background:
            await session.changed.wait()
        if session.config.auto_commit:
            moved = await _auto_commit_rest(live, session, started)
        else:
            steps = uncommitted(session)
            changeset = await _changeset(live, session, steps)

            async def persist() -> int:
                version = await live.store.save_extraction(
                    session.id, changeset, steps[-1:], version=session.version
                )
                session.changeset = changeset
                return version

            moved = await transitions.move(live, session, "extraction_succeeded", persist)
    except Exception as exc:
        log.warning("%s: extraction failed: %r", session.id, exc)
        session.failure = exc
        await _store_kept(live, session)
        if session.config.auto_commit:
            await claims.release(live, session, uncommitted(session))
        await _extraction_failed(live, session)
        return
    if moved:
        await _run_queue(live, session)


async def _changeset(
    live: Sessions, session: SessionRecord, steps: list[StepRecord]
) -> Changeset:
    episode = session.episode
    if episode is None:
        return Changeset(f"changeset_{uuid.uuid4().hex}", session.repo)
    return await _extract_steps(live, session, episode, steps)


async def _auto_commit_rest(live: Sessions, session: SessionRecord, started: float) -> bool:
    """An auto-commit close: extracts and commits the steps no background commit has, here or
    through another Memory (what the store says; `_close_changeset` waits for the ones another
    Memory has claimed, until an extraction's time limit from `started`), then `idle`. When
    another Memory's commits land in between, what is left is extracted again, up to
    `_ATTEMPTS` times."""
    for attempt in range(_ATTEMPTS):
        await claims.take_commits(live, session)
        changeset, steps = await _close_changeset(live, session, started)
        try:
            return await _auto_commit_close(live, session, changeset, steps)
        except StepsCommittedElsewhere:
            if attempt == _ATTEMPTS - 1:
                raise
            log.info("%s: steps committed by another Memory meanwhile; extracting the rest",
                     session.id)
    raise AssertionError("unreachable")


# Extractions of an auto-commit close that another Memory's commits overtook before it gives up.
_ATTEMPTS = 3


async def _close_changeset(
    live: Sessions, session: SessionRecord, started: float
) -> tuple[Changeset, list[StepRecord]]:
    """The auto-commit close's changeset and the steps it commits: those no commit has.
    When another Memory's commit has claimed some, the close first waits for it
    (`claims.settle`), until an extraction's time limit from `started` (the close's wait for
    its own background commits counts), then extracts what is left, once: an extraction of
    its share while it waited would be asked again with the rest (a step's reward scored in
    between changes the request)."""
    steps = uncommitted(session)
    mine = {s.id for s in await claims.claim_or_all(live, session, steps)}
    if len(mine) < len(steps):
        limit = started + session.runtime.config.extraction_timeout
        await claims.settle(live, session, [s for s in steps if s.id not in mine],
                            within=max(limit - anyio.current_time(), 0.0))
        steps = uncommitted(session)
    return await _changeset(live, session, steps), steps


async def _run_queue(live: Sessions, session: SessionRecord) -> None:
    """Runs what waited for the extraction that just ended: the operations stored for it
    (`stored.run_stored`) and the session's own queue. If the store cannot hand over the
    stored ones, they stay stored, untaken, and the watchers of the Memories that accepted
    them run them; the queue here runs all the same."""
    try:
        await stored.run_stored(live, session)
    except StorageError as exc:
        log.warning("%s: stored operations not taken: %r", session.id, exc)


async def _store_kept(live: Sessions, session: SessionRecord) -> None:
    """Stores what a failed extraction kept, so that a retry after a restart (or by the
    Memory taking the work over) asks only what failed. Best effort: if the store refuses,
    the results stay kept here."""
    memo = session.memo
    if memo is None:
        return
    for kept in memo.unsaved():
        try:
            await live.store.keep_result(memo.episode_id, kept)
        except StorageError as exc:
            log.warning("%s: could not store a kept %s result: %r", session.id, kept.task, exc)
            return


async def _extraction_failed(live: Sessions, session: SessionRecord) -> None:
    """Moves an extracting session to `failed` and fails what was queued behind it."""
    try:
        moved = await transitions.move(
            live, session, "extraction_failed",
            lambda: live.store.set_state(session.id, S.FAILED, version=session.version),
        )
    except StorageError as exc:
        # The store refuses even the failure: the session fails here all the same, so no
        # caller waits on it; the store still says extracting, so a reopened store (or a
        # `commit` here, which retries) extracts again.
        log.warning("%s: could not store the failed state: %r", session.id, exc)
        moved = await transitions.move(live, session, "extraction_failed")
    if moved:
        await operations.fail_pending(session, "extraction_failed")
        await _run_queue(live, session)


async def _auto_commit_close(
    live: Sessions, session: SessionRecord, changeset: Changeset, steps: list[StepRecord]
) -> bool:
    """Commits the close's changeset and moves the session to `idle`; False for a stale
    result."""
    receipts: list[CommitReceipt] = []

    async def persist() -> None:
        receipts.append(await commit_steps(live, session, changeset, steps, S.IDLE))
        session.last_receipt = receipts[0]
        session.episode = None

    moved = await transitions.move(
        live, session, "auto_committed", persist,
        data=lambda: {"node_ids": receipts[0].node_ids},
    )
    if moved:
        await live.events.emit(
            "changeset_applied", session_id=session.id, repo=session.repo,
            node_ids=receipts[0].node_ids, changeset_id=changeset.id,
        )
    return moved


async def commit_steps(
    live: Sessions,
    session: SessionRecord,
    changeset: Changeset,
    steps: list[StepRecord],
    state: State | None,
) -> CommitReceipt:
    """Applies `changeset` with the session's side (steps committed, and `state` unless
    None) in the same transaction, then marks the steps committed in memory."""
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
    policy = intent_policy(runtime, live.llm_for(runtime, session.repo, session.id))
    receipt = await live.graph.apply(changeset, intents=policy, also=[side])
    if side.version is not None:
        # The version the write made, not one more than the record's now: a read that took
        # the write in meanwhile (`Sessions.reload`) already holds it.
        session.version = side.version + 1
    for step in steps:
        step.committed_in = changeset.id
    return receipt


def finished_steps(session: SessionRecord) -> list[StepRecord]:
    """The steps a boundary hands to a background commit: the uncommitted ones of every
    trajectory of the open episode but the last."""
    episode = session.episode
    if episode is None or not episode.steps:
        return []
    current = episode.steps[-1].trajectory_id
    return [s for s in episode.steps if s.trajectory_id != current and extractable(session, s)]


def start_background(live: Sessions, session: SessionRecord, steps: list[StepRecord]) -> None:
    """Extracts and commits `steps` while the session keeps collecting."""
    session.claimed.update(s.id for s in steps)
    session.background += 1
    live.spawn(session, _background_commit, live, session, steps)


async def _background_commit(
    live: Sessions, session: SessionRecord, steps: list[StepRecord]
) -> None:
    """Auto-commit of finished steps while the session keeps collecting."""
    episode = session.episode
    try:
        assert episode is not None
        mine = {s.id for s in await claims.claim_or_all(live, session, steps)}
        if len(mine) < len(steps):
            # Committed, or claimed by another Memory's commit: left to it. What the store
            # says of them is taken in (a commit elsewhere moves no version), and a flush
            # looks again a full timeout from now, not at once.
            session.claimed.difference_update(s.id for s in steps if s.id not in mine)
            session.flush_after = anyio.current_time()
            await _read_commits(live, session)
            steps = [s for s in steps if s.id in mine]
        if not steps:
            _background_done(live, session, steps)
            return
        changeset = await _extract_steps(live, session, episode, steps)
        receipt = await commit_steps(live, session, changeset, steps, None)
    except StepsCommittedElsewhere:
        # Another Memory committed these steps first (its boundary's auto-commit against
        # this one's flush): the store refused them a second time, so they are in the graph
        # once. What it says of them is taken in; nothing failed.
        log.info("%s: %d steps were committed by another Memory", session.id, len(steps))
        await _read_commits(live, session)
        await claims.release(live, session, steps)
        _background_done(live, session, steps)
        return
    except Exception as exc:
        log.warning("%s: auto-commit of %d steps failed: %r", session.id, len(steps), exc)
        await _store_kept(live, session)
        await claims.release(live, session, steps)
        session.claimed.difference_update(s.id for s in steps)
        session.background -= 1
        session.flush_after = anyio.current_time()  # the next flush waits a full timeout
        live.timer_wake.set()
        session.notify()
        await operations.fail_pending(session, "extraction_failed")
        return
    session.claimed.difference_update(s.id for s in steps)
    session.background -= 1
    session.notify()
    trajectories = sorted({s.trajectory_id for s in steps})
    await live.events.emit(
        "changeset_applied", session_id=session.id, repo=session.repo,
        node_ids=receipt.node_ids, changeset_id=receipt.changeset_id,
    )
    await live.events.emit(
        "trajectory_committed", session_id=session.id, repo=session.repo,
        node_ids=receipt.node_ids, trajectory_ids=trajectories,
        step_indices=[s.index for s in steps],
    )
    operations.kick(live, session)


async def _read_commits(live: Sessions, session: SessionRecord) -> None:
    """`claims.take_commits`, best effort: what the store could not say is read at the next
    close, or the next refusal."""
    try:
        await claims.take_commits(live, session)
    except StorageError as exc:
        log.warning("%s: could not read its steps again: %r", session.id, exc)


def _background_done(live: Sessions, session: SessionRecord, steps: list[StepRecord]) -> None:
    """A background commit that committed nothing ends: what queued behind it runs."""
    session.claimed.difference_update(s.id for s in steps)
    session.background -= 1
    session.notify()
    operations.kick(live, session)


def intent_policy(runtime: Runtime, llm: LLM) -> IntentPolicy:
    """How commits made with `runtime` deduplicate intents (merging through `llm`, all of a
    commit's merges in one call) and retire contradicted facts (one call a commit)."""
    limit = runtime.config.extraction_timeout

    async def merge(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, Vector] | None]:
        try:
            with deadline.fail_after(limit):
                if len(pairs) == 1:
                    existing, new = pairs[0]
                    texts = {0: await ask(llm, merge_intent_request(existing=existing, new=new),
                                          parse_merged_intent)}
                else:
                    texts = await ask(llm, merge_intents_request(list(pairs)),
                                      lambda reply: parse_merged_intents(reply, len(pairs)))
                merged = sorted(texts.items())
                vectors = await embed(runtime.embedder, [text for _, text in merged])
        except (LLMError, EmbeddingError, TimeoutError) as exc:
            log.warning("intent merges failed, keeping the existing wordings: %r", exc)
            return [None] * len(pairs)
        found = {i: (text, vector) for (i, text), vector in zip(merged, vectors, strict=True)}
        return [found.get(i) for i in range(len(pairs))]

    async def contradicts(questions: Sequence[Question]) -> list[set[int]]:
        request, pairs = contradiction_request(questions)
        try:
            with deadline.fail_after(limit):
                return await ask(
                    llm, request, lambda reply: parse_contradiction(reply, pairs, len(questions))
                )
        except (LLMError, TimeoutError) as exc:
            # Not knowing is not contradicting: the facts stay live.
            log.warning("contradiction check failed, every fact stays live: %r", exc)
            return [set() for _ in questions]

    return IntentPolicy(
        identity_threshold=runtime.config.intent_identity_threshold,
        merge_threshold=runtime.config.intent_merge_threshold,
        merge=merge,
        contradicts=contradicts,
        contradiction_candidates=runtime.config.contradiction_candidates,
        contradiction_similarity=runtime.config.contradiction_similarity,
    )
