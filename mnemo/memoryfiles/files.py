"""`MemoryFiles`: a directory of topic files an agent reads at the start of work. A write holds
the writer lock from its scan to its last file; files are merged and written under the shorter
file lock, which `recall` takes alone; `DirectoryLock` holds either across processes (an
`anyio.Lock`, then `flock` on a hidden file). Each ask is within `LLM_TIMEOUT_S`, usage summed,
and a prompt the model's context refuses asked again smaller."""

from __future__ import annotations

import builtins
import contextlib
import errno
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
import filelock

from mnemo.adapters.offline import OfflineLLM
from mnemo.calls import tasks
from mnemo.calls.retry import LimitedLLM, fail_after
from mnemo.errors import (
    DEFAULT_MAX_TEXT_CHARS,
    MAX_COUNT,
    MAX_TEXT_CHARS_LIMIT,
    InvalidInputError,
    LLMContextError,
    LLMError,
    LLMTimeout,
    check_count,
    check_models,
    check_text,
)
from mnemo.memoryfiles import _format, _select
from mnemo.memoryfiles._folder import Folder, check_directory
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
from mnemo.ports import LLM, LLMRequest, LLMResponse, Usage, add_usage
from mnemo.storage.sql import utc

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

T = TypeVar("T")

log = logging.getLogger("mnemo")

LLM_TIMEOUT_S = 120.0
# Hidden and not `.md`, so never listed as a topic.
LOCK_FILE = ".memoryfiles.lock"
WRITER_LOCK_FILE = ".memoryfiles.writer.lock"
# The file lock's longest wait: it is held for a read-merge-write of a few small files.
LOCK_WAIT_S = 60.0
_TRY_S = 0.1
# A writer's longest wait for the writers before it.
WRITER_WAIT_S = 5 * LLM_TIMEOUT_S


class CountingLLM(LimitedLLM):
    """`llm`, one call at a time under its own retry policy, summing in `usage` the tokens of
    every reply and the calls, retries and re-asks of every task (a failed call included)."""

    def __init__(self, llm: LLM) -> None:
        super().__init__(llm, anyio.CapacityLimiter(1), self._add)
        self.usage: Usage | None = None

    def _add(self, usage: Usage) -> None:
        self.usage = add_usage(self.usage, usage)


async def ask(llm: LLM, request: LLMRequest, parse: Callable[[LLMResponse], T], *,
              shorten: Callable[[LLMRequest], LLMRequest | None] | None = None) -> T:
    """`calls.tasks.ask` (with `shorten`) within `LLM_TIMEOUT_S` (LLMError, LLMTimeout)."""
    try:
        with fail_after(LLM_TIMEOUT_S):
            return await tasks.ask(llm, request, parse, shorten=shorten)
    except LLMTimeout:  # the model's own, after its retries
        raise
    except TimeoutError as exc:
        raise LLMTimeout(
            f"the LLM did not answer task {request.task!r} within {LLM_TIMEOUT_S:g} s") from exc


async def ask_fitting(llm: LLM, requests: Sequence[LLMRequest],
                      parse: Callable[[LLMResponse], T]) -> T:
    """`ask` the first of `requests` (each smaller than the one before), and the next while the
    model's context refuses them (`LLMContextError` when the last did not fit either); `ask`
    shortens none of them itself."""
    *larger, smallest = requests
    for request in larger:
        try:
            return await ask(llm, request, parse, shorten=lambda _: None)
        except LLMContextError:
            log.warning("task %s: the prompt did not fit the model's context; asking with "
                        "smaller inputs", request.task)
    return await ask(llm, smallest, parse, shorten=lambda _: None)


