"""Long-term memory files: one Markdown file per topic, which an agent reads at the start of work.

`MemoryFiles` owns a directory of `<slug>.md` files, each with a small front matter (`topic`,
`description`, `updated`, and `used` once recalled) and a body of one entry per line. The
`memory_update` and `memory_persist` LLM tasks (`prompts.py`) decide what goes where; the code
here only merges, bounds and writes."""

from __future__ import annotations

from mnemo.memoryfiles.files import MemoryFiles
from mnemo.memoryfiles.model import MemoryFile, MemoryUpdate

__all__ = ["MemoryFile", "MemoryFiles", "MemoryUpdate"]
