"""`DirectoryLock`: a lock of a memory-files directory, honoured across processes.

This instance's `anyio.Lock` first (so one task of a process waits for the file at a time),
then an OS lock on a hidden file in the directory (`filelock`: `flock` on POSIX), which every
`MemoryFiles` object and every process on the directory takes; the OS releases it when a
process dies, so it never goes stale. The OS lock is tried in a worker thread in short tries, so
a wait never blocks the event loop and a cancelled wait ends promptly.

A directory has two: the writer lock (`WRITER_LOCK_FILE`), held by a write from its scan of the
topics through its model calls to its last file written, so writes run one at a time; and the
file lock (`LOCK_FILE`), held only for a read-merge-write of files or `recall`'s use stamps, so
a reader stamping a use never waits for a writer's model. Order: writer lock, then file lock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread
import filelock

# Hidden and not `.md`, so never listed as a topic.
LOCK_FILE = ".memoryfiles.lock"
WRITER_LOCK_FILE = ".memoryfiles.writer.lock"
# The file lock is held for a read-merge-write of a few small files: a wait this long means a
# writer is stuck. (The writer lock's wait is the caller's: it covers model calls.)
LOCK_WAIT_S = 60.0
_TRY_S = 0.1


class DirectoryLock:
    """A lock of `directory` held on the file `name` in it (both created when the lock is
    first taken); a wait for another process's hold gives up after `wait_s` seconds."""

    def __init__(
        self, directory: Path, name: str = LOCK_FILE, *, wait_s: float = LOCK_WAIT_S
    ) -> None:
        self.directory = directory
        self.path = directory / name
        self.wait_s = wait_s
        self._local = anyio.Lock()
        # Not thread-local: taken in a worker thread, released on the event loop's.
        self._os = filelock.FileLock(str(self.path), thread_local=False)

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Holds the lock for the block.

        Raises:
            TimeoutError: another writer held the lock file for `wait_s` seconds.
            OSError: the directory or the lock file could not be created.
        """
        async with self._local:
            deadline = anyio.current_time() + self.wait_s
            while True:
                # Shielded: a lock the thread took must be released below, not abandoned by a
                # cancellation; the checkpoint between tries lets a cancellation in.
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
                self._os.release()

    def _try(self) -> bool:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            self._os.acquire(timeout=_TRY_S)
        except filelock.Timeout:
            return False
        return True
