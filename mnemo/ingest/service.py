"""`IngestService`: complete trajectories stored in one call, idempotent by source id; the
changeset and the `ingests` row commit in one transaction, and concurrent identical ingests
share the work.

Relative dates in a step's text, resolved against the day the trajectory happened: "...
yesterday", said on 8 May 2023, is stored as "... yesterday (7 May 2023)", so a search naming
the day finds it. English only, and only expressions with one clear answer ("recently" stays)."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import date, timedelta
from typing import Protocol, cast

import anyio

from mnemo import cpu
from mnemo.adapters.recorded import check_runnable
from mnemo.config import Config
from mnemo.episode import NO_VECTOR, EpisodeRecord, StepRecord, annotate_step
from mnemo.errors import (
    ConflictError,
    InvalidInputError,
    PipelineError,
    check_json,
    check_name,
    check_step,
    check_text,
)
from mnemo.extraction.dates import MONTHS, WEEKDAYS, count_of, whole_dates
from mnemo.extraction.entities import with_entity_tags, wordings
from mnemo.extraction.pipeline import Source, extract, failure_reason
from mnemo.graph.model import now_utc
from mnemo.graph.ports import GraphStore, IntentPolicy, SourceForgotten, SourceRecorded, SourceTaken
from mnemo.graph.scope import Metadata, canonical
from mnemo.ingest.model import IngestProgress, IngestReceipt, Step, Trajectory
from mnemo.ports import LLM, Embedder, Events, JSONObject, deliver

Progress = Callable[[IngestProgress], Awaitable[None] | None]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IngestRuntime:
    llm: LLM
    embedder: Embedder
    config: Config
    intents: IntentPolicy
    # The generation of the repo's vectors `embedder` makes (`Changeset.generation`).
    generation: int = 0


@dataclass(slots=True)
class _InFlight:
    payload_hash: str
    done: anyio.Event
    receipt: IngestReceipt | None = None
    error: BaseException | None = None


def check_ingest(trajectory: Trajectory, source_id: str, progress: Progress | None,
                 config: Config) -> None:
    """An ingest's input (the trajectory's steps, texts and metadata) checked against the repo's
    `config` (InvalidInputError), once, before the store is read."""
    check_name(source_id, "source_id")
    if progress is not None and not callable(progress):
        raise InvalidInputError(f"progress must be a callable, got {progress!r}")
    limit = config.max_text_chars
    if not isinstance(trajectory, Trajectory):
        raise InvalidInputError(
            f"trajectory must be a mnemo.Trajectory, got {type(trajectory).__name__}")
    check_text(trajectory.goal, "trajectory.goal", limit=limit)
    if not isinstance(trajectory.steps, list | tuple):
        raise InvalidInputError("trajectory.steps must be a list of mnemo.Step")
    if len(trajectory.steps) > config.max_steps_per_ingest:
        raise InvalidInputError(
            f"trajectory has {len(trajectory.steps):,} steps, more than the "
            f"{config.max_steps_per_ingest:,} one ingest takes (Config.max_steps_per_ingest): "
            "ingest it as several sources")
    if not all(isinstance(step, Step) for step in trajectory.steps):
        raise InvalidInputError("trajectory.steps must be a list of mnemo.Step")
    for i, step in enumerate(trajectory.steps):
        check_step(step.observation, step.action, step.metadata, limit=limit,
                   where=f"trajectory.steps[{i}].")
    if trajectory.metadata is not None and not isinstance(trajectory.metadata, dict):
        raise InvalidInputError("trajectory.metadata must be a dict or None")
    if trajectory.metadata is not None:
        check_json(trajectory.metadata, "trajectory.metadata", limit=limit)


def _digest(trajectory: Trajectory, metadata: Metadata | None) -> str:
    """The digest that identifies a source: its payload (goal, steps, metadata) and its scope
    (the same steps under another scope conflict)."""
    steps = [{"observation": step.observation, "action": step.action,
              "metadata": step.metadata} for step in trajectory.steps]
    payload = {"goal": trajectory.goal, "steps": steps, "metadata": trajectory.metadata}
    digest = hashlib.sha256()
    for piece in cpu.pieces(payload, sort_keys=True):
        digest.update(piece.encode())
    digest.update((canonical(metadata or {}) or "").encode())
    return digest.hexdigest()


class Claims(Protocol):
    """Which Memory on the store extracts a source: one claim a source, a live holder's."""

    async def claim(self, repo: str, source_id: str, digest: str) -> str | None:
        """None when this Memory holds the claim now, else the payload digest of the claim
        another live Memory holds."""

    async def release(self, repo: str, source_id: str) -> None: ...

    async def token(self) -> int:
        """The store's change token (`moved` waits for another)."""

    async def moved(self, token: int) -> None:
        """Returns once the store's change token is not `token`, or after a while."""


