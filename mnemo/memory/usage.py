"""`UsageBook`: tokens and cost spent by the LLM, summed per session and per repo."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio

from mnemo.ports import Usage


class UsageBook:
    """Sums the `Usage` of every LLM reply mnemo asked for, by repo and by session.

    Kept in memory for the life of the `Memory` (it counts what this process spent).
    """

    def __init__(self) -> None:
        self._repos: dict[str, Usage] = {}
        self._sessions: dict[str, Usage] = {}
        self._active: dict[str, float] = {}
        self._calls: dict[str, int] = {}  # each session's model calls under way

    def add(self, repo: str, session_id: str | None, usage: Usage) -> None:
        self._repos[repo] = self._repos.get(repo, Usage()) + usage
        if session_id is not None:
            self._sessions[session_id] = self._sessions.get(session_id, Usage()) + usage
            self._active[session_id] = anyio.current_time()

    @contextmanager
    def calling(self, session_id: str | None) -> Iterator[None]:
        """Marks a model call of the session under way (`last_answer`)."""
        if session_id is None:
            yield
            return
        self._calls[session_id] = self._calls.get(session_id, 0) + 1
        try:
            yield
        finally:
            self._calls[session_id] -= 1
            if not self._calls[session_id]:
                del self._calls[session_id]

    def last_answer(self, session_id: str) -> float | None:
        """When (`anyio.current_time`) a model call of the session last ended here, now while
        one is under way (a slow server's long reply); None when none did."""
        if session_id in self._calls:
            return anyio.current_time()
        return self._active.get(session_id)

    def of_repo(self, repo: str) -> Usage:
        return self._repos.get(repo, Usage())

    def of_session(self, session_id: str) -> Usage:
        return self._sessions.get(session_id, Usage())

    def total(self) -> Usage:
        result = Usage()
        for usage in self._repos.values():
            result = result + usage
        return result
