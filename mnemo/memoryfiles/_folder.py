"""`Folder`: a memory-files directory, read and written without following a link inside it
(regular files opened with `O_NOFOLLOW` relative to its descriptor; on Windows, checked paths)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path, PurePath

from mnemo import disk
from mnemo.errors import InvalidInputError

# The longest file or folder name most file systems take (bytes), and the longest path.
NAME_MAX = 255
PATH_MAX = 4_095
# Whether this system opens files relative to a folder's descriptor (POSIX does).
RELATIVE = {os.open, os.stat, os.mkdir, os.unlink}.issubset(os.supports_dir_fd) and hasattr(
    os, "O_NOFOLLOW")
_DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# Windows opens a descriptor in text mode (writing "\r\n" for "\n") without O_BINARY.
_BINARY = getattr(os, "O_BINARY", 0)
_READ = os.O_RDONLY | _NOFOLLOW | _BINARY | getattr(os, "O_NONBLOCK", 0)
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY


def check_directory(directory: str | os.PathLike[str], what: str = "directory") -> Path:
    """`directory` as a `Path` the system can name (no NUL, within `NAME_MAX` and `PATH_MAX`
    bytes; a str not blank: "" would be the working folder) and no file's, else
    InvalidInputError."""
    if isinstance(directory, str) and not directory.strip():
        raise InvalidInputError(f"{what} must not be blank, got {directory!r}")
    try:
        path = Path(directory)
        raw = os.fsencode(path)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what} must be a path, got {directory!r}") from exc
    if b"\0" in raw:
        raise InvalidInputError(f"{what} must not contain a NUL character (U+0000)")
    if len(raw) > PATH_MAX:
        raise InvalidInputError(
            f"{what} is {len(raw):,} bytes long, more than the {PATH_MAX:,} a path may be")
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise InvalidInputError(
                f"{what} holds a name of {len(os.fsencode(part)):,} bytes, more than the "
                f"{NAME_MAX} a file system takes")
    if path.exists() and not path.is_dir():
        raise InvalidInputError(f"{what} {str(path)!r} is a file, not a folder")
    return path


class Folder:
    """The directory `path`; with `root`, `path` must lie inside `root` (lexically: no `..`)
    and no folder from `root` down to it may be a link."""

    def __init__(self, path: Path, root: Path | None = None) -> None:
        self.path = path
        self.root = root
        self._below: tuple[str, ...] = ()
        if root is not None:
            try:
                relative = PurePath(path).relative_to(root)
            except ValueError as exc:
                raise InvalidInputError(f"{path} is not inside {root}") from exc
            if ".." in relative.parts:
                raise InvalidInputError(f"{path} must not climb out of {root} with '..'")
            self._below = relative.parts

    @contextlib.contextmanager
    def opened(self, *, create: bool) -> Iterator[int | None]:
        """The folder's descriptor for the block (created first when `create`), or None when it
        does not exist or the system has no relative calls (InvalidInputError: a link)."""
        if not RELATIVE:
            self._check_path(create=create)
            yield None
            return
        start = self.path if self.root is None else self.root
        if create:
            start.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(start, _DIRECTORY)
        except FileNotFoundError:
            if create:
                raise
            yield None
            return
        try:
            for name in self._below:
                parent, fd = fd, -1
                fd = self._step(parent, name, create=create)  # closes `parent`
                if fd < 0:
                    yield None
                    return
            yield fd
        finally:
            if fd >= 0:
                os.close(fd)

    def _step(self, parent: int, name: str, *, create: bool) -> int:
        """The descriptor of the folder `name` in `parent` (which it closes), never through a
        link; -1 when it is missing and not to be created."""
        try:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=parent)
            try:
                return os.open(name, _DIRECTORY | _NOFOLLOW, dir_fd=parent)
            except FileNotFoundError:
                return -1
            except OSError as exc:
                if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise self._not_a_folder(name) from exc
                raise
        finally:
            os.close(parent)

    def _not_a_folder(self, name: str) -> InvalidInputError:
        below = "/".join(self._below)
        return InvalidInputError(
            f"{name!r} (of {below!r}, in the memory directory) is a link or not a folder: "
            "memory files never follow a link out of their root")

    def _check_path(self, *, create: bool) -> None:
        """The path-based rule where there are no relative calls (see the module doc)."""
        if self.root is None:
            return
        here = self.root
        for name in self._below:
            here = here / name
            try:
                mode = os.lstat(here).st_mode
            except FileNotFoundError:
                if not create:
                    return
                here.mkdir(mode=0o700)
                continue
            if not stat.S_ISDIR(mode):
                raise self._not_a_folder(name)

    def names(self) -> list[str]:
        """The names of the folder's `.md` files that are not hidden, sorted ([] when it does
        not exist). Links and other non-regular files are listed too: `read` skips them."""
        with self.opened(create=False) as fd:
            if fd is None and (RELATIVE or not self.path.is_dir()):
                return []
            found = os.listdir(fd if fd is not None else self.path)
        return sorted(n for n in found if n.endswith(".md") and not n.startswith("."))

    def read(self, name: str) -> tuple[str, float] | None:
        """The text (UTF-8, bad bytes replaced) and modification time of the regular file
        `name`; None when it is gone, or is a link, a FIFO or anything not a regular file."""
        with self.opened(create=False) as fd:
            if fd is None and RELATIVE:
                return None
            at = self._at(fd, name)
            try:
                if fd is None and not stat.S_ISREG(os.lstat(at).st_mode):
                    return None
                handle = os.open(at, _READ, dir_fd=fd)
            except OSError:
                return None
        with os.fdopen(handle, "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                return None
            return file.read().decode("utf-8", errors="replace"), info.st_mtime

    def taken(self, name: str) -> bool:
        """Whether anything (a link included) has the name `name` in the folder."""
        with self.opened(create=False) as fd:
            if fd is None and RELATIVE:
                return False
            try:
                os.stat(self._at(fd, name), dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            return True

    def remove(self, name: str) -> None:
        """Removes the file `name` (gone already: nothing to do), then fsyncs the folder."""
        with self.opened(create=False) as fd:
            if fd is None and RELATIVE:
                return
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._at(fd, name), dir_fd=fd)
            self._fsync(fd)

    def write(self, name: str, text: str) -> None:
        """Replaces the file `name` with `text`, all or nothing (a fsynced temporary file renamed
        over it, then the folder fsynced), never writing through a link; a replaced file keeps
        its permission bits."""
        with self.opened(create=True) as fd:
            if fd is None:
                self.path.mkdir(parents=True, exist_ok=True)
                if os.path.islink(self.path / name):
                    os.unlink(self.path / name)
            target = self._at(fd, name)
            temporary = self._at(fd, f".{name[:200]}.{secrets.token_hex(6)}.tmp")
            out = os.open(temporary, _NEW, 0o600, dir_fd=fd)
            try:
                with os.fdopen(out, "wb") as file:
                    file.write(text.encode("utf-8"))
                    file.flush()
                    os.fsync(file.fileno())
                with contextlib.suppress(FileNotFoundError):
                    old = os.stat(target, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISREG(old.st_mode):
                        os.chmod(temporary, stat.S_IMODE(old.st_mode), dir_fd=fd)
                os.replace(temporary, target, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=fd)
                raise
            self._fsync(fd)

    def _fsync(self, fd: int | None) -> None:
        if fd is None:
            disk.fsync_directory(self.path)
        else:
            with contextlib.suppress(OSError):
                os.fsync(fd)

    def open_lock(self, name: str) -> int:
        """A descriptor of the lock file `name` (created if missing), never through a link."""
        with self.opened(create=True) as fd:
            flags = os.O_RDWR | os.O_CREAT | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
            return os.open(self._at(fd, name), flags, 0o600, dir_fd=fd)

    def _at(self, fd: int | None, name: str) -> str:
        """`name` as an os call takes it: relative to the folder's descriptor `fd`, else a path."""
        return name if fd is not None else os.path.join(self.path, name)