class IngestService:
    """Ingest and forget for every repo of one `Memory`; `claims` keeps an identical ingest of
    another Memory on the store from asking the model again."""

    def __init__(self, graph: GraphStore, runtime: Callable[[str], IngestRuntime],
                 events: Events, claims: Claims) -> None:
        self._graph = graph
        self._runtime = runtime
        self._events = events
        self._claims = claims
        self._inflight: dict[tuple[str, str], _InFlight] = {}

    async def ingest(self, repo: str, trajectory: Trajectory, source_id: str,
                     progress: Progress | None = None,
                     metadata: Metadata | None = None) -> IngestReceipt:
        """`Memory.ingest` of a checked trajectory, with its errors; PipelineError's reason is
        "extraction_failed" or "extraction_timeout"."""
        runtime = self._runtime(repo)
        chars = sum(len(step.observation) + len(step.action) for step in trajectory.steps)
        digest = await cpu.run(lambda: _digest(trajectory, metadata), chars)
        key = (repo, source_id)
        total = len(trajectory.steps)

        async def report(stage: str, done: int) -> None:
            update = IngestProgress(source_id, stage, done, total)
            if progress is not None:
                await deliver(progress, update, "ingest progress")
            await self._events.emit("ingest_progress", repo=repo, source_id=source_id, stage=stage,
                                    done=done, total=total)

        while (running := self._inflight.get(key)) is not None:
            if (joined := await self._join(running, digest, source_id)) is not None:
                await report("done", total)
                return joined
            # The call it joined was cancelled (by its own caller): this one does the work.
        mine = _InFlight(digest, anyio.Event())
        self._inflight[key] = mine
        try:
            mine.receipt = await self._ingest_once(
                repo, trajectory, source_id, digest, runtime, report, metadata or {})
            await report("done", total)
            return mine.receipt
        except BaseException as exc:
            mine.error = exc
            raise
        finally:
            del self._inflight[key]
            mine.done.set()

    async def _join(self, running: _InFlight, digest: str, source_id: str) -> IngestReceipt | None:
        """The outcome of an identical call already running: its receipt (created=False) or its
        error; None if it was cancelled."""
        if running.payload_hash != digest:
            raise ConflictError(f"source {source_id!r} is being ingested with a different payload")
        await running.done.wait()
        if running.receipt is not None:
            return IngestReceipt(source_id, running.receipt.node_ids, created=False)
        if isinstance(running.error, Exception):
            raise running.error
        return None

    async def _ingest_once(self, repo: str, trajectory: Trajectory, source_id: str, digest: str,
                           runtime: IngestRuntime, report: Callable[[str, int], Awaitable[None]],
                           metadata: Metadata) -> IngestReceipt:
        if (known := await self._known(repo, source_id, digest)) is not None:
            return known
        check_runnable(runtime.embedder)  # before anything is stored
        receipt = None
        try:
            receipt = (await self._claimed(repo, source_id, digest, runtime.config)
                       or await self._extracted(repo, trajectory, source_id, digest, runtime,
                                                report, metadata))
            return receipt
        finally:
            if receipt is None or not receipt.created:  # a commit takes its claim off
                with anyio.CancelScope(shield=True):
                    await self._claims.release(repo, source_id)

    async def _claimed(self, repo: str, source_id: str, digest: str,
                       config: Config) -> IngestReceipt | None:
        """None once this Memory holds the source's claim, the source not recorded yet; the
        receipt of another Memory's commit of it, waited for while that one holds the claim
        (an identical ingest), at most `extraction_timeout` and `lease_timeout` (then None:
        this one ingests too, its commit joining the other's). ConflictError for another
        payload."""
        patience = config.extraction_timeout + config.lease_timeout
        with anyio.move_on_after(patience):
            while True:
                token = await self._claims.token()
                held = await self._claims.claim(repo, source_id, digest)
                if held is None:
                    return await self._known(repo, source_id, digest)  # recorded meanwhile?
                if held != digest:
                    raise ConflictError(
                        f"source {source_id!r} is being ingested with a different payload")
                await self._claims.moved(token)
                if (known := await self._known(repo, source_id, digest)) is not None:
                    return known
        log.warning("source %r of repo %r: another Memory's ingest of it held its claim past "
                    "%g s; ingesting it here too", source_id, repo, patience)
        return None

    async def _extracted(self, repo: str, trajectory: Trajectory, source_id: str, digest: str,
                         runtime: IngestRuntime, report: Callable[[str, int], Awaitable[None]],
                         metadata: Metadata) -> IngestReceipt:
        """The source annotated, extracted and committed (PipelineError when extraction
        fails); another Memory's commit of it meanwhile is its receipt."""
        key = hashlib.sha1(f"{repo}\0{source_id}".encode()).hexdigest()[:20]
        episode = EpisodeRecord(f"ingest_{key}", trajectory.goal)
        try:
            await report("annotating", 0)
            await self._annotate(episode, trajectory, runtime, report)
            await report("extracting", len(episode.steps))
            changeset = await extract(
                episode,
                episode.steps,
                repo=repo,
                source=Source(
                    node_id=f"source_ingest_{key}",
                    text=trajectory.goal,
                    data={"source_id": source_id, "goal": trajectory.goal,
                          "metadata": cast("JSONObject | None", trajectory.metadata)},
                    source_id=source_id),
                llm=runtime.llm,  # bounded by its provider's limiter and metered, by the Memory
                embedder=runtime.embedder,
                generation=runtime.generation,
                time_limit=runtime.config.extraction_timeout,
                score_last_step=bool(episode.steps),
                partial=runtime.config.partial_commits)
            if runtime.config.ingest_entity_tags:
                changeset = await with_entity_tags(changeset, runtime.embedder)
            changeset = replace(changeset, metadata=metadata)
        except Exception as exc:
            raise PipelineError(failure_reason(exc), f"ingest of {source_id!r}: {exc!r}") from exc
        record = SourceRecorded(repo, source_id, digest, changeset.id, now_utc().isoformat())
        await report("committing", len(episode.steps))
        while True:
            try:
                commit = await self._graph.apply(changeset, intents=runtime.intents,
                                                 also=[record])
                await self._events.applied(repo, commit.node_ids, commit.changeset_id,
                                           source_id=source_id)
                return IngestReceipt(source_id, commit.node_ids, created=True,
                                     missing=commit.missing)
            except SourceTaken:
                # Another Memory ingested the source meanwhile: its commit is the source's
                # (or, forgotten since, the id is free: try again).
                if (known := await self._known(repo, source_id, digest)) is not None:
                    return known

    async def _annotate(self, episode: EpisodeRecord, trajectory: Trajectory,
                        runtime: IngestRuntime,
                        report: Callable[[str, int], Awaitable[None]]) -> None:
        """Annotates and segments the steps as appends would, one after another."""
        on = reference_date(trajectory.goal, trajectory.metadata) \
            if runtime.config.ingest_resolve_dates else None
        for index, step in enumerate(trajectory.steps):
            if on is not None:
                step = Step(resolve_dates(step.observation, on), resolve_dates(step.action, on),
                            step.metadata)
            # Checked to be JSON (`check_ingest`).
            stored = StepRecord(f"{episode.id}:{index}", index, "", step.observation,
                                step.action, "", "", NO_VECTOR,
                                metadata=cast("JSONObject | None", step.metadata))
            done, reward = await annotate_step(
                lambda: runtime.llm, runtime.embedder, runtime.config, episode.goal, stored,
                episode.steps, new_trajectory=f"{episode.id}:t{index}",
                name=f"ingest step {index}")
            if episode.steps:
                episode.steps[-1].reward = reward
            episode.steps.append(done)
            await report("annotating", index + 1)

    async def _known(self, repo: str, source_id: str, digest: str) -> IngestReceipt | None:
        """The receipt of the source if it was ingested with this payload, None if it was not
        (ConflictError for a different payload)."""
        found = await self._graph.ingested(repo, source_id)
        if found is None:
            return None
        known_digest, receipt = found
        if known_digest != digest:
            raise ConflictError(
                f"source {source_id!r} of repo {repo!r} was ingested with a different "
                "payload; forget it first to replace it")
        return IngestReceipt(source_id, receipt.node_ids, created=False)

    async def forget(self, repo: str, source_id: str) -> int:
        """`Memory.forget` of a checked source id in a known repo, with its errors."""
        runtime = self._runtime(repo)
        return await self._graph.withdraw(
            repo, source_id, embed=wordings(runtime.embedder, runtime.config.extraction_timeout),
            also=[SourceForgotten(repo, source_id)], generation=runtime.generation)


