"""The facade an app opens, `Memory`, with the groups of methods it inherits and its parts."""

from __future__ import annotations

from mnemo.memory.facade import Memory

__all__ = ["Memory"]
