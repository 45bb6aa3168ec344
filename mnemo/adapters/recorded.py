"""The models a repo runs with when its `Memory` was given none: the ones the repo recorded.

One this mnemo cannot build (the caller's own model, a URI without its key) is a stand-in of the
recorded name and dimension whose calls raise saying how to pass it or what to set, never the
Memory's default (so a repo's vectors stay one embedder's and its record stays); as is one of the
retired hashed embedder (`hash`, `hash:DIM`, `hash-ngram-v1`), replaced by `Memory.reembed` with
`hash2`."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from mnemo.adapters.uri import (
    EMBEDDER_SCHEMES,
    LLM_SCHEMES,
    ModelURIError,
    embedder_from_uri,
    llm_from_uri,
)
from mnemo.errors import EmbeddingError, LLMError
from mnemo.ports import LLM, Embedder, LLMRequest, LLMResponse, model_name

logger = logging.getLogger("mnemo")

# Names the embedders had before they were URIs, for repos recorded then.
_LEGACY_EMBEDDERS = {"all-MiniLM-L6-v2-int8": "minilm", "hash-ngram-v1": "hash:{dim}"}
_RETIRED_SCHEMES = {"hash"}


class UnavailableLLM:
    """Stands in for a repo's recorded LLM that cannot be built here; every call says why."""

    def __init__(self, name: str, problem: str) -> None:
        self.name = name
        self.problem = problem

    async def generate(self, request: LLMRequest) -> LLMResponse:
        raise LLMError(self.problem)


class UnavailableEmbedder:
    """Stands in for a repo's recorded embedder that cannot be built here; every call says why."""

    def __init__(self, name: str, dim: int, problem: str) -> None:
        self.name = name
        self.dim = dim
        self.problem = problem

    async def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        raise EmbeddingError(self.problem)


def check_runnable(model: LLM | Embedder) -> None:
    """Raises a stand-in's `LLMError` / `EmbeddingError` (its model cannot run here)."""
    if isinstance(model, UnavailableLLM):
        raise LLMError(model.problem)
    if isinstance(model, UnavailableEmbedder):
        raise EmbeddingError(model.problem)


def _scheme(uri: str) -> str:
    return uri.partition(":")[0].strip().lower()


def _uri(name: str, dim: int) -> str:
    """The URI of a recorded embedder: a legacy name's, else the name (braces and all)."""
    return _LEGACY_EMBEDDERS[name].format(dim=dim) if name in _LEGACY_EMBEDDERS else name


def _warn_other(repo: str, made_by: str, given: str) -> None:
    """Warns that `repo`'s vectors, made by `made_by`, are compared with `given`'s, another
    embedder's of their dimension."""
    if made_by != given and "{" not in made_by:
        logger.warning("repo %r: its vectors were made by %s, and %s is given: recall compares "
                       "the two until reembed(%r, embedder=...) makes them anew", repo, made_by,
                       given, repo)


def _retired(repo: str, uri: str) -> str:
    return (
        f"repo {repo!r} holds vectors of the embedder {uri}, the hashed embedder's earlier "
        "features (words split and stemmed another way), which this mnemo no longer makes; "
        "its vectors would not compare with today's hash2: make them again with "
        f"`mnemo reembed {repo}` (or `await mem.reembed({repo!r})`); reading its nodes needs "
        "no embedder"
    )


def _successor(uri: str) -> str | None:
    """`hash2[:DIM]` for a retired `hash[:DIM]`, else None."""
    scheme, colon, rest = uri.partition(":")
    return f"hash2{colon}{rest}" if scheme.strip().lower() in _RETIRED_SCHEMES else None


def _problem(repo: str, kind: str, uri: str, exc: ModelURIError) -> str:
    argument = "llm" if kind == "LLM" else "embedder"
    if _scheme(uri) not in (LLM_SCHEMES if kind == "LLM" else EMBEDDER_SCHEMES):
        return (f"repo {repo!r} runs the {kind} {uri}, which mnemo cannot build from its name: "
                f"pass that {kind} as Memory({argument}=...) (the command line runs only "
                "models named by URI)")
    fix = f"set {exc.variable}" if exc.variable else "fix the record"
    return (
        f"repo {repo!r} runs the {kind} {uri}, which cannot be built here: {exc}; {fix}, "
        f"or choose another with --{argument} / {argument}="
    )