_COUNT = r"(?P<count>\d{1,3}|an?|one|two|three|four|five|six|seven|eight|nine|ten|a couple of)"
_RELATIVE = re.compile(
    r"\b(?:(?P<day_word>yesterday|today|tonight|tomorrow|last night|this morning"
    r"|this afternoon|this evening)"
    rf"|{_COUNT}\s+(?P<unit>day|week|month|year)s?\s+ago"
    r"|(?P<which>last|this|next)\s+(?P<span>week(?:end)?|month|year)"
    rf"|(?P<which_day>last|next)\s+(?P<weekday>{'|'.join(WEEKDAYS)}))\b",
    re.IGNORECASE)
# Already followed by a date in brackets (written by hand, or resolved before): left alone.
_RESOLVED = re.compile(r"\s*\((?:the )?(?:week(?:end)? of )?[^()]*\d{4}\)")


def reference_date(goal: str, metadata: Mapping[str, object] | None) -> date | None:
    """The day a trajectory happened: the first whole date (day, month and year: a month alone
    names no day to resolve "yesterday" against) in its metadata's "date", else in its goal
    ("Conversation session 3 on 1:56 pm on 8 May, 2023")."""
    given = (metadata or {}).get("date")
    texts = [given, goal] if isinstance(given, str) else [goal]
    return next((moment.date() for text in texts for moment in whole_dates(text)), None)


