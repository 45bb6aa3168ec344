"""A store's own claim on the repos it is re-embedding, taken before the cross-process lock,
so a second re-embedding through the same store is refused at once."""

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
        """The repo claimed for the block, which gets the error to raise if another process
        holds it. Raises `ConflictError` if this store is re-embedding it already."""
        busy = ConflictError(f"repo {repo!r} is being re-embedded by another Memory")
        if repo in self._repos:
            raise busy
        self._repos.add(repo)
        try:
            yield busy
        finally:
            self._repos.discard(repo)
