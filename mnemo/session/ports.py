"""The sessions' port: `SessionStore`, what the session service needs from a backend, and the
rows it reads back.

Every accepted step, episode and state change is written through it before the call that made
it returns; `load_live` brings back every session that had not ended. Implementations live in
`mnemo.storage.<backend>.sessions`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from mnemo.config import Config
from mnemo.episode.model import EpisodeLog, EpisodeRecord, StepRecord
from mnemo.extraction.memo import KeptResult
from mnemo.graph.model import Changeset
from mnemo.session.machine import State


@dataclass(frozen=True, slots=True)
class RepoRow:
    """A repo's record: its config, its vectors' dimension, and the URIs of the embedder and
    LLM it runs with (`mnemo.adapters.uri`; never a key; `llm` is None for a repo recorded
    before models were)."""

    name: str
    config: Config
    dim: int
    embedder: str
    llm: str | None = None


@dataclass(slots=True)
class LiveSession:
    """A session as `load_live` finds it after a restart."""

    id: str
    repo: str
    state: State
    config: Config
    episode: EpisodeRecord | None
    changeset: Changeset | None = None
    created_at: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    model: str | None = None


class SessionStore(Protocol):
    async def load_repos(self) -> list[RepoRow]: ...
    async def save_repo(self, row: RepoRow) -> None: ...
    async def create_session(
        self, session_id: str, repo: str, config: Config, episode: EpisodeRecord
    ) -> None: ...
    async def start_episode(self, session_id: str, episode: EpisodeRecord) -> None: ...
    async def add_step(
        self, session_id: str, episode_id: str, step: StepRecord, previous: StepRecord | None
    ) -> None: ...
    async def set_state(
        self, session_id: str, state: State, *, model: str | None = None
    ) -> None: ...
    async def save_extraction(
        self, session_id: str, changeset: Changeset, scored: Sequence[StepRecord]
    ) -> None: ...
    async def discard(self, session_id: str, episode_id: str | None) -> None: ...
    async def end(self, session_id: str) -> None: ...
    async def load_live(self) -> list[LiveSession]: ...
    async def keep_result(self, episode_id: str, kept: KeptResult) -> None:
        """Stores a task's validated reply with its open episode (kept until it is committed
        or discarded)."""
        ...
    async def kept_results(self, episode_id: str) -> list[KeptResult]: ...
    async def episodes(self, session_id: str) -> list[EpisodeLog]: ...
    async def episode(self, episode_id: str) -> EpisodeLog | None: ...
