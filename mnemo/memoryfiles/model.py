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
    """What one `MemoryFiles.update` did: the topics `written`, the `usage`, the `error` that
    stopped it early, the changed `files`, and `skipped` ("disabled")."""

    written: list[str] = field(default_factory=list)
    usage: Usage | None = None
    error: str | None = None
    files: list[MemoryFile] = field(default_factory=list)
    skipped: str | None = None
