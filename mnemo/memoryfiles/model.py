"""The values `MemoryFiles` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from mnemo.ports import Usage


@dataclass(frozen=True, slots=True)
class MemoryFile:
    """One topic file as read from disk.

    `content` is the Markdown body after the front matter (one entry per line); `updated` is
    when its content or description last changed (UTC).

    A file returned by a write also says what keeping it within `max_chars` cost (nothing
    is given up silently): `condensed` when the LLM rewrote the file to fit, `dropped`
    the entries (as they were) no longer in it word for word, merged or left out by the LLM or,
    when it failed, the oldest dropped; `truncated` when an entry was cut to fit. `skipped`
    says why a write wrote nothing and asked nothing (`"disabled"`); such a file has no topic.
    """

    topic: str
    description: str
    path: Path
    updated: datetime
    content: str
    dropped: tuple[str, ...] = ()
    condensed: bool = False
    truncated: bool = False
    skipped: str | None = None


@dataclass(frozen=True, slots=True)
class MemoryUpdate:
    """What one `MemoryFiles.update` did.

    `written` lists the topics whose files changed, in the order they were written (also when
    a later step failed); `usage` sums what every LLM call of the update reported (None when
    nothing was asked or nothing reported usage); `error` says why the update stopped early.
    `files` holds each changed file as written, with what bounding it cost (see `MemoryFile`);
    `skipped` is `"disabled"` when the files' writing is turned off (an update skipped for a
    sub-agent or below `min_iterations` is the plain empty `MemoryUpdate()`, as before).
    """

    written: list[str] = field(default_factory=list)
    usage: Usage | None = None
    error: str | None = None
    files: list[MemoryFile] = field(default_factory=list)
    skipped: str | None = None
