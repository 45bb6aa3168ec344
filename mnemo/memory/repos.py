"""`Repos`: the repos a `Memory` knows and what each runs with (llm, embedder, config,
dimension), the limits of their LLM calls (`Limits`), and the adapters the Memory made itself
(closed with it; those a caller passes in stay open)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from mnemo.adapters.limit import ServerProfile
from mnemo.adapters.minilm import default_embedder
from mnemo.adapters.offline import OfflineLLM
from mnemo.adapters.recorded import RepoModels, check_runnable
from mnemo.calls.retry import Limits
from mnemo.config import Config, ceilings, with_longer_timeouts
from mnemo.errors import (
    EmbeddingError,
    InvalidInputError,
    NotFoundError,
    StorageError,
    check_id,
    check_models,
    check_name,
)
from mnemo.ports import LLM, Embedder, check_dim, detect_dim, model_name
from mnemo.session.machine import Runtime
from mnemo.session.ports import RepoRow, SessionStore

log = logging.getLogger("mnemo")

T = TypeVar("T")


class Repos:
    def __init__(
        self,
        config: Config,
        llm: LLM | None,
        embedder: Embedder | None,
        stored: Callable[[], Awaitable[list[RepoRow]]],
    ) -> None:
        self.config = config
        self._stored = stored  # the store's repos: the one truth, other Memory objects' too
        self.llm: LLM = llm if llm is not None else OfflineLLM()
        self.embedder: Embedder = default_embedder() if embedder is None else embedder
        # Without models given, each repo runs the ones it recorded.
        self._models = RepoModels(
            self.llm, self.embedder, llm_given=llm is not None, embedder_given=embedder is not None)
        self._runtimes: dict[str, Runtime] = {}
        self._recorded: dict[str, Config] = {}  # each repo's config as the store holds it
        self.limits = Limits()
        # The models that learn their servers, by repo and model object, with their profile.
        self._profiled: dict[tuple[str, int], tuple[object, ServerProfile | None]] = {}
        # Every adapter this Memory made, closed with it (one may own an HTTP client).
        self._adapters: dict[int, object] = {}
        if embedder is None:
            self.adopt(self.embedder)

    def adopt(self, *adapters: object) -> None:
        """Closes these adapters with the Memory: it made them."""
        for adapter in adapters:
            if adapter is not None:
                self._adapters.setdefault(id(adapter), adapter)

    async def close_adapters(self) -> None:
        """Closes every adapter this Memory made; a failure is logged, the others still close."""
        for adapter in list(self._adapters.values()):
            if (close := getattr(adapter, "aclose", None)) is not None:
                try:
                    await close()
                except Exception:
                    log.exception("closing %r failed", adapter)

    def load(self, rows: list[RepoRow]) -> None:
        """Knows the stored repos, each with its recorded models (or the Memory's); a known
        repo keeps its runtime."""
        for row in rows:
            if row.name in self._runtimes:
                continue
            llm, embedder = self._models.load(row.name, row.llm, row.embedder, row.dim)
            # The Memory's longer timeouts hold for its work (the record keeps its own).
            self._recorded[row.name] = row.config
            config = with_longer_timeouts(row.config, self.config)
            self._runtimes[row.name] = Runtime(llm, embedder, config, row.dim, row.generation)
        self.adopt(*self._models.built())

    async def open(
        self,
        name: str,
        *,
        llm: LLM | None,
        embedder: Embedder | None,
        config: Config | None,
        save: Callable[[RepoRow], Awaitable[None]] | None,
    ) -> None:
        """`Memory.open_repo` without the resuming and the checks of its arguments: records and
        `save`s the repo (`save` None: nothing stored; the models and config hold for this
        Memory). A new repo takes a name (`check_name`); one stored before that rule opens by
        its stored name."""
        if name not in self._runtimes:
            try:
                check_name(name, "repo name")
            except InvalidInputError:
                await self.learn(name)  # stored before the rule (through any Memory)?
                if name not in self._runtimes:
                    raise
        chosen_embedder: Embedder = embedder or self._models.embedder(name)
        chosen_llm: LLM = llm or self._models.llm(name)
        dim = await detect_dim(chosen_embedder)
        known = self._runtimes.get(name)
        refusal = self._models.refusal(name) if known is not None else None
        if refusal is not None and embedder is not None:
            raise EmbeddingError(refusal)
        if known is not None:
            check_dim(name, chosen_embedder, known.dim)
        recorded = self._recorded.get(name)
        chosen_config = config or recorded or (known.config if known else self.config)
        # The models are recorded as URIs (never a key) for a Memory opened without them.
        row = RepoRow(
            name, chosen_config, dim, model_name(chosen_embedder),
            model_name(chosen_llm), known.generation if known is not None else 0,
        )
        models_changed = self._models.record(name, row.llm, row.embedder)
        if save is not None and (
                known is None or chosen_config != recorded or models_changed):
            await save(row)
            self._recorded[name] = chosen_config
        if config is None:
            chosen_config = with_longer_timeouts(chosen_config, self.config)
        if known is None:
            self._runtimes[name] = Runtime(chosen_llm, chosen_embedder, chosen_config, dim)
        else:
            # Sessions hold this Runtime: updating it in place is what they see next.
            known.llm, known.embedder, known.config = chosen_llm, chosen_embedder, chosen_config

    def names(self) -> list[str]:
        return list(self._runtimes)

    async def refresh(self, name: str, generation: int | None = None) -> Runtime:
        """The repo's runtime, updated in place from the store's record when its vectors'
        generation moved (another Memory re-embedded it); NotFoundError for an unknown repo.
        `generation`: the one just seen (None: the record is read)."""
        runtime = self.get(name)
        if generation is not None and generation == runtime.generation:
            return runtime
        row = next((r for r in await self._stored() if r.name == name), None)
        if row is None or row.generation == runtime.generation:
            return runtime
        embedder = self._models.reload(name, row.embedder, row.dim, runtime.llm)
        self.adopt(*self._models.built())
        runtime.embedder, runtime.dim, runtime.generation = embedder, row.dim, row.generation
        return runtime

    async def reembed_target(self, name: str, embedder: Embedder | None) -> tuple[Embedder, int]:
        """The embedder `Memory.reembed` uses and its dimension: `embedder`, else the Memory's,
        else the repo's own as this mnemo builds it (a retired hashed embedder's record gets
        `hash2`). InvalidInputError: not an Embedder; EmbeddingError: the repo's own
        cannot be built here, or its dimension cannot be learned."""
        check_models(None, embedder)
        runtime = self.get(name)
        if embedder is None and self._models.embedder_given:
            embedder = self.embedder
        if embedder is None:
            successor = self._models.successor(name, runtime.dim)
            if successor is not None and successor is not self.embedder:
                self.adopt(successor)  # made here for the repo
            embedder = successor or runtime.embedder
        check_runnable(embedder)
        return embedder, await detect_dim(embedder)

    def reembedded(self, name: str, embedder: Embedder, dim: int, generation: int) -> None:
        """The repo's vectors are now `embedder`'s, of `generation`; its runtime runs it."""
        runtime = self.get(name)
        self._models.record(name, self._models.recorded_llm(name), model_name(embedder))
        self._models.remember(name, runtime.llm, embedder)
        runtime.embedder, runtime.dim, runtime.generation = embedder, dim, generation

    async def adopt_profiles(self, store: SessionStore) -> None:
        """Each repo's models that learn their servers start from the repo's record of them
        (once per model object); a store fault leaves them starting afresh."""
        for repo, runtime in list(self._runtimes.items()):
            for model in (runtime.llm, runtime.embedder):
                adopt = getattr(model, "adopt_server_profile", None)
                if adopt is None or (repo, id(model)) in self._profiled:
                    continue
                try:
                    text = await store.load_profile(repo, model_name(model))
                except StorageError as exc:
                    log.warning("the server profile of %s is unreadable: %r", repo, exc)
                    text = None
                stored = None if text is None else ServerProfile.decode(text)
                if stored is not None:
                    adopt(stored)
                self._profiled[(repo, id(model))] = (model, stored)

    async def save_profiles(self, store: SessionStore) -> None:
        """Records what each repo's models learned of their servers, when it changed (a store
        fault is logged)."""
        for key, (model, saved) in list(self._profiled.items()):
            profile = getattr(model, "server_profile", lambda: None)()
            if not isinstance(profile, ServerProfile) or profile == saved:
                continue
            try:
                await store.save_profile(key[0], model_name(model), profile.encode())
            except StorageError as exc:
                log.warning("the server profile of %s was not recorded: %r", key[0], exc)
                continue
            self._profiled[key] = (model, profile)

    async def learn(self, wanted: str | None = None) -> None:
        """Knows the repos other Memory objects opened since (all, or if `wanted` is unknown)."""
        if wanted is None or wanted not in self._runtimes:
            self.load(await self._stored())

    async def known(self, name: str) -> Runtime:
        """The repo's runtime, the store asked first when this Memory does not know it
        (InvalidInputError for a bad name, NotFoundError for no such repo)."""
        await self.learn(check_id(name, "repo"))
        return self.get(name)

    async def checked(self, name: str, check: Callable[[Config], T]) -> T:
        """`check(config)` before the store is read: with the repo's config as known, or, for
        an unknown repo, with every bound at its ceiling and again with the repo's once read.
        Raises what `check` raises; InvalidInputError: a bad name; NotFoundError: no such repo."""
        if (runtime := self._runtimes.get(check_id(name, "repo"))) is not None:
            return check(runtime.config)
        check(ceilings())
        return check((await self.known(name)).config)

    def get(self, name: str) -> Runtime:
        """Raises InvalidInputError for a bad repo name, NotFoundError for an unknown repo."""
        runtime = self._runtimes.get(check_id(name, "repo"))
        if runtime is None:
            raise NotFoundError("repo", name)
        return runtime

    def embedding(self, name: str) -> Runtime:
        """The repo's runtime, checked to embed in the repo's dimension (else EmbeddingError,
        e.g. a hashed embedder's repo reopened with the default); NotFoundError."""
        runtime = self.get(name)
        check_dim(name, runtime.embedder, runtime.dim)
        return runtime

    def dim(self, name: str) -> int:
        return self._runtimes[name].dim

    async def session_runtime(
        self, repo: str, llm: LLM | None, embedder: Embedder | None, config: Config | None
    ) -> tuple[Runtime | None, Config]:
        """The overrides of a session started with these arguments (None: its repo's models)
        and its config; NotFoundError, EmbeddingError as `Memory.start_session`."""
        base = self.get(repo)
        if embedder is not None:
            await detect_dim(embedder)
        check_dim(repo, embedder or base.embedder, base.dim)
        override = None
        if llm is not None or embedder is not None:
            override = Runtime(
                llm or base.llm, embedder or base.embedder, config or base.config, base.dim)
        return override, config or base.config
