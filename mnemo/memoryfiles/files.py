"""`MemoryFiles`: a directory of topic files that an agent reads at the start of work.

Writes are serialised: each holds the directory's writer lock from its scan of the topics,
through its model calls (the topic pick, any condensing), to its last file written, so it picks
its topics from the directory as it is when it writes, and concurrent writes give what some
serial order of them gives. Every `MemoryFiles` object and every process on the directory
honours it (`_lock.DirectoryLock`: an OS file lock, waited for in a worker thread). Asking
outside the lock and merging split one topic across files: 20 related statements persisted at
once made 20 files, not 1. Files are read, merged and written under the shorter
file lock too, which `recall` takes alone to record a use, so a reader never waits for a model.

A write is atomic: the new text goes to a temporary file in the same directory, is fsynced,
then `os.replace`s the old one, so a reader sees the old file or the new one, never half.
Nothing inside the directory is followed through a link (`_folder.Folder`): a link planted
there is neither read nor written through.
"""

from __future__ import annotations

import builtins
import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import anyio
import anyio.to_thread

from mnemo.adapters.offline import OfflineLLM
from mnemo.errors import InvalidInputError, LLMError
from mnemo.inputs import DEFAULT_MAX_TEXT_CHARS, MAX_TEXT_CHARS_LIMIT, check_models, check_text
from mnemo.memoryfiles import _format, _select
from mnemo.memoryfiles._asking import LLM_TIMEOUT_S, CountingLLM, ask, ask_fitting
from mnemo.memoryfiles._folder import Folder, check_directory
from mnemo.memoryfiles._lock import WRITER_LOCK_FILE, DirectoryLock
from mnemo.memoryfiles.model import MemoryFile, MemoryUpdate
from mnemo.memoryfiles.prompts import (
    TopicChange,
    memory_condense_request,
    memory_persist_request,
    memory_update_request,
    parse_condense,
    parse_persist,
    parse_update,
    statement_entry,
)
from mnemo.ports import LLM

log = logging.getLogger("mnemo")

# A writer waits for the writers before it, each holding the writer lock through a few model
# calls of at most `LLM_TIMEOUT_S`: a wait this long means a queue of stuck or slow writers.
WRITER_WAIT_S = 5 * LLM_TIMEOUT_S
MIN_MAX_CHARS = 20


@dataclass(frozen=True, slots=True)
class _Planned:
    """A change ready to merge into its file.

    `base` is what the LLM was shown of the file (None: the change only adds, and removes
    the entries its `remove` names); `allow_removal` lets entries of `base` the change left
    out, or the entries it names, go (a correction); `condensed`, once the
    `memory_condense` task rewrote the change to fit, holds the entries it gave up.
    """

    change: TopicChange
    base: builtins.list[str] | None
    allow_removal: bool
    condensed: tuple[str, ...] | None = None