def resolve_dates(text: str, on: date) -> str:
    """`text` with each relative date it names followed by that date, "(7 May 2023)"."""
    out: list[str] = []
    end = 0
    for match in _RELATIVE.finditer(text):
        resolved = _resolve(match, on)
        if resolved is None or _RESOLVED.match(text, match.end()):
            continue
        out += [text[end : match.end()], f" ({resolved})"]
        end = match.end()
    out.append(text[end:])
    return "".join(out)


def _resolve(match: re.Match[str], on: date) -> str | None:
    groups = match.groupdict()
    if groups["day_word"]:
        word = groups["day_word"].lower()
        shift = {"yesterday": -1, "last night": -1, "tomorrow": 1}.get(word, 0)
        return _day(on + timedelta(days=shift))
    if groups["unit"]:
        return _ago(on, count_of(groups["count"]), groups["unit"].lower())
    if groups["span"]:
        step = {"last": -1, "this": 0, "next": 1}[groups["which"].lower()]
        if groups["span"].lower() != "weekend":
            return _ago(on, -step, groups["span"].lower())
        # The Saturday of this week, a week earlier for "last" (said on a Monday: the two days
        # before) and a week later for "next".
        return f"the weekend of {_day(_monday(on) + timedelta(days=5, weeks=step))}"
    weekday = WEEKDAYS.index(groups["weekday"].lower())
    if groups["which_day"].lower() == "last":
        return _day(on - timedelta(days=(on.weekday() - weekday - 1) % 7 + 1))
    return _day(on + timedelta(days=(weekday - on.weekday() - 1) % 7 + 1))


def _ago(on: date, count: int, unit: str) -> str:
    if unit == "day":
        return _day(on - timedelta(days=count))
    if unit == "week":
        return f"the week of {_day(_monday(on - timedelta(weeks=count)))}"
    if unit == "month":
        months = on.year * 12 + on.month - 1 - count  # since January of year 0
        return f"{MONTHS[months % 12].capitalize()} {months // 12}"
    return str(on.year - count)


def _monday(day: date) -> date:
    return day - timedelta(days=day.weekday())


def _day(day: date) -> str:
    return f"{day.day} {MONTHS[day.month - 1].capitalize()} {day.year}"
