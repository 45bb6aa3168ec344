"""Files replaced all or nothing, and folders whose new entries (a rename, a new file) survive
a crash: memory files' topics, the saved HNSW graphs, the command line's exports."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO


def replace_file(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Replaces the file at `path` (through a link) with what `write` writes, all or nothing: a
    temporary file beside it, fsynced, renamed over it, the folder fsynced; a replaced file
    keeps its permission bits. An OSError names `path`, not the temporary file."""
    target = path.resolve()
    temporary = target.with_name(f".{secrets.token_hex(8)}.tmp")
    try:
        with temporary.open("xb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISREG(mode := target.stat().st_mode):
                temporary.chmod(stat.S_IMODE(mode))
        temporary.replace(target)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    finally:
        temporary.unlink(missing_ok=True)
    fsync_directory(target.parent)


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
