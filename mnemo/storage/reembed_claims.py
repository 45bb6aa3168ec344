"""A store's own claim on the repos it is re-embedding (`GraphStore.reembedding`), taken by
both backends before the lock every process honours (SQLite's lock file, PostgreSQL's advisory
lock): a second re-embedding of a repo through the same store is refused without a trip to the
file or the server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from mnemo.errors import ConflictError


class Claims:
    """The repos a store is re-embedding."""

    def __init__(self) -> None:
        self._repos: set[str] = set()

    @contextmanager
    def claim(self, repo: str) -> Iterator[ConflictError]:
        """The repo claimed for the block, which gets the error to raise when another
        process's re-embedding holds the repo.

        Raises:
            ConflictError: this store is re-embedding the repo already.
        """
        busy = ConflictError(f"repo {repo!r} is being re-embedded by another Memory")
        if repo in self._repos:
            raise busy
        self._repos.add(repo)
        try:
            yield busy
        finally:
            self._repos.discard(repo)
