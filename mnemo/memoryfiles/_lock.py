"""`DirectoryLock`: the write lock of a memory-files directory, honoured across processes.

This instance's `anyio.Lock` first (so one task of a process waits for the file at a time),
then an OS lock on `.memoryfiles.lock` in the directory (`filelock`: `flock` on POSIX), which
every `MemoryFiles` object and every process on the directory takes; the OS releases it when a
process dies, so it never goes stale. The OS lock is tried in a worker thread in short tries, so
a wait never blocks the event loop and a cancelled wait ends promptly.
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
# A write holds the lock for a read-merge-write of a few small files: a wait this long means
# a writer is stuck.
LOCK_WAIT_S = 60.0
_TRY_S = 0.1


class DirectoryLock:
    """The write lock of `directory` (created when the lock is first taken)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LOCK_FILE
        self._local = anyio.Lock()
        # Not thread-local: taken in a worker thread, released on the event loop's.
        self._os = filelock.FileLock(str(self.path), thread_local=False)

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Holds the lock for the block.

        Raises:
            TimeoutError: another writer held the lock file for `LOCK_WAIT_S` seconds.
            OSError: the directory or the lock file could not be created.
        """
        async with self._local:
            deadline = anyio.current_time() + LOCK_WAIT_S
            while True:
                # Shielded: a lock the thread took must be released below, not abandoned by a
                # cancellation; the checkpoint between tries lets a cancellation in.
                with anyio.CancelScope(shield=True):
                    taken = await anyio.to_thread.run_sync(self._try)
                if taken:
                    break
                if anyio.current_time() >= deadline:
                    raise TimeoutError(f"another writer held {self.path} for {LOCK_WAIT_S:g} s")
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
