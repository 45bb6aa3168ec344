"""The facade an app opens, `Memory` (`mnemo.memory.facade`), with the groups of methods it
inherits (`sessions`, `graph`, `conversation`), the parts they share (`parts`, built by
`assembly`), and the repos it knows (`repos`, with the usage book in `usage`)."""

from __future__ import annotations

from mnemo.memory.facade import Memory

__all__ = ["Memory"]
