"""Long-term memory files: one Markdown file per topic, which an agent reads at the start of
work. The LLM tasks (`prompts.py`) decide what goes where; the code merges, bounds and writes."""

from __future__ import annotations

from mnemo.memoryfiles.files import MemoryFiles
from mnemo.memoryfiles.model import MemoryFile, MemoryUpdate

__all__ = ["MemoryFile", "MemoryFiles", "MemoryUpdate"]
