"""The values `MemoryFiles` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from mnemo.ports import Usage


@dataclass(frozen=True, slots=True)
class MemoryFile:
    """One topic file: its Markdown body, `updated` (UTC), and what keeping it within `max_chars`
    cost (`condensed`, `dropped`, `truncated`); `skipped` says why a write did nothing."""

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
    """What one `MemoryFiles.update` did: `written`, the topics whose files changed, in order
    (also when a later step failed); `usage`, what every LLM call reported (None: none did);
    `error`, why it stopped early; `files`, each changed file as written; `skipped`,
    `"disabled"` when writing is off (a skipped sub-agent's update is a plain `MemoryUpdate()`)."""

    written: list[str] = field(default_factory=list)
    usage: Usage | None = None
    error: str | None = None
    files: list[MemoryFile] = field(default_factory=list)
    skipped: str | None = None
