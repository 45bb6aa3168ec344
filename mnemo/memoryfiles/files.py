"""`MemoryFiles`: a directory of topic files that an agent reads at the start of work.

Every write follows one protocol: the directory lock (one `anyio.Lock` per instance) is held
while topics are resolved to files and new file names are chosen, so two writers never create
two files for one topic; inside it, a per-file lock covers the read-merge-write of one file,
which is also what `recall` takes to record a use. The LLM is asked outside every lock: what
it wrote is merged against what it was shown (`_format.merge`), so a slow model never blocks
other writers and a concurrent update loses no entry.

A write is atomic: the new text goes to a temporary file in the same directory, is fsynced,
then `os.replace`s the old one, so a reader sees the old file or the new one, never half.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread

from mnemo.adapters import _text
from mnemo.adapters.offline import OfflineLLM
from mnemo.errors import InvalidInputError, LLMTimeout
from mnemo.inputs import DEFAULT_MAX_TEXT_CHARS, check_text
from mnemo.memoryfiles import _format
from mnemo.memoryfiles.model import MemoryFile, MemoryUpdate
from mnemo.memoryfiles.prompts import (
    TopicChange,
    memory_persist_request,
    memory_update_request,
    parse_persist,
    parse_update,
)
from mnemo.ports import LLM, LLMRequest, LLMResponse, Usage, ask

log = logging.getLogger("mnemo")

T = TypeVar("T")

LLM_TIMEOUT_S = 120.0
MIN_MAX_CHARS = 20
# Only the newest part of a long history is sent: a memory update runs every few iterations,
# so older messages were already seen by an earlier update.
_MAX_MESSAGE_CHARS = 4_000
_MAX_CONVERSATION_CHARS = 60_000
# At most this many files show their content to the LLM (all of them when there are no more).
_MAX_SHOWN_FILES = 8
_ROLES = frozenset({"user", "assistant"})
# Recall weights a query word by where it matches (the best place counts).
_TOPIC_WEIGHT, _DESCRIPTION_WEIGHT, _CONTENT_WEIGHT = 3, 2, 1


@dataclass(frozen=True, slots=True)
class _Stored:
    """One file as scanned: its resolved topic and times, and what it holds."""

    path: Path
    topic: str
    description: str
    updated: datetime
    used: datetime | None
    body: str

    def file(self) -> MemoryFile:
        return MemoryFile(self.topic, self.description, self.path, self.updated, self.body)

    @property
    def last_used(self) -> datetime:
        # Writing a file is a use too: a file written after another was recalled is newer.
        return max(self.used, self.updated) if self.used else self.updated


class _Metered:
    """An LLM wrapper that sums the usage of every reply, retries included."""

    def __init__(self, llm: LLM) -> None:
        self._llm = llm
        self.usage: Usage | None = None

    async def generate(self, request: LLMRequest) -> LLMResponse:
        response = await self._llm.generate(request)
        if response.usage is not None:
            self.usage = response.usage if self.usage is None else self.usage + response.usage
        return response


class MemoryFiles:
    """Long-term memory as one Markdown file per topic in `directory` (created when first
    written).

    Each file has a front matter (`topic`, `description`, `updated`, and `used`, the last time
    `recall` returned it: the use is recorded in the file itself, so copying the directory
    keeps it) and a body of one entry per line, oldest first, at most `max_chars` characters.
    `update` files what a conversation decided, established, corrected or preferred; `persist`
    files one statement on request; `list` and `recall` read them back.

    `clock` (UTC `datetime`s) stamps `updated` and `used`; tests inject one.
    `max_text_chars` bounds every text given (a statement, a query, each history message), as
    `Config.max_text_chars` does for `Memory`.

    Raises:
        InvalidInputError: `max_chars` is not an int of at least 20, `min_iterations` not a
            non-negative int, or `max_text_chars` not a positive int.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_chars: int = 4000,
        min_iterations: int = 10,
        clock: Callable[[], datetime] | None = None,
        max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
    ) -> None:
        if not _is_int(max_chars) or max_chars < MIN_MAX_CHARS:
            raise InvalidInputError(
                f"max_chars must be an int of at least {MIN_MAX_CHARS}, got {max_chars!r}"
            )
        if not _is_int(min_iterations) or min_iterations < 0:
            raise InvalidInputError(
                f"min_iterations must be a non-negative int, got {min_iterations!r}"
            )
        if not _is_int(max_text_chars) or max_text_chars < 1:
            raise InvalidInputError(
                f"max_text_chars must be a positive int, got {max_text_chars!r}"
            )
        self.max_text_chars = max_text_chars
        self.directory = Path(directory)
        self.max_chars = max_chars
        self.min_iterations = min_iterations
        self._clock = clock or _utc_now
        self._lock = anyio.Lock()
        self._file_locks: dict[str, anyio.Lock] = {}

    # ---- reading --------------------------------------------------------------------------

    def list(self) -> builtins.list[MemoryFile]:
        """Every topic file, most recently updated first ([] when nothing was written).

        A `.md` file without front matter (written by hand) is listed too: its topic is its
        file name, its `updated` its modification time. Hidden files are skipped.
        """
        return [stored.file() for stored in _newest_first(self._scan())]

    async def recall(self, query: str, *, limit: int = 5) -> builtins.list[MemoryFile]:
        """The files that match the words of `query`, most relevant first, at most `limit`.

        No LLM is asked. Each content word of the query (stemmed) scores 3 when it is in a
        file's topic, 2 in its description, 1 in its content; ties go to the most recently
        used (recalled or written) file. The files returned are touched: their `used` stamp is
        set to now, which is what "recently used" means next time. A query of only function
        words matches nothing.

        Raises:
            InvalidInputError: `query` is not a string, is blank or is longer than
                `max_text_chars`, or `limit` is not a positive int.
        """
        check_text(query, "query", limit=self.max_text_chars)
        if not _is_int(limit) or limit < 1:
            raise InvalidInputError(f"limit must be a positive int, got {limit!r}")
        wanted = _stems(query)
        if not wanted:
            return []
        stored = await anyio.to_thread.run_sync(self._scan)
        scored = [(score, s) for s in stored if (score := _relevance(wanted, s)) > 0]
        scored.sort(key=lambda item: item[1].topic)
        scored.sort(key=lambda item: (item[0], item[1].last_used), reverse=True)
        picked = [s for _, s in scored[:limit]]
        now = self._now()
        for s in picked:
            async with self._file_lock(s.path.name):
                await anyio.to_thread.run_sync(self._touch, s.path, now)
        return [s.file() for s in picked]

    # ---- writing --------------------------------------------------------------------------

    async def update(
        self,
        history: Sequence[Mapping[str, object]],
        *,
        llm: LLM | None,
        iterations: int,
        is_subagent: bool = False,
    ) -> MemoryUpdate:
        """Files what the conversation in `history` decided, established, corrected or
        preferred.

        Does nothing and asks nothing for a sub-agent, when `iterations` is below
        `min_iterations`, or when `history` holds no user or assistant text. Otherwise it
        asks the `memory_update` task (of `llm`, or of the offline LLM when None) which
        topics the user and assistant messages touched, showing every file's topic and
        description and the content of the files most related to the conversation, and
        writes the merged files. Only a correction removes an entry; a
        topic's file is found by its normalised topic (`_format.topic_key`), so a topic never
        splits across files; each file is bounded by `max_chars`.

        Never raises (cancellation aside): a failure is logged and returned in `error`, along
        with the topics written before it and the usage of every LLM call made.
        """
        metered: _Metered | None = None
        written: builtins.list[str] = []
        try:
            if is_subagent or iterations < self.min_iterations:
                return MemoryUpdate()
            conversation = _conversation(history, self.max_text_chars)
            if not conversation:
                return MemoryUpdate()
            metered = _Metered(llm if llm is not None else OfflineLLM())
            stored = await anyio.to_thread.run_sync(self._scan)
            shown = _shown(stored, conversation)
            files: builtins.list[dict[str, str]] = []
            base: dict[str, builtins.list[str]] = {}
            for s in stored:
                item = {"topic": s.topic, "description": s.description}
                if s.path in shown:
                    item["content"] = s.body
                    base.setdefault(_format.topic_key(s.topic), _format.entries(s.body))
                files.append(item)
            request = memory_update_request(
                conversation=conversation, files=files, max_chars=self.max_chars
            )
            changes = await _ask(metered, request, parse_update)
            await self._commit(_combine(changes), base, written)
        except Exception as exc:
            log.warning("memory update in %s failed: %r", self.directory, exc)
            usage = metered.usage if metered is not None else None
            return MemoryUpdate(written, usage, f"{type(exc).__name__}: {exc}")
        return MemoryUpdate(written, metered.usage, None)

    async def persist(self, what: str, *, llm: LLM | None) -> MemoryFile:
        """Files the statement `what` on request ("remember this") and returns its file.

        The `memory_persist` task (of `llm`, or of the offline LLM when None, which files the
        statement itself under a topic named from its key phrase or an existing topic sharing
        its words) picks the topic; the entry is appended unless already there, and the file is
        bounded by `max_chars` like any other write.

        Raises:
            InvalidInputError: `what` is not a string, has no words (blank, or only
                punctuation), or is longer than `max_text_chars`.
            LLMError: the LLM failed or kept answering something unusable.
            LLMTimeout: the LLM did not answer within `LLM_TIMEOUT_S` seconds.
            OSError: the file could not be written (the old file is left intact).
        """
        if not isinstance(what, str) or not _format.entry_key(what):
            # Only bullets and punctuation (".") leave nothing to file.
            raise InvalidInputError(f"what must be a statement with words, got {what!r}")
        check_text(what, "what", limit=self.max_text_chars)
        statement = " ".join(what.split())
        stored = await anyio.to_thread.run_sync(self._scan)
        request = memory_persist_request(
            statement=statement,
            files=[{"topic": s.topic, "description": s.description} for s in stored],
        )
        filed = await _ask(llm if llm is not None else OfflineLLM(), request, parse_persist)
        change = TopicChange(
            topic=filed.topic,
            description=filed.description,
            signals=("context",),
            content=f"- {filed.entry}",
        )
        paths = await self._commit([change], {}, [])
        stored_file = await anyio.to_thread.run_sync(self._read, paths[0])
        if stored_file is None:  # removed by someone else right after the write
            raise FileNotFoundError(paths[0])
        return stored_file.file()

    async def _commit(
        self,
        changes: builtins.list[TopicChange],
        base: dict[str, builtins.list[str]],
        written: builtins.list[str],
    ) -> builtins.list[Path]:
        """Writes each change into its topic's file; returns the files, in order.

        `base` maps a topic key to the entries the LLM was shown; `written` collects the
        topics of the files that changed, as they change (so a failure part-way still reports
        them).
        """
        paths: builtins.list[Path] = []
        async with self._lock:
            stored = await anyio.to_thread.run_sync(self._scan)
            by_key: dict[str, _Stored] = {}
            for s in stored:
                by_key.setdefault(_format.topic_key(s.topic), s)
            taken = {s.path.name.casefold() for s in stored}
            for change in changes:
                key = _format.topic_key(change.topic)
                existing = by_key.get(key)
                if existing is not None:
                    path, topic = existing.path, existing.topic
                else:
                    path, topic = self._new_path(change.topic, taken), change.topic
                    taken.add(path.name.casefold())
                async with self._file_lock(path.name):
                    changed = await anyio.to_thread.run_sync(
                        self._merge_write, path, topic, change, base.get(key)
                    )
                if changed:
                    written.append(topic)
                paths.append(path)
        return paths

    def _merge_write(
        self, path: Path, topic: str, change: TopicChange, base: builtins.list[str] | None
    ) -> bool:
        """Merges `change` into the file at `path` and writes it; False when nothing changed
        (or there is nothing to write: an empty file is never created)."""
        current = self._read(path)
        current_lines = _format.entries(current.body) if current else []
        lines = _format.merge(
            current_lines,
            _format.entries(change.content),
            base,
            allow_removal="correction" in change.signals,
        )
        lines = _format.fit(_format.dedupe(lines), self.max_chars)
        if not lines:
            return False
        description = change.description or (current.description if current else "")
        if current is not None and lines == current_lines and description == current.description:
            return False
        text = _format.render(
            topic=topic,
            description=description,
            updated=self._now(),
            used=current.used if current else None,
            content=_format.body(lines),
        )
        _atomic_write(path, text)
        return True

    def _touch(self, path: Path, when: datetime) -> None:
        """Records a use of the file at `path` in its front matter; its body is left as is."""
        current = self._read(path)
        if current is None:
            return
        _atomic_write(
            path,
            _format.render(
                topic=current.topic,
                description=current.description,
                updated=current.updated,
                used=when,
                content=current.body,
            ),
        )

    # ---- files ----------------------------------------------------------------------------

    def _scan(self) -> builtins.list[_Stored]:
        if not self.directory.is_dir():
            return []
        found: builtins.list[_Stored] = []
        for path in sorted(self.directory.glob("*.md")):
            # Temporary files start with "." (see `_atomic_write`), and so do hidden files.
            if path.name.startswith("."):
                continue
            stored = self._read(path)
            if stored is not None:
                found.append(stored)
        return found

    def _read(self, path: Path) -> _Stored | None:
        """The file at `path`, or None when it is gone or is not a regular file."""
        try:
            if not path.is_file():
                return None
            text = path.read_text(encoding="utf-8", errors="replace")
            mtime = path.stat().st_mtime
        except OSError:
            return None
        parsed = _format.parse(text)
        return _Stored(
            path=path,
            topic=parsed.topic or path.stem.replace("-", " "),
            description=parsed.description,
            updated=parsed.updated or datetime.fromtimestamp(mtime, UTC),
            used=parsed.used,
            body=parsed.body,
        )

    def _new_path(self, topic: str, taken: set[str]) -> Path:
        stem = _format.slug(topic)
        name, n = f"{stem}.md", 2
        while name.casefold() in taken or (self.directory / name).exists():
            name, n = f"{stem}-{n}.md", n + 1
        return self.directory / name

    def _file_lock(self, name: str) -> anyio.Lock:
        return self._file_locks.setdefault(name, anyio.Lock())

    def _now(self) -> datetime:
        when = self._clock()
        return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


