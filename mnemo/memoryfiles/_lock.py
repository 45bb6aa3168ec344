"""`DirectoryLock`: a lock of a memory-files directory across processes (an `anyio.Lock`, then
`flock` on a hidden file). A directory has a writer lock (held through a write's model calls)
and a file lock (a read-merge-write); the writer lock is taken first."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.lowlevel
import anyio.to_thread
import filelock

from mnemo.memoryfiles._folder import Folder

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

# Hidden and not `.md`, so never listed as a topic.
LOCK_FILE = ".memoryfiles.lock"
WRITER_LOCK_FILE = ".memoryfiles.writer.lock"
# The file lock's longest wait: it is held for a read-merge-write of a few small files.
LOCK_WAIT_S = 60.0
_TRY_S = 0.1


class DirectoryLock:
    """A lock of `folder` held on the file `name` in it (both created when the lock is first
    taken); a wait for another process's hold gives up after `wait_s` seconds."""

    def __init__(self, folder: Folder, name: str = LOCK_FILE, *,
                 wait_s: float = LOCK_WAIT_S) -> None:
        self.folder = folder
        self.name = name
        self.path = folder.path / name
        self.wait_s = wait_s
        self._local = anyio.Lock()
        # Not thread-local: taken in a worker thread, released on the event loop's.
        self._path_lock = None if fcntl is not None else filelock.FileLock(
            str(self.path), thread_local=False)
        self._fd = -1

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Holds the lock for the block. TimeoutError: another writer held it for `wait_s`
        seconds; InvalidInputError: a folder below the root is a link; OSError: the directory
        or the lock file could not be opened."""
        async with self._local:
            deadline = anyio.current_time() + self.wait_s
            while True:
                # Shielded: a lock the thread took must be released below; the checkpoint
                # between tries lets a cancellation in.
                with anyio.CancelScope(shield=True):
                    taken = await anyio.to_thread.run_sync(self._try)
                if taken:
                    break
                if anyio.current_time() >= deadline:
                    raise TimeoutError(f"another writer held {self.path} for {self.wait_s:g} s")
                await anyio.lowlevel.checkpoint()
            try:
                yield
            finally:
                self._release()

    def _try(self) -> bool:
        if self._path_lock is not None:
            self.folder.path.mkdir(parents=True, exist_ok=True)
            try:
                self._path_lock.acquire(timeout=_TRY_S)
            except filelock.Timeout:
                return False
            return True
        fd = self.folder.open_lock(self.name)
        deadline = time.monotonic() + _TRY_S
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    # Some file systems answer EACCES for a lock another holds.
                    if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        os.close(fd)
                        return False
                    time.sleep(0.01)
                    continue
                self._fd = fd
                return True
        except BaseException:
            os.close(fd)
            raise

    def _release(self) -> None:
        if self._path_lock is not None:
            self._path_lock.release()
            return
        fd, self._fd = self._fd, -1
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