class RepoModels:
    """Each repo's own models, built once from its record (see the module doc)."""

    def __init__(
        self, llm: LLM, embedder: Embedder, *, llm_given: bool, embedder_given: bool
    ) -> None:
        self._llm, self._embedder = llm, embedder
        # Whether the Memory was given its models (then run for every repo).
        self._llm_given, self.embedder_given = llm_given, embedder_given
        self._repos: dict[str, tuple[LLM, Embedder]] = {}
        self._records: dict[str, tuple[str | None, str]] = {}
        # One adapter per URI, shared by the repos that record it.
        self._llms: dict[str, LLM] = {}
        self._embedders: dict[tuple[str, int], Embedder] = {}

    def load(self, repo: str, llm: str | None, embedder: str, dim: int) -> tuple[LLM, Embedder]:
        if self.embedder_given and getattr(self._embedder, "dim", None) == dim:  # else refused
            _warn_other(repo, _uri(embedder, dim), model_name(self._embedder))
        models = (self._recorded_llm(repo, llm), self._recorded_embedder(repo, embedder, dim))
        self._repos[repo] = models
        self._records[repo] = (llm, embedder)
        return models

    def reload(self, repo: str, embedder: str, dim: int, llm: LLM) -> Embedder:
        """The embedder `repo` runs with now that its record names `embedder` of `dim` (a stand-in
        when the Memory was given an embedder of another URI)."""
        legacy = _uri(embedder, dim)
        built = self._recorded_embedder(repo, embedder, dim)
        if self.embedder_given and built is self._embedder and (
            model_name(self._embedder) not in (embedder, legacy) or self._embedder.dim != dim
        ):
            built = UnavailableEmbedder(
                embedder, dim,
                f"repo {repo!r} was re-embedded with {embedder} since this Memory opened it "
                f"with {model_name(self._embedder)}: open a Memory with that embedder, or "
                "with none",
            )
        self._repos[repo] = (llm, built)
        self._records[repo] = (self._records.get(repo, (None, embedder))[0], embedder)
        return built

    def successor(self, repo: str, dim: int) -> Embedder | None:
        """The embedder that replaces `repo`'s retired hashed one, else None."""
        record = self._records.get(repo)
        if record is None:
            return None
        uri = _successor(_uri(record[1], dim))
        if uri is None:
            return None
        if uri == model_name(self._embedder) and self._embedder.dim == dim:
            return self._embedder
        return embedder_from_uri(uri, dim=dim)

    def record(self, repo: str, llm: str | None, embedder: str) -> bool:
        """Notes the URIs `repo` now runs with; whether they differ from its stored record."""
        before = self._records.get(repo)
        # The Memory's own embedder was warned of as the repo was loaded.
        if before is not None and not (
                self.embedder_given and embedder == model_name(self._embedder)):
            _warn_other(repo, _LEGACY_EMBEDDERS.get(before[1], before[1]), embedder)
        changed = before != (llm, embedder)
        self._records[repo] = (llm, embedder)
        return changed

    def recorded_llm(self, repo: str) -> str | None:
        """The LLM's URI in `repo`'s record (None when not known)."""
        record = self._records.get(repo)
        return None if record is None else record[0]

    def remember(self, repo: str, llm: LLM, embedder: Embedder) -> None:
        """`repo` runs these models from now on (its vectors were made with `embedder`)."""
        self._repos[repo] = (llm, embedder)

    def refusal(self, repo: str) -> str | None:
        """Why no other embedder may be recorded for `repo` (its vectors are retired), or None."""
        record = self._records.get(repo)
        if record is None or _successor(_LEGACY_EMBEDDERS.get(record[1], record[1])) is None:
            return None
        return _retired(repo, record[1])

    def llm(self, repo: str) -> LLM:
        """The repo's LLM when `open_repo` is given none."""
        return self._repos[repo][0] if repo in self._repos else self._llm

    def embedder(self, repo: str) -> Embedder:
        """The repo's embedder when `open_repo` is given none."""
        return self._repos[repo][1] if repo in self._repos else self._embedder

    def built(self) -> list[object]:
        """The adapters built from records, to close with the Memory."""
        return [*self._llms.values(), *self._embedders.values()]

    def _recorded_llm(self, repo: str, uri: str | None) -> LLM:
        if self._llm_given or uri is None or uri == model_name(self._llm):
            return self._llm
        built = self._llms.get(uri)
        if built is None:
            try:
                built = self._llms[uri] = llm_from_uri(uri)
            except ModelURIError as exc:
                return UnavailableLLM(uri, _problem(repo, "LLM", uri, exc))
        return built

    def _recorded_embedder(self, repo: str, uri: str, dim: int) -> Embedder:
        uri = _uri(uri, dim)
        if uri in ("hash:512", "hash2:512"):
            uri = uri.removesuffix(":512")
        if _scheme(uri) in _RETIRED_SCHEMES:
            return UnavailableEmbedder(uri, dim, _retired(repo, uri))
        if self.embedder_given or uri == model_name(self._embedder):
            return self._embedder
        built = self._embedders.get((uri, dim))
        if built is None:
            try:
                built = self._embedders[uri, dim] = embedder_from_uri(uri, dim=dim)
            except ModelURIError as exc:
                return UnavailableEmbedder(uri, dim, _problem(repo, "embedder", uri, exc))
        return built
