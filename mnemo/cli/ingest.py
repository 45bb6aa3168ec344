"""`mnemo ingest FILE`: a conversation file (`sessions` of `goal` and `steps`, source
`<prefix>/<N>`) or a LoCoMo-style one (source `<sample_id>/<N>`). Each source is one
idempotent `Memory.ingest` and, unless disabled, a conversation thread of the same id."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, TypedDict

import msgspec
from rich.progress import TaskID

from mnemo.cli._database import CliError
from mnemo.cli._output import progress as bars, stderr_console
from mnemo.config import Config
from mnemo.errors import ConflictError, InvalidInputError, NotFoundError
from mnemo.ingest.model import IngestProgress, Step, Trajectory
from mnemo.ingest.service import check_ingest
from mnemo.memory import Memory
from mnemo.ports import JSONObject

_SESSION_KEY = re.compile(r"session_(\d+)")


@dataclass(frozen=True, slots=True)
class Source:
    """One session of the file: what `Memory.ingest` stores, and the same as thread messages."""

    source_id: str
    trajectory: Trajectory
    messages: list[JSONObject]


@dataclass(frozen=True, slots=True)
class Batch:
    """One conversation of the file (a progress bar)."""

    name: str
    sources: list[Source]


@dataclass(frozen=True, slots=True)
class IngestFile:
    """A parsed file: its shape, the repo it names (conversation files may), its batches."""

    shape: str
    repo: str | None
    batches: list[Batch]


class SourceReport(TypedDict):
    source_id: str
    created: bool
    nodes: int
    steps: int
    thread_id: str | None
    messages_saved: int


# What a file holds, read by msgspec: a shape's every field is checked as it is read.
NonBlank = Annotated[str, msgspec.Meta(pattern=r"\S")]


class _Step(msgspec.Struct):
    observation: NonBlank
    action: str


class Session(msgspec.Struct):
    goal: NonBlank
    steps: Annotated[list[_Step], msgspec.Meta(min_length=1)]


class Conversation(msgspec.Struct):
    sessions: Annotated[list[Session], msgspec.Meta(min_length=1)]
    repo: NonBlank | None = None
    queries: list[str] = []  # the demo's questions


class _Turn(msgspec.Struct):
    speaker: NonBlank
    text: str
    dia_id: str | None = None
    blip_caption: str | None = None


class _Sample(msgspec.Struct):
    # `session_N` turn lists, `session_N_date_time` texts, and the speakers' names.
    conversation: dict[str, list[_Turn] | str]
    sample_id: NonBlank | None = None


def read_json(path: Path) -> object:
    """The JSON value in the file at `path` (CliError when unreadable or not JSON)."""
    try:
        return msgspec.json.decode(path.read_bytes())
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except msgspec.DecodeError as exc:
        raise CliError(f"{path} is not a JSON file: {exc}") from exc
    except RecursionError as exc:
        raise CliError(f"{path} nests too deep to read") from exc


def load_file(path: Path, *, prefix: str | None = None) -> IngestFile:
    """Reads and checks a conversation or LoCoMo-style file (CliError naming the first offending
    entry)."""
    raw = read_json(path)
    if isinstance(raw, dict) and "conversation" in raw:
        raw = [raw]
    try:
        if isinstance(raw, list) and raw and all(
            isinstance(item, dict) and "conversation" in item for item in raw):
            samples = msgspec.convert(raw, list[_Sample])
            return IngestFile("locomo", None, [_locomo_batch(s, i) for i, s in enumerate(samples)])
        if isinstance(raw, dict) and ("sessions" in raw or "steps" in raw):
            conversation = msgspec.convert(raw if "sessions" in raw else {"sessions": [raw]},
                                           Conversation)
            sources = [
                Source(f"{prefix or path.stem}/{number}", Trajectory(
                    session.goal, [Step(s.observation, s.action) for s in session.steps]),
                    messages(session))
                for number, session in enumerate(conversation.sessions, start=1)]
            return IngestFile("conversation", conversation.repo, [Batch(path.stem, sources)])
    except msgspec.ValidationError as exc:
        raise CliError(f"{path}: {exc}") from exc
    raise CliError(
        f"{path} is neither a conversation (an object with 'sessions') nor a LoCoMo-style file "
        "(a list of objects with 'conversation')")


def messages(session: Session) -> list[JSONObject]:
    """A session's steps as conversation messages: the observation the user's, the action
    (when not blank) the assistant's."""
    out: list[JSONObject] = []
    for step in session.steps:
        out.append({"role": "user", "content": step.observation})
        if step.action.strip():
            out.append({"role": "assistant", "content": step.action})
    return out


