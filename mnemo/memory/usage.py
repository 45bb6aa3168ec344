"""`UsageBook`: tokens and cost spent by the LLM, summed per session and per repo."""

from __future__ import annotations

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

    def add(self, repo: str, session_id: str | None, usage: Usage) -> None:
        self._repos[repo] = self._repos.get(repo, Usage()) + usage
        if session_id is not None:
            self._sessions[session_id] = self._sessions.get(session_id, Usage()) + usage
            self._active[session_id] = anyio.current_time()

    def last_answer(self, session_id: str) -> float | None:
        """When (`anyio.current_time`) a model call of the session last ended here; None
        when none did."""
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
