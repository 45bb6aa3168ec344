"""`Memory`'s methods over sessions: starting one, appending steps, closing, committing or
discarding its episodes (each also queued, with a callback), and reading what it stored."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mnemo.config import DURATION_CEILINGS, Config
from mnemo.errors import InvalidInputError
from mnemo.graph.scope import check_metadata
from mnemo.inputs import check_count, check_id, check_models, check_seconds, check_text
from mnemo.memory.parts import Parts

if TYPE_CHECKING:
    from mnemo.episode import EpisodeLog, StepInfo
    from mnemo.graph.model import CommitReceipt
    from mnemo.ports import LLM, Embedder
    from mnemo.session.machine import Callback, SessionContext, SessionInfo, State

# The most extraction retries one `close_and_commit` may ask for: each runs its model calls
# again.
MAX_RETRIES = 100


class SessionMethods(Parts):
    """`Memory`'s methods over sessions and the episodes they stored."""

    async def start_session(
        self,
        goal: str,
        *,
        repo: str,
        llm: LLM | None = None,
        embedder: Embedder | None = None,
        config: Config | None = None,
        metadata: dict[str, str | int | float | bool] | None = None,
    ) -> str:
        """Opens a session collecting its first episode towards `goal`; returns its id. Every
        node it commits carries `metadata` (`Node.metadata`, what `where=` selects).

        Raises:
            InvalidInputError: a blank goal, one longer than `Config.max_text_chars`, a
                config that is not a `Config`, or a metadata that is not a flat dict of
                str -> str | int | float | bool within `mnemo.graph.scope`'s bounds.
            NotFoundError: an unknown repo.
            EmbeddingError: the embedder override's dimension differs from the repo's.
        """
        self._works("start_session")
        check_models(llm, embedder)
        scoped = check_metadata(metadata)
        if config is not None and not isinstance(config, Config):
            raise InvalidInputError(f"config must be a mnemo.Config, got {type(config).__name__}")
        await self._repos.checked(repo, lambda repo_config: check_text(
            goal, "goal", limit=(config or repo_config).max_text_chars))
        await self._repos.refresh(repo)  # another Memory may have re-embedded it
        override, chosen = await self._repos.session_runtime(repo, llm, embedder, config)
        return await self._service.start_session(
            goal, repo=repo, override=override, config=chosen, metadata=scoped
        )

    async def append(
        self,
        session_id: str,
        observation: str,
        action: str,
        *,
        metadata: dict[str, object] | None = None,
    ) -> StepInfo:
        """Stores one step (durable before the model is asked), then waits for its annotation
        at most `Config.append_timeout`: `StepInfo.annotated` is False when the model has not
        answered by then, or failed (the step is kept and annotated later, by close at the
        latest).

        Raises:
            InvalidInputError: observation or action is not a string or is longer than the
                session's `Config.max_text_chars` (metadata: its JSON); no step was added.
            SessionError: the session is not collecting.
            LLMError, EmbeddingError: a model that cannot work here at all (an embedder of
                another dimension, a recorded model that cannot be built); no step was added.
            StorageError: the step could not be stored.
        """
        self._works("append")
        from mnemo.session.transitions import append  # imported with the parts, off the loop

        return await append(self._live, session_id, observation, action, metadata)

    async def close(self, session_id: str) -> None:
        """Ends the episode and starts extraction in the background (state `extracting`)."""
        self._works("close")
        await self._service.close(session_id)

    async def commit(self, session_id: str) -> CommitReceipt | None:
        """`ready`: applies the changeset durably and returns its receipt (state `idle`).
        `failed`: retries the extraction (state `extracting`) and returns None."""
        self._works("commit")
        return await self._service.commit(session_id)

    async def discard(self, session_id: str) -> None:
        """Drops a ready changeset or a failed extraction (state `idle`)."""
        self._works("discard")
        await self._service.discard(session_id)

    async def start_episode(self, session_id: str, goal: str) -> None:
        """Starts a new episode in an idle session (state `collecting`)."""
        self._works("start_episode")
        await self._service.start_episode(session_id, goal)

    async def close_and_commit(
        self,
        session_id: str,
        *,
        max_retries: int = 2,
        max_polls: int | None = None,
        poll_interval: float = 0.05,
    ) -> CommitReceipt:
        """Closes, waits for extraction, and commits; retries a failed extraction up to
        `max_retries` times. Each wait lasts as long as the session's `extraction_timeout`
        allows (twice, in auto-commit: the close may first wait for commits of its steps
        under way), or `max_polls * poll_interval` seconds when `max_polls` is given. In
        auto-commit the receipt holds what the close committed.

        Raises:
            InvalidInputError: `max_retries` not an integer from 0 to `MAX_RETRIES` (each
                retry runs the extraction's model calls again), `max_polls` not None or a
                positive integer, `poll_interval` not a positive number of seconds (at most
                a day).
            PipelineError: "extraction_failed" or "extraction_timeout".
        """
        self._works("close_and_commit")
        check_count("max_retries", max_retries, maximum=MAX_RETRIES)
        if max_polls is not None:
            check_count("max_polls", max_polls, minimum=1)
        check_seconds("poll_interval", poll_interval, DURATION_CEILINGS["wait"])
        try:
            return await self._service.close_and_commit(
                session_id, max_retries=max_retries, max_polls=max_polls,
                poll_interval=poll_interval,
            )
        finally:
            await self._save_profiles()

    async def commit_async(self, session_id: str, callback: Callback | None = None) -> None:
        self._works("commit_async")
        await self._service.submit(session_id, "commit", (), callback)

    async def discard_async(self, session_id: str, callback: Callback | None = None) -> None:
        self._works("discard_async")
        await self._service.submit(session_id, "discard", (), callback)

    async def close_async(self, session_id: str, callback: Callback | None = None) -> None:
        self._works("close_async")
        await self._service.submit(session_id, "close", (), callback)

    async def start_episode_async(
        self, session_id: str, goal: str, callback: Callback | None = None
    ) -> None:
        self._works("start_episode_async")
        if not isinstance(goal, str) or not goal.strip():
            raise InvalidInputError(f"goal must be a non-blank string, got {goal!r}")
        await self._service.submit(session_id, "start_episode", (goal,), callback)

    async def append_async(
        self, session_id: str, observation: str, action: str, callback: Callback | None = None
    ) -> None:
        self._works("append_async")
        for what, value in (("observation", observation), ("action", action)):
            if not isinstance(value, str):
                raise InvalidInputError(f"{what} must be a string, got {type(value).__name__}")
        await self._service.submit(session_id, "append", (observation, action), callback)

    async def session_state(self, session_id: str) -> State:
        return await self._service.state_of(session_id)

    async def session_context(self, session_id: str) -> SessionContext | None:
        """The goal and last 5 steps ("obs -> act") of a live episode; None when idle."""
        return await self._service.context(session_id)

    async def end_session(self, session_id: str) -> None:
        """Stops the session; its id is then unknown."""
        self._works("end_session")
        await self._service.end_session(session_id)

    async def episodes(self, session_id: str) -> list[EpisodeLog]:
        """Every episode the session stored (ended sessions too), oldest first, each with its
        steps and their trajectories; [] for an id no session had. Reads only: a restored
        session is not resumed by it."""
        return await self._sessions_store.episodes(check_id(session_id, "session_id"))

    async def episode(self, episode_id: str) -> EpisodeLog | None:
        """The stored episode (with its session id and steps) that an EPISODIC node's
        `data["episode_id"]` names; None for one no session stored (an ingest's)."""
        return await self._sessions_store.episode(check_id(episode_id, "episode_id"))

    async def list_sessions(self) -> list[SessionInfo]:
        """Every live session (not ended, restored ones included), oldest first: id, repo,
        state, the open episode's goal and its number of steps."""
        return await self._service.list_sessions()
