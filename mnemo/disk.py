"""Folders whose new entries (a rename, a new file) survive a crash: memory files' topics, the
saved HNSW graphs."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def fsync_directory(directory: Path) -> None:
    """Makes the folder's new entries durable (not on Windows, which has no O_DIRECTORY)."""
    flag = getattr(os, "O_DIRECTORY", None)
    if flag is None:
        return
    try:
        fd = os.open(directory, os.O_RDONLY | flag)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