# ---- helpers ------------------------------------------------------------------------------


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


async def _ask(llm: LLM, request: LLMRequest, parse: Callable[[LLMResponse], T]) -> T:
    try:
        with anyio.fail_after(LLM_TIMEOUT_S):
            return await ask(llm, request, parse)
    except TimeoutError as exc:
        raise LLMTimeout(
            f"the LLM did not answer task {request.task!r} within {LLM_TIMEOUT_S:g} s"
        ) from exc


def _atomic_write(path: Path, text: str) -> None:
    """Replaces the file at `path` with `text`, all or nothing.

    The temporary file lives in the same directory (so `os.replace` is a rename on one file
    system) and is fsynced before the rename, so a crash leaves the old or the new file. A
    replaced file keeps its permission bits; a new one gets mkstemp's 0600, fitting for notes
    about a user.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; not possible on Windows, where there is no O_DIRECTORY.
    flag = getattr(os, "O_DIRECTORY", None)
    if flag is None:
        return
    try:
        fd = os.open(directory, os.O_RDONLY | flag)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _newest_first(stored: builtins.list[_Stored]) -> builtins.list[_Stored]:
    ordered = sorted(stored, key=lambda s: s.topic)
    ordered.sort(key=lambda s: s.updated, reverse=True)
    return ordered


def _content_text(content: object) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, bytes | bytearray):
        parts: builtins.list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return ""


def _conversation(history: object, limit: int) -> builtins.list[dict[str, str]]:
    """The user and assistant messages of `history` that carry text, newest within budget.

    System messages are left out on purpose: an agent's system prompt usually holds the
    memory files themselves, which must not be filed again. Tool messages are left out too:
    tool output is none of the four signals.

    Raises:
        InvalidInputError: `history` is not a list of messages, or a message's text is longer
            than `limit`.
    """
    if isinstance(history, str | bytes) or not isinstance(history, Sequence):
        raise InvalidInputError("history must be a list of message dicts")
    messages: builtins.list[dict[str, str]] = []
    for index, message in enumerate(history):
        if not isinstance(message, Mapping):
            continue
        text = check_text(_content_text(message.get("content")), f"history[{index}].content",
                          limit=limit, blank_ok=True).strip()
        if message.get("role") not in _ROLES:
            continue
        if text:
            messages.append({"role": str(message["role"]), "content": text[:_MAX_MESSAGE_CHARS]})
    kept: builtins.list[dict[str, str]] = []
    total = 0
    for message in reversed(messages):
        total += len(message["content"])
        if total > _MAX_CONVERSATION_CHARS and kept:
            break
        kept.append(message)
    kept.reverse()
    return kept


def _shown(
    stored: builtins.list[_Stored], conversation: builtins.list[dict[str, str]]
) -> set[Path]:
    """The files whose content the LLM sees: all of them when few, else those whose topic
    and description share the most words with the conversation."""
    if len(stored) <= _MAX_SHOWN_FILES:
        return {s.path for s in stored}
    said: set[str] = set()
    for message in conversation:
        said |= _text.content_stems(message["content"])
    overlaps: builtins.list[tuple[int, _Stored]] = []
    for s in stored:
        overlap = len(said & _text.content_stems(f"{s.topic} {s.description}"))
        if overlap:
            overlaps.append((overlap, s))
    overlaps.sort(key=lambda item: (item[0], item[1].updated), reverse=True)
    return {s.path for _, s in overlaps[:_MAX_SHOWN_FILES]}


def _combine(changes: builtins.list[TopicChange]) -> builtins.list[TopicChange]:
    """One change per topic key, in first-seen order; changes without a signal are dropped.

    The LLM may name one topic twice ("Database", "database"): merging here is what keeps a
    topic in one file.
    """
    combined: dict[str, TopicChange] = {}
    for change in changes:
        if not change.signals:
            continue
        key = _format.topic_key(change.topic)
        seen = combined.get(key)
        if seen is None:
            combined[key] = change
            continue
        combined[key] = TopicChange(
            topic=seen.topic,
            description=seen.description or change.description,
            signals=tuple(dict.fromkeys(seen.signals + change.signals)),
            content=f"{seen.content}\n{change.content}",
        )
    return builtins.list(combined.values())


def _stems(text: str) -> set[str]:
    return {_text.stem(t) for t in _text.tokens(text) if not _text.is_stopword(t)}


def _relevance(wanted: set[str], stored: _Stored) -> int:
    topic, description, content = (
        _stems(stored.topic),
        _stems(stored.description),
        _stems(stored.body),
    )
    score = 0
    for word in wanted:
        if word in topic:
            score += _TOPIC_WEIGHT
        elif word in description:
            score += _DESCRIPTION_WEIGHT
        elif word in content:
            score += _CONTENT_WEIGHT
    return score