class MemoryFiles:
    """Long-term memory as one Markdown file per topic in `directory` (created when first
    written).

    Each file has a front matter (`topic`, `description`, `updated`, and `used`, the last time
    `recall` returned it: the use is recorded in the file itself, so copying the directory
    keeps it) and a body of one entry per line, oldest first, at most `max_chars` characters.
    `update` files what a conversation decided, established, corrected or preferred; `persist`
    files one statement on request; `list` and `recall` read them back.

    A write that would take a file past `max_chars` first asks the `memory_condense` task to
    merge and shorten its entries (the model knows what matters); only when that fails are the
    oldest entries dropped. `enabled=False` turns writing off: `update` and `persist` then ask
    nothing and write nothing, and their results say `skipped="disabled"` (`list` and
    `recall` still read).

    `clock` (UTC `datetime`s) stamps `updated` and `used`; tests inject one.
    `max_text_chars` bounds every text given (a statement, a query, each history message), as
    `Config.max_text_chars` does for `Memory`.

    Nothing inside the directory is followed through a link: a topic file that is a link (or
    a FIFO, or anything not a regular file) is neither listed nor read, and a write replaces
    it. With `root`, `directory` must lie inside `root` and no folder from `root` down to it
    may be a link (what an agent names, as the MCP server's `directory`, cannot lead out).

    Raises:
        InvalidInputError: `max_chars` is not an int from 20 to `MAX_TEXT_CHARS_LIMIT`,
            `min_iterations` not a non-negative int, `max_text_chars` not a positive int, or
            `directory` not a path the system can name (a NUL, a name past 255 bytes), or
            not inside `root`.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_chars: int = 4000,
        min_iterations: int = 10,
        enabled: bool = True,
        clock: Callable[[], datetime] | None = None,
        max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
        root: str | os.PathLike[str] | None = None,
    ) -> None:
        if not _is_int(max_chars) or not MIN_MAX_CHARS <= max_chars <= MAX_TEXT_CHARS_LIMIT:
            raise InvalidInputError(
                f"max_chars must be an int from {MIN_MAX_CHARS} to {MAX_TEXT_CHARS_LIMIT:,}, "
                f"got {max_chars!r}"
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
        self.directory = check_directory(directory)
        self._folder = Folder(
            self.directory, None if root is None else check_directory(root, "root")
        )
        self.max_chars = max_chars
        self.min_iterations = min_iterations
        self.enabled = bool(enabled)
        self._clock = clock or _utc_now
        self._lock = DirectoryLock(self._folder)
        self._writer = DirectoryLock(self._folder, WRITER_LOCK_FILE, wait_s=WRITER_WAIT_S)

    # ---- reading --------------------------------------------------------------------------

    def list(self) -> builtins.list[MemoryFile]:
        """Every topic file, most recently updated first ([] when nothing was written).

        A `.md` file without front matter (written by hand) is listed too: its topic is its
        file name, its `updated` its modification time. Hidden files are skipped.
        """
        return [stored.file() for stored in _select.newest_first(self._scan())]

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
            TimeoutError: another writer held the directory's lock for 60 s.
        """
        check_text(query, "query", limit=self.max_text_chars, stored=False)
        if not _is_int(limit) or limit < 1:
            raise InvalidInputError(f"limit must be a positive int, got {limit!r}")
        wanted = _select.stems(query)
        if not wanted:
            return []
        stored = await anyio.to_thread.run_sync(self._scan)
        scored = [(score, s) for s in stored if (score := _select.relevance(wanted, s)) > 0]
        scored.sort(key=lambda item: item[1].topic)
        scored.sort(key=lambda item: (item[0], item[1].last_used), reverse=True)
        picked = [s for _, s in scored[:limit]]
        now = self._now()
        if picked:
            async with self._lock.held():
                for s in picked:
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

        Does nothing and asks nothing when disabled (`skipped="disabled"`), for a sub-agent,
        when `iterations` is below `min_iterations`, or when `history` holds no user or
        assistant text. Otherwise it
        asks the `memory_update` task (of `llm`, or of the offline LLM when None) which
        topics the user and assistant messages touched, showing every file's topic and
        description and the content of the files most related to the conversation, and
        merges its answer into the files: each topic's new entries, and the entries a
        correction removes (at most `prompts.MAX_UPDATE_FILES` topics, a bounded reply a
        small model's context holds). A prompt the model's context refuses is asked again
        with about half the messages (the newest) and half the files' text (the most
        related), up to five times. Only a correction removes an entry; a
        topic's file is found by its normalised topic (`_format.topic_key`), so a topic never
        splits across files; each file is bounded by `max_chars` (condensed by the LLM first,
        see the class doc), and `files` reports what that cost.

        Never raises (cancellation aside): a failure is logged and returned in `error`, along
        with the topics written before it and the usage of every LLM call made.
        """
        metered: CountingLLM | None = None
        written: builtins.list[str] = []
        results: builtins.list[tuple[bool, MemoryFile]] = []
        try:
            check_models(llm, None)
            if not self.enabled:
                return MemoryUpdate(skipped="disabled")
            if is_subagent or iterations < self.min_iterations:
                return MemoryUpdate()
            conversation = _select.conversation(history, self.max_text_chars)
            if not conversation:
                return MemoryUpdate()
            metered = CountingLLM(llm if llm is not None else OfflineLLM())
            async with self._writer.held():
                stored = await anyio.to_thread.run_sync(self._scan)
                views = _select.views(conversation, _select.listing(stored, conversation))
                changes = await ask_fitting(
                    metered,
                    [memory_update_request(conversation=m, files=f) for m, f in views],
                    parse_update,
                )
                planned = [
                    _Planned(c, None, "correction" in c.signals) for c in _select.combine(changes)
                ]
                await self._commit(planned, metered, written, results)
        except Exception as exc:
            log.warning("memory update in %s failed: %r", self.directory, exc)
            usage = metered.usage if metered is not None else None
            error = f"{type(exc).__name__}: {exc}"
            return MemoryUpdate(written, usage, error, [f for changed, f in results if changed])
        return MemoryUpdate(written, metered.usage, None, [f for changed, f in results if changed])

    async def persist(self, what: str, *, llm: LLM | None) -> MemoryFile:
        """Files the statement `what` on request ("remember this") and returns its file.

        The `memory_persist` task (of `llm`, or of the offline LLM when None, which files the
        statement itself under a topic named from its key phrase or an existing topic sharing
        its words) picks the topic and may reword the statement as a self-contained entry; an
        entry that does not keep the statement's content (`prompts.statement_entry`) is
        replaced by the statement as given. The entry is appended unless already there, and
        the file is bounded by `max_chars` like any other write (the returned file says what
        that cost).
        With `enabled=False` nothing is asked or written, and the result's `skipped` is
        `"disabled"`.

        Raises:
            InvalidInputError: `what` is not a string, has no words (blank, or only
                punctuation), or is longer than `max_text_chars`; `llm` is not an LLM.
            LLMError: the LLM failed or kept answering something unusable.
            LLMTimeout: the LLM did not answer within `LLM_TIMEOUT_S` (120) seconds.
            OSError: the file could not be written (the old file is left intact), or
                (`TimeoutError`) the writes before it held the directory's writer lock for
                `WRITER_WAIT_S` seconds, or one held its file lock for 60 s.
        """
        if not isinstance(what, str) or not _format.entry_key(what):
            # Only bullets and punctuation (".") leave nothing to file.
            raise InvalidInputError(f"what must be a statement with words, got {what!r}")
        check_text(what, "what", limit=self.max_text_chars)
        check_models(llm, None)
        if not self.enabled:
            return MemoryFile("", "", self.directory, self._now(), "", skipped="disabled")
        statement = " ".join(what.split())
        model = llm if llm is not None else OfflineLLM()
        results: builtins.list[tuple[bool, MemoryFile]] = []
        async with self._writer.held():
            stored = await anyio.to_thread.run_sync(self._scan)
            request = memory_persist_request(
                statement=statement,
                files=[{"topic": s.topic, "description": s.description} for s in stored],
            )
            filed = await ask(model, request, parse_persist)
            entry = statement_entry(filed.entry, statement)
            if entry != filed.entry:
                log.warning(
                    "memory_persist: the model's entry %r does not keep the statement; filing "
                    "the statement as given", filed.entry[:200],
                )
            change = TopicChange(
                topic=filed.topic,
                description=filed.description,
                signals=("context",),
                content=f"- {entry}",
            )
            await self._commit([_Planned(change, None, False)], model, [], results)
        return results[0][1]

    async def _condense(self, llm: LLM, planned: _Planned) -> _Planned:
        """`planned`, rewritten by the `memory_condense` task when it would take its file past
        `max_chars`; as it is when it fits, or when the task fails (the write then drops the
        oldest entries, and says so).

        The caller holds the writer lock, so no other write changes the file meanwhile; what
        the LLM returns is still merged three ways against the file as it read it, like any
        change (a person may edit a file by hand).
        """
        stored = await anyio.to_thread.run_sync(self._scan)
        key = _format.topic_key(planned.change.topic)
        existing = next((s for s in stored if _format.topic_key(s.topic) == key), None)
        current = _format.entries(existing.body) if existing else []
        lines = _format.dedupe(
            _format.merge(
                current,
                _format.entries(planned.change.content),
                planned.base,
                allow_removal=planned.allow_removal,
                removed=planned.change.remove,
            )
        )
        if len(_format.body(lines)) <= self.max_chars:
            return planned
        description = planned.change.description or (existing.description if existing else "")
        request = memory_condense_request(
            topic=existing.topic if existing else planned.change.topic,
            description=description,
            entries=lines,
            max_chars=self.max_chars,
        )
        try:
            condensed = await ask(
                llm, request, functools.partial(parse_condense, max_chars=self.max_chars)
            )
        except LLMError as exc:
            log.warning("condensing memory file %r failed: %r", planned.change.topic, exc)
            return planned
        kept = {_format.entry_key(line) for line in condensed.lines}
        change = TopicChange(
            topic=planned.change.topic,
            description=condensed.description or description,
            signals=planned.change.signals,
            content=_format.body(condensed.lines),
        )
        gone = tuple(line for line in lines if _format.entry_key(line) not in kept)
        return _Planned(change, current, True, gone)

    async def _commit(
        self,
        planned: builtins.list[_Planned],
        llm: LLM,
        written: builtins.list[str],
        results: builtins.list[tuple[bool, MemoryFile]],
    ) -> None:
        """Writes each change into its topic's file, condensed first when it would not fit.

        `written` collects the topics of the files that changed and `results` each file as
        written (or as it is, when unchanged) with whether it changed, as they change: a
        failure part-way still reports them. The caller holds the writer lock.
        """
        if not planned:
            return
        planned = [await self._condense(llm, p) for p in planned]
        async with self._lock.held():
            # Read under the lock: a use `recall` stamped since is kept.
            stored = await anyio.to_thread.run_sync(self._scan)
            by_key: dict[str, _select.Stored] = {}
            for s in stored:
                by_key.setdefault(_format.topic_key(s.topic), s)
            taken = {s.path.name.casefold() for s in stored}
            for p in planned:
                key = _format.topic_key(p.change.topic)
                existing = by_key.get(key)
                if existing is not None:
                    path, topic = existing.path, existing.topic
                else:
                    path, topic = self._new_path(p.change.topic, taken), p.change.topic
                    taken.add(path.name.casefold())
                changed, file = await anyio.to_thread.run_sync(self._merge_write, path, topic, p)
                if changed:
                    written.append(topic)
                if file is not None:
                    results.append((changed, file))

    def _merge_write(
        self, path: Path, topic: str, planned: _Planned
    ) -> tuple[bool, MemoryFile | None]:
        """Merges the change into the file at `path` and writes it; returns whether it
        changed, and the file as it now is (None when there is none: an empty file is never
        created). The caller holds the write lock, so the file read is the latest."""
        current = self._read(path)
        current_lines = _format.entries(current.body) if current else []
        lines = _format.merge(
            current_lines,
            _format.entries(planned.change.content),
            planned.base,
            allow_removal=planned.allow_removal,
            removed=planned.change.remove,
        )
        fitted = _format.bound(_format.dedupe(lines), self.max_chars)
        if not fitted.lines:
            return False, current.file() if current else None
        description = planned.change.description or (current.description if current else "")
        if fitted.dropped:
            # The entries the description was written for may be among those dropped.
            description = _format.follow(description, fitted.lines)
        unchanged = current is not None and fitted.lines == current_lines
        if current is not None and unchanged and description == current.description:
            return False, current.file()
        updated = self._now()
        content = _format.body(fitted.lines)
        text = _format.render(
            topic=topic,
            description=description,
            updated=updated,
            used=current.used if current else None,
            content=content,
        )
        self._folder.write(path.name, text)
        file = MemoryFile(
            topic,
            description,
            path,
            updated,
            content,
            dropped=(planned.condensed or ()) + fitted.dropped,
            condensed=planned.condensed is not None,
            truncated=fitted.truncated,
        )
        return True, file

    def _touch(self, path: Path, when: datetime) -> None:
        """Records a use of the file at `path` in its front matter; its body is left as is."""
        current = self._read(path)
        if current is None:
            return
        self._folder.write(
            path.name,
            _format.render(
                topic=current.topic,
                description=current.description,
                updated=current.updated,
                used=when,
                content=current.body,
            ),
        )

    # ---- files ----------------------------------------------------------------------------

    def _scan(self) -> builtins.list[_select.Stored]:
        # Temporary files start with "." (see `_folder.Folder.write`), and so do hidden files.
        found: builtins.list[_select.Stored] = []
        for name in self._folder.names():
            stored = self._read(self.directory / name)
            if stored is not None:
                found.append(stored)
        return found

    def _read(self, path: Path) -> _select.Stored | None:
        """The file at `path`, or None when it is gone or is not a regular file (a link)."""
        try:
            read = self._folder.read(path.name)
        except OSError:
            return None
        if read is None:
            return None
        text, mtime = read
        parsed = _format.parse(text)
        return _select.Stored(
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
        while name.casefold() in taken or self._folder.taken(name):
            name, n = f"{stem}-{n}.md", n + 1
        return self.directory / name

    def _now(self) -> datetime:
        when = self._clock()
        return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


# ---- helpers ------------------------------------------------------------------------------


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
