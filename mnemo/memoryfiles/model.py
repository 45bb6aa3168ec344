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
    """

    topic: str
    description: str
    path: Path
    updated: datetime
    content: str


@dataclass(frozen=True, slots=True)
class MemoryUpdate:
    """What one `MemoryFiles.update` did.

    `written` lists the topics whose files changed, in the order they were written (also when
    a later step failed); `usage` sums what every LLM call of the update reported (None when
    nothing was asked or nothing reported usage); `error` says why the update stopped early.
    """

    written: list[str] = field(default_factory=list)
    usage: Usage | None = None
    error: str | None = None
