"""The repository's Python modules, parsed once per process: several tests walk every module
of mnemo/ (its imports, its docstrings and comments, its SQL)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The syntax tree of the module at `path` (the same object on each call: read it, do not
    change it)."""
    return ast.parse(path.read_text(encoding="utf-8"))