class DirectoryLock:
    """A lock of `folder` held on the file `name` in it (both created when the lock is first
    taken); a wait for another process's hold gives up after `wait_s` seconds."""

    def __init__(self, folder: Folder, name: str = LOCK_FILE, *,
                 wait_s: float = LOCK_WAIT_S) -> None:
        self.folder = folder
        self.name = name
        self.path = folder.path / name
        self.wait_s = wait_s
        self._local = anyio.Lock()
        # Not thread-local: taken in a worker thread, released on the event loop's.
        self._path_lock = None if fcntl is not None else filelock.FileLock(
            str(self.path), thread_local=False)
        self._fd = -1

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Holds the lock for the block. TimeoutError: another writer held it for `wait_s`
        seconds; InvalidInputError: a folder below the root is a link; OSError: the directory
        or the lock file could not be opened."""
        async with self._local:
            deadline = anyio.current_time() + self.wait_s
            while True:
                # Shielded: a lock the thread took must be released below; the checkpoint
                # between tries lets a cancellation in.
                with anyio.CancelScope(shield=True):
                    taken = await anyio.to_thread.run_sync(self._try)
                if taken:
                    break
                if anyio.current_time() >= deadline:
                    raise TimeoutError(f"another writer held {self.path} for {self.wait_s:g} s")
                await anyio.lowlevel.checkpoint()
            try:
                yield
            finally:
                self._release()

    def _try(self) -> bool:
        if self._path_lock is not None:
            self.folder.path.mkdir(parents=True, exist_ok=True)
            try:
                self._path_lock.acquire(timeout=_TRY_S)
            except filelock.Timeout:
                return False
            return True
        fd = self.folder.open_lock(self.name)
        deadline = time.monotonic() + _TRY_S
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    # Some file systems answer EACCES for a lock another holds.
                    if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        os.close(fd)
                        return False
                    time.sleep(0.01)
                    continue
                self._fd = fd
                return True
        except BaseException:
            os.close(fd)
            raise

    def _release(self) -> None:
        if self._path_lock is not None:
            self._path_lock.release()
            return
        fd, self._fd = self._fd, -1
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@dataclass(frozen=True, slots=True)
class _Planned:
    """A change ready to merge into its file: `base` is what the LLM was shown (None: it only
    adds), `allow_removal` lets entries go, `condensed` what condensing gave up, `truncated`
    whether it cut an entry short (kept its leading words)."""

    change: TopicChange
    base: builtins.list[str] | None
    allow_removal: bool
    condensed: tuple[str, ...] | None = None
    truncated: bool = False

    def merged(self, current: builtins.list[str]) -> builtins.list[str]:
        """The entries of a file of `current` entries with this change merged in, each once."""
        return _format.dedupe(_format.merge(
            current, _format.entries(self.change.content), self.base,
            allow_removal=self.allow_removal, removed=self.change.remove))


# What `max_text_chars` bounds here, as an error names it.
_BOUND = "MemoryFiles(max_text_chars=)"


class MemoryFiles:
    """Long-term memory as one Markdown file per topic in `directory`, each at most `max_chars`
    (condensed by the LLM first, else its oldest entries dropped). `enabled=False` turns writing
    off; with `root`, no folder from `root` down to `directory` may be a link.

    Raises:
        InvalidInputError: a bound out of its range, or a `directory` the system cannot name or
            not inside `root`."""

    def __init__(
        self, directory: str | os.PathLike[str], *, max_chars: int = 4000, min_iterations: int = 10,
        enabled: bool = True, clock: Callable[[], datetime] | None = None,
        max_text_chars: int = DEFAULT_MAX_TEXT_CHARS, root: str | os.PathLike[str] | None = None,
    ) -> None:
        check_count("max_chars", max_chars, minimum=20, maximum=MAX_TEXT_CHARS_LIMIT)
        check_count("min_iterations", min_iterations, maximum=MAX_COUNT)
        check_count("max_text_chars", max_text_chars, minimum=1)
        self.max_text_chars = max_text_chars
        self.directory = check_directory(directory)
        self._folder = Folder(
            self.directory, None if root is None else check_directory(root, "root"))
        self.max_chars = max_chars
        self.min_iterations = min_iterations
        self.enabled = bool(enabled)
        self._clock = clock or functools.partial(datetime.now, UTC)
        self._lock = DirectoryLock(self._folder)
        self._writer = DirectoryLock(self._folder, WRITER_LOCK_FILE, wait_s=WRITER_WAIT_S)

    def list(self) -> builtins.list[MemoryFile]:
        """Every topic file, most recently updated first (hidden files skipped)."""
        newest = sorted(self._scan(), key=lambda s: (-s.updated.timestamp(), s.topic))
        return [stored.file() for stored in newest]

    async def recall(self, query: str, *, limit: int = 5,
                     reinforce: bool = True) -> builtins.list[MemoryFile]:
        """The files that match the words of `query`, most relevant first, at most `limit`, without
        an LLM (topic words weigh 3, description 2, content 1); they get `used` set to now unless
        `reinforce=False`, which writes nothing.

        Raises:
            InvalidInputError: a blank or too long `query`, or a `limit` below 1.
            TimeoutError: another writer held the directory's lock too long."""
        check_text(query, "query", limit=self.max_text_chars, stored=False, setting=_BOUND)
        check_count("limit", limit, minimum=1, maximum=MAX_COUNT)
        wanted = _select.stems(query)
        if not wanted:
            return []
        stored = await anyio.to_thread.run_sync(self._scan)
        scored = [(score, s) for s in stored if (score := _select.relevance(wanted, s)) > 0]
        scored.sort(key=lambda item: (-item[0], -item[1].last_used.timestamp(), item[1].topic))
        picked = [s for _, s in scored[:limit]]
        now = self._now()
        if picked and reinforce:
            async with self._lock.held():
                for s in picked:
                    await anyio.to_thread.run_sync(self._touch, s.path, now)
        return [s.file() for s in picked]

    async def update(self, history: Sequence[Mapping[str, object]], *, llm: LLM | None,
                     iterations: int, is_subagent: bool = False) -> MemoryUpdate:
        """Files what the conversation in `history` decided, established, corrected or preferred,
        through the `memory_update` task; nothing when disabled, for a sub-agent, or below
        `min_iterations`. Never raises (cancellation aside): a failure is returned in `error`."""
        metered: CountingLLM | None = None
        results: builtins.list[tuple[bool, MemoryFile]] = []
        error = None
        try:
            check_models(llm, None)
            check_count("iterations", iterations)
            if not self.enabled:
                return MemoryUpdate(skipped="disabled")
            if is_subagent or iterations < self.min_iterations:
                return MemoryUpdate()
            conversation = _select.conversation(history, self.max_text_chars, _BOUND)
            if not conversation:
                return MemoryUpdate()
            metered = CountingLLM(llm if llm is not None else OfflineLLM())
            async with self._writer.held():
                stored = await anyio.to_thread.run_sync(self._scan)
                views = _select.views(conversation, _select.listing(stored, conversation))
                changes = await ask_fitting(
                    metered, [memory_update_request(conversation=m, files=f) for m, f in views],
                    parse_update)
                planned = [
                    _Planned(c, None, "correction" in c.signals) for c in _select.combine(changes)]
                await self._commit(planned, metered, results)
        except Exception as exc:
            log.warning("memory update in %s failed: %r", self.directory, exc)
            error = f"{type(exc).__name__}: {exc}"
        files = [f for changed, f in results if changed]
        usage = metered.usage if metered else None
        return MemoryUpdate([f.topic for f in files], usage, error, files)

    async def persist(self, what: str, *, llm: LLM | None) -> MemoryFile:
        """Files the statement `what` on request ("remember this") through the `memory_persist` task
        and returns its file (`skipped="disabled"` when disabled).

        Raises:
            InvalidInputError: `what` has no words or is too long; `llm` is not an LLM.
            LLMError: the LLM failed or kept answering something unusable.
            OSError: the file could not be written, or (`TimeoutError`) a lock was held too long."""
        if not isinstance(what, str) or not _format.entry_key(what):
            # Only bullets and punctuation (".") leave nothing to file.
            raise InvalidInputError(f"what must be a statement with words, got {what!r}")
        check_text(what, "what", limit=self.max_text_chars, setting=_BOUND)
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
                files=[{"topic": s.topic, "description": s.description} for s in stored])
            filed = await ask(model, request, parse_persist)
            entry = statement_entry(filed.entry, statement)
            if entry != filed.entry:
                log.warning(
                    "memory_persist: the model's entry %r does not keep the statement; filing "
                    "the statement as given", filed.entry[:200])
            change = TopicChange(filed.topic, filed.description, ("context",), f"- {entry}")
            await self._commit([_Planned(change, None, False)], model, results)
        return results[0][1]

    async def _condense(self, llm: LLM, planned: _Planned) -> _Planned:
        """`planned`, rewritten by the `memory_condense` task when it would take its file past
        `max_chars` (merged three ways like any change); as it is when it fits or the task fails."""
        stored = await anyio.to_thread.run_sync(self._scan)
        key = _format.topic_key(planned.change.topic)
        existing = next((s for s in stored if _format.topic_key(s.topic) == key), None)
        current = _format.entries(existing.body) if existing else []
        lines = planned.merged(current)
        if len(_format.body(lines)) <= self.max_chars:
            return planned
        description = planned.change.description or (existing.description if existing else "")
        request = memory_condense_request(
            topic=existing.topic if existing else planned.change.topic,
            description=description, entries=lines, max_chars=self.max_chars)
        try:
            condensed = await ask(
                llm, request, functools.partial(parse_condense, max_chars=self.max_chars))
        except LLMError as exc:
            log.warning("condensing memory file %r failed: %r", planned.change.topic, exc)
            return planned
        kept = {_format.entry_key(line) for line in condensed.lines}
        change = TopicChange(planned.change.topic, condensed.description or description,
                             planned.change.signals, _format.body(condensed.lines))
        given = {_format.entry_key(line) for line in lines}
        new = [line for line in condensed.lines if _format.entry_key(line) not in given]
        left = [line for line in lines if _format.entry_key(line) not in kept]
        # An entry kept only cut short is truncated, not given up; condensing that only cut
        # entries condensed nothing.
        cuts = [(short, line) for short in new for line in left if _format.cut_short(short, line)]
        cut = {line for _, line in cuts}
        gone = tuple(line for line in left if line not in cut)
        rewritten = len({short for short, _ in cuts}) < len(set(new))
        return _Planned(change, current, True, gone if gone or rewritten else None, bool(cut))

    async def _commit(self, planned: builtins.list[_Planned], llm: LLM,
                      results: builtins.list[tuple[bool, MemoryFile]]) -> None:
        """Writes each change into its topic's file, condensed first when it would not fit, adding
        (whether it changed, the file) to `results` as it goes; the caller holds the writer
        lock."""
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
                existing = by_key.get(_format.topic_key(p.change.topic))
                if existing is not None:
                    path, topic = existing.path, existing.topic
                else:
                    path, topic = self._new_path(p.change.topic, taken), p.change.topic
                    taken.add(path.name.casefold())
                changed, file = await anyio.to_thread.run_sync(self._merge_write, path, topic, p)
                if file is not None:
                    results.append((changed, file))

    def _merge_write(self, path: Path, topic: str,
                     planned: _Planned) -> tuple[bool, MemoryFile | None]:
        """Merges the change into the file at `path` and writes it; returns whether it changed
        and the file as it now is (None: an empty file is never created; one a correction
        empties is removed, returned without content)."""
        current = self._read(path)
        current_lines = _format.entries(current.body) if current else []
        fitted = _format.bound(planned.merged(current_lines), self.max_chars)
        if not fitted.lines and current_lines:
            # A correction took back every entry: nothing true is left of the topic.
            self._folder.remove(path.name)
            return True, MemoryFile(topic, "", path, self._now(), "",
                                    dropped=tuple(current_lines))
        if not fitted.lines:
            return False, current.file() if current else None
        description = planned.change.description or (current.description if current else "")
        if fitted.dropped:
            # The entries the description was written for may be among those dropped.
            description = _format.follow(description, fitted.lines)
        named = {_format.entry_key(line) for line in planned.change.remove}
        taken_back = [line for line in current_lines if _format.entry_key(line) in named]
        if planned.allow_removal and _format.restates(description, taken_back):
            description = _format.follow("", fitted.lines)  # it said what a correction undid
        unchanged = current is not None and fitted.lines == current_lines
        if current is not None and unchanged and description == current.description:
            return False, current.file()
        updated = self._now()
        content = _format.body(fitted.lines)
        self._folder.write(path.name, _format.render(
            topic=topic, description=description, updated=updated,
            used=current.used if current else None, content=content))
        return True, MemoryFile(topic, description, path, updated, content,
                                dropped=(planned.condensed or ()) + fitted.dropped,
                                condensed=planned.condensed is not None,
                                truncated=fitted.truncated or planned.truncated)

    def _touch(self, path: Path, when: datetime) -> None:
        current = self._read(path)
        if current is None:
            return
        self._folder.write(path.name, _format.render(
            topic=current.topic, description=current.description, updated=current.updated,
            used=when, content=current.body))

    def _scan(self) -> builtins.list[_select.Stored]:
        # Temporary files start with "." (see `_folder.Folder.write`), and so do hidden files.
        return [s for name in self._folder.names()
                if (s := self._read(self.directory / name)) is not None]

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
        return _select.Stored(path, parsed.topic or path.stem.replace("-", " "),
                              parsed.description,
                              parsed.updated or datetime.fromtimestamp(mtime, UTC), parsed.used,
                              parsed.body)

    def _new_path(self, topic: str, taken: set[str]) -> Path:
        stem = _format.slug(topic)
        name, n = f"{stem}.md", 2
        while name.casefold() in taken or self._folder.taken(name):
            name, n = f"{stem}-{n}.md", n + 1
        return self.directory / name

    def _now(self) -> datetime:
        return utc(self._clock())