def _locomo_batch(sample: _Sample, index: int) -> Batch:
    sample_id = sample.sample_id or f"conv-{index}"
    talk = sample.conversation
    numbered = sorted(
        (int(match.group(1)), key)
        for key in talk
        if (match := _SESSION_KEY.fullmatch(key)))
    if not numbered:
        raise CliError(f"[{index}].conversation has no session_N turn lists")
    sources = []
    for number, key in numbered:
        turns = talk[key]
        if isinstance(turns, str):
            raise CliError(f"[{index}].conversation.{key} must be a list of turns")
        date = str(talk.get(f"{key}_date_time", ""))
        steps: list[Step] = []
        messages: list[JSONObject] = []
        for t, turn in enumerate(turns):
            dia_id = _normalise_dia_id(turn.dia_id or f"D{number}:{t + 1}")
            shown = f" [shares a photo of {turn.blip_caption}]" if turn.blip_caption else ""
            # The exact text and metadata of scripts/eval_locomo.py.
            steps.append(Step(f"{turn.speaker} ({date}): {turn.text}{shown}", "",
                              {"dia_id": dia_id}))
            messages.append({"role": "user", "name": turn.speaker,
                             "content": turn.text + shown, "dia_id": dia_id})
        if steps:
            trajectory = Trajectory(f"Conversation session {number} on {date}", steps)
            sources.append(Source(f"{sample_id}/{number}", trajectory, messages))
    return Batch(sample_id, sources)


def _normalise_dia_id(raw: str) -> str:
    """'D1:3 ', 'D:1:3' and 'd1:3' all mean D1:3 (as scripts/eval_locomo.py reads them)."""
    digits = re.findall(r"\d+", raw)
    return f"D{digits[0]}:{digits[1]}" if len(digits) >= 2 else raw.strip()


def check_sources(parsed: IngestFile, config: Config) -> None:
    """CliError naming the first source of the file that `config` refuses."""
    for batch in parsed.batches:
        for source in batch.sources:
            try:
                check_ingest(source.trajectory, source.source_id, None, config)
            except InvalidInputError as exc:
                raise CliError(f"source {source.source_id!r}: {exc}") from exc


async def ingest_file(mem: Memory, repo: str, parsed: IngestFile, given: Config, *,
                      threads: bool, quiet: bool) -> list[SourceReport]:
    """Ingests every source of the file into `repo`, with progress bars on stderr (unless
    `quiet`), and with `threads` saves each session as a thread. Every source is checked first,
    by the repo's config (`given` for a new repo; CliError naming it), so a file that cannot go
    in whole stores nothing, not even the repo."""
    try:  # checked before a new repo is made: by the config it will have
        config = await mem.repo_config(repo)
    except NotFoundError:
        config = given
    check_sources(parsed, config)
    await mem.open_repo(repo)
    conversation = mem.conversation()
    report: list[SourceReport] = []
    with bars(stderr_console(), disable=quiet) as progress:
        for batch in parsed.batches:
            task = progress.add_task(f"ingest {batch.name}", total=len(batch.sources))
            for source in batch.sources:
                steps = progress.add_task(
                    f"  {source.source_id}", total=len(source.trajectory.steps))

                def advance(update: IngestProgress, steps: TaskID = steps) -> None:
                    progress.update(steps, completed=update.done,
                                    description=f"  {update.source_id}: {update.stage}")

                saved, sid = 0, source.source_id
                try:
                    if threads:  # the stored part checked, nothing new saved yet
                        stored = await conversation.count(sid)
                        await conversation.save(sid, source.messages[:stored])
                    receipt = await mem.ingest(
                        repo, source.trajectory, source_id=sid, progress=advance)
                except (ConflictError, InvalidInputError) as exc:
                    named = str(exc) if repr(sid) in str(exc) else f"source {sid!r}: {exc}"
                    raise CliError(  # as a source or thread ingested before, or forgotten
                        f"{named}; to replace what was ingested under it, `mnemo purge {sid}"
                        f" --repo {repo}` erases it and its thread") from exc
                try:
                    if threads:  # only what is new: a second ingest appends nothing
                        saved = len(await conversation.save(sid, source.messages))
                except (ConflictError, InvalidInputError) as exc:
                    raise CliError(  # another writer changed the thread meanwhile
                        f"source {sid!r} was ingested, but its thread refused the messages:"
                        f" {exc}; `mnemo purge {sid} --repo {repo}` erases both") from exc
                progress.remove_task(steps)
                report.append({
                    "source_id": source.source_id, "created": receipt.created,
                    "nodes": len(receipt.node_ids), "steps": len(source.trajectory.steps),
                    "thread_id": source.source_id if threads else None, "messages_saved": saved})
                progress.advance(task)
    return report
