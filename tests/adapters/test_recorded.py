"""A repo remembers its models: a Memory opened without models runs the repo's recorded ones."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import mnemo
from mnemo.adapters import uri
from mnemo.adapters.recorded import RepoModels, UnavailableEmbedder, UnavailableLLM
from mnemo.ports import model_name
from tests.adapters.provider_server import ProviderServer
from tests.backends import sql
from tests.fakes import FakeLLM

REPO = "r"


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer(dim=16) as s:
        yield s


def recorded(db: Path) -> dict[str, tuple[str, str | None, int]]:
    """Each repo's (embedder, llm, dim) as stored."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT name, embedder, llm, dim FROM repos").fetchall()
    return {name: (embedder, llm, dim) for name, embedder, llm, dim in rows}


async def test_a_reopened_repo_runs_its_recorded_models(
    tmp_path: Path, server: ProviderServer
) -> None:
    """A repo opened with a provider's LLM and embedder records both as URIs; a Memory opened
    later without models sends its appends and recall to them."""
    db = tmp_path / "m.db"
    llm = mnemo.OpenAICompatible("chat-m", base_url=server.openai_url)
    embedder = mnemo.OpenAIEmbedder("embed-m", base_url=server.openai_url)
    async with llm, embedder, mnemo.Memory(db, llm=llm, embedder=embedder) as mem:
        await mem.open_repo(REPO)
    assert recorded(db)[REPO] == (
        f"openai:embed-m@{server.openai_url}", f"openai-compatible:chat-m@{server.openai_url}", 16
    )
    before = len(server.requests)

    async with mnemo.Memory(db) as mem:
        sid = await mem.start_session("walk the house", repo=REPO)
        await mem.append(sid, "walk north along the corridor", "go north")
        await mem.close_and_commit(sid)
        result = await mem.recall(REPO, "corridor")
    assert result.memories
    paths = {r.path for r in server.requests[before:]}
    assert paths == {"/v1/chat/completions", "/v1/embeddings"}
    models = {r.body.get("model") for r in server.requests[before:]}
    assert models == {"chat-m", "embed-m"}


async def test_explicit_models_win_over_the_record_and_are_recorded(tmp_path: Path) -> None:
    """A Memory given models uses them for the repo, and open_repo records the new choice."""
    db = tmp_path / "m.db"
    async with mnemo.Memory(db, embedder=mnemo.HashEmbedder(32)) as mem:
        await mem.open_repo(REPO)
    assert recorded(db)[REPO] == ("hash2:32", "offline", 32)
    async with mnemo.Memory(db, embedder=mnemo.HashEmbedder(32), llm=mnemo.OpenAICompatible(
        "m", base_url="http://127.0.0.1:9/v1"
    )) as mem:
        await mem.open_repo(REPO)
    assert recorded(db)[REPO] == ("hash2:32", "openai-compatible:m@http://127.0.0.1:9/v1", 32)


async def test_no_key_is_ever_recorded(tmp_path: Path) -> None:
    """The repos table holds the URIs, never the key the adapters were given."""
    db = tmp_path / "m.db"
    llm = mnemo.OpenAICompatible("gpt-4o-mini", api_key="sk-secret-1")
    embedder = mnemo.OpenAIEmbedder("text-embedding-3-small", api_key="sk-secret-2", dim=8)
    async with mnemo.Memory(db, llm=llm, embedder=embedder) as mem:
        await mem.open_repo(REPO)
    assert recorded(db)[REPO] == ("openai:text-embedding-3-small", "openai:gpt-4o-mini", 8)
    assert b"sk-secret" not in db.read_bytes()


@pytest.mark.slow
async def test_a_recorded_model_without_its_key_says_which_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reopened where OPENAI_API_KEY is unset, node reads still work, while recall and append
    fail with one clear error naming the variable."""
    db = tmp_path / "m.db"
    async with mnemo.Memory(db, embedder=mnemo.HashEmbedder(8)) as mem:
        await mem.open_repo(REPO)
        await mem.ingest(REPO, mnemo.Trajectory("g", [mnemo.Step("nginx on 80", "ok")]),
                         source_id="s")
    llm = mnemo.OpenAICompatible("gpt-4o-mini", api_key="sk-x")
    embedder = mnemo.OpenAIEmbedder("text-embedding-3-small", api_key="sk-x", dim=8)
    async with mnemo.Memory(db, llm=llm, embedder=embedder) as mem:
        await mem.open_repo(REPO)

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    async with mnemo.Memory(db) as mem:
        assert await mem.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
        with pytest.raises(mnemo.EmbeddingError, match="OPENAI_API_KEY") as caught:
            await mem.recall(REPO, "nginx")
        assert "openai:text-embedding-3-small" in str(caught.value)
        sid = await mem.start_session("g", repo=REPO)
        with pytest.raises(mnemo.LLMError, match="OPENAI_API_KEY"):
            await mem.append(sid, "obs", "act")


def _earlier_hash(dim: int = 512) -> mnemo.HashEmbedder:
    """A hashed embedder recorded under the name the earlier features had (`hash[:DIM]`):
    what a store written before today's tokenizer and stemmer holds."""
    embedder = mnemo.HashEmbedder(dim)
    embedder.name = "hash" if dim == 512 else f"hash:{dim}"
    return embedder


async def _store_of_the_earlier_features(store: str, dim: int = 512) -> None:
    async with mnemo.Memory(store, embedder=_earlier_hash(dim)) as mem:
        await mem.open_repo(REPO)
        await mem.ingest(REPO, mnemo.Trajectory("g", [mnemo.Step("nginx on 80", "ok")]),
                         source_id="s")


async def test_a_repo_of_the_earlier_hashed_features_is_refused_not_searched(
    store: str,
) -> None:
    """A repo whose vectors the hashed embedder made with its earlier features (recorded as
    "hash") is never queried with today's (hash2) on either backend: its nodes read, while a
    recall, an append or an open_repo that records another embedder raise EmbeddingError
    saying why, whether the Memory was given no embedder, today's hashed one, or another;
    the record is left as it was."""
    await _store_of_the_earlier_features(store)
    for given in (None, mnemo.HashEmbedder()):
        async with mnemo.Memory(store, embedder=given) as mem:
            assert await mem.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
            with pytest.raises(mnemo.EmbeddingError, match="earlier features") as caught:
                await mem.recall(REPO, "nginx")
            assert "repo 'r'" in str(caught.value)
            await mem.open_repo(REPO)  # no embedder given: the record stays
            sid = await mem.start_session("g", repo=REPO)
            with pytest.raises(mnemo.EmbeddingError, match="earlier features"):
                await mem.append(sid, "nginx on 8080", "edit the config")
            for embedder in (mnemo.HashEmbedder(), _earlier_hash()):
                with pytest.raises(mnemo.EmbeddingError, match="earlier features"):
                    await mem.open_repo(REPO, embedder=embedder)
    async with mnemo.Memory(store) as mem:
        with pytest.raises(mnemo.EmbeddingError, match="earlier features"):
            await mem.recall(REPO, "nginx")


async def test_a_repo_recorded_with_the_oldest_hash_name_is_refused_too(tmp_path: Path) -> None:
    """A repo recorded before URIs (embedder "hash-ngram-v1", no llm) holds the earlier
    hashed features too: its nodes read, a recall says why it cannot run."""
    db = tmp_path / "m.db"
    await _store_of_the_earlier_features(str(db), dim=64)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE repos SET embedder = 'hash-ngram-v1', llm = NULL")
    async with mnemo.Memory(db) as mem:
        assert await mem.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
        with pytest.raises(mnemo.EmbeddingError, match="hash:64, the hashed embedder's"):
            await mem.recall(REPO, "nginx")
    assert recorded(db)[REPO] == ("hash-ngram-v1", None, 64)


async def test_a_repo_of_todays_hashed_features_reopens_with_them(tmp_path: Path) -> None:
    """A repo recorded as hash2 runs today's hashed embedder when reopened without one."""
    db = tmp_path / "m.db"
    async with mnemo.Memory(db, embedder=mnemo.HashEmbedder(64)) as mem:
        await mem.open_repo(REPO)
        await mem.ingest(REPO, mnemo.Trajectory("g", [mnemo.Step("nginx on 80", "ok")]),
                         source_id="s")
    async with mnemo.Memory(db) as mem:
        result = await mem.recall(REPO, "nginx")
        assert any("nginx" in m.node.text for m in result.memories)
        await mem.open_repo(REPO)
    assert recorded(db)[REPO] == ("hash2:64", "offline", 64)


class _CompanyEmbedder(mnemo.HashEmbedder):
    """An embedder of the caller's own (no URI builds it) of the default's dimension (384),
    keeping the texts it embedded."""

    def __init__(self) -> None:
        super().__init__(384)
        self.name = "my-company-embedder"
        self.texts: list[str] = []

    async def embed(self, texts: Sequence[str]) -> Any:
        self.texts.extend(texts)
        return await super().embed(texts)


class _CompanyLLM(FakeLLM):
    """An LLM of the caller's own: no URI builds it."""

    name = "my-company-llm"


async def _record(mem: mnemo.Memory) -> list[tuple[object, ...]]:
    return await sql(mem, "SELECT name, embedder, llm, dim FROM repos ORDER BY name")


async def test_a_repo_of_ones_own_embedder_is_never_embedded_by_the_default(store: str) -> None:
    """A repo opened with an embedder of the caller's own, reopened by a Memory given none:
    its nodes read, while an ingest or a recall raise EmbeddingError naming the repo, the
    recorded embedder and how to pass it; nothing is stored, the record stays, and the repo's
    vectors are all its own embedder's. Before, the default (MiniLM, also 384) embedded the
    ingest beside them and the repo was recorded as minilm."""
    own = _CompanyEmbedder()
    async with mnemo.Memory(store, embedder=own) as mem:
        await mem.open_repo(REPO)
        await mem.ingest(REPO, mnemo.Trajectory("g", [mnemo.Step("nginx on 80", "ok")]),
                         source_id="s")
        record = await _record(mem)
        nodes = await sql(mem, "SELECT id FROM nodes ORDER BY id")
    assert record == [(REPO, "my-company-embedder", "offline", 384)]
    embedded = len(own.texts)
    async with mnemo.Memory(store) as mem:
        assert await mem.get_nodes_by_type(REPO, [mnemo.NodeType.EPISODIC])
        with pytest.raises(mnemo.EmbeddingError) as caught:
            await mem.ingest(REPO, mnemo.Trajectory("g", [mnemo.Step("redis on 6379", "ok")]),
                             source_id="t")
        for words in ("repo 'r'", "my-company-embedder", "Memory(embedder=...)",
                      "command line runs only models named by URI"):
            assert words in str(caught.value)
        assert "--embedder" not in str(caught.value)  # it takes URIs, not one's own object
        assert "\n" not in str(caught.value)
        with pytest.raises(mnemo.EmbeddingError, match="my-company-embedder"):
            await mem.recall(REPO, "nginx")
        await mem.open_repo(REPO)
        assert await _record(mem) == record
        assert await sql(mem, "SELECT id FROM nodes ORDER BY id") == nodes
        assert await sql(mem, "SELECT count(*) FROM vectors") == [(len(nodes),)]
    async with mnemo.Memory(store, embedder=own) as mem:
        result = await mem.recall(REPO, "nginx")
        assert any("nginx" in m.node.text for m in result.memories)
        assert await _record(mem) == record
    assert len(own.texts) > embedded


async def test_a_repo_of_ones_own_llm_keeps_it_and_runs_no_other(store: str) -> None:
    """A repo opened with an LLM of the caller's own, reopened by a Memory given none:
    open_repo leaves the record, and a session's model call raises LLMError naming the repo,
    the recorded LLM and how to pass it. Before, open_repo recorded the offline LLM and the
    session ran it."""
    async with mnemo.Memory(store, llm=_CompanyLLM(), embedder=mnemo.HashEmbedder(64)) as mem:
        await mem.open_repo(REPO)
        record = await _record(mem)
    assert record == [(REPO, "hash2:64", "my-company-llm", 64)]
    async with mnemo.Memory(store) as mem:
        await mem.open_repo(REPO)
        assert await _record(mem) == record
        sid = await mem.start_session("g", repo=REPO)
        with pytest.raises(mnemo.LLMError) as caught:
            await mem.append(sid, "nginx on 80", "ok")
        for words in ("repo 'r'", "my-company-llm", "Memory(llm=...)"):
            assert words in str(caught.value)
    async with mnemo.Memory(store) as mem:
        assert await _record(mem) == record


class _Default:
    """The Memory's default embedder in these tests: named apart from every URI's adapter,
    of whatever dimension the repo's record has (MiniLM and e5-small-q4 both make 384)."""

    def __init__(self, dim: int) -> None:
        self.name = "the-default"
        self.dim = dim

    async def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        return [[1.0] + [0.0] * (self.dim - 1) for _ in texts]


# One URI of each embedder scheme `embedder_from_uri` builds.
_EMBEDDER_URIS = {
    "minilm": "minilm",
    "e5-small-q4": "e5-small-q4",
    "hash": "hash:64",
    "hash2": "hash2:64",
    "openai": "openai:text-embedding-3-small",
}


def test_every_embedder_scheme_a_uri_builds_is_listed_here() -> None:
    """The schemes tested below are every one `mnemo.adapters.uri` builds."""
    assert set(_EMBEDDER_URIS) == set(uri.EMBEDDER_SCHEMES)


@pytest.mark.parametrize("scheme", sorted(_EMBEDDER_URIS))
def test_every_embedder_a_uri_builds_is_rebuilt_from_its_record(
    scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The name an adapter built from a URI records brings that adapter back for a Memory
    given no embedder, never the Memory's default of the same dimension (a repo recorded
    with e5-small-q4 ran MiniLM: both make 384 dimensions, the vectors do not compare)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    built = mnemo.embedder_from_uri(_EMBEDDER_URIS[scheme], dim=16)
    record = model_name(built)
    default = _Default(built.dim)
    models = RepoModels(mnemo.OfflineLLM(), default, llm_given=False, embedder_given=False)
    _, rebuilt = models.load(REPO, None, record, built.dim)
    assert rebuilt is not default
    assert (model_name(rebuilt), rebuilt.dim) == (record, built.dim)


def test_a_record_no_uri_builds_any_more_is_refused_not_defaulted() -> None:
    """A record of a scheme this mnemo no longer builds the same way (the hashed embedder's
    earlier features) is a stand-in that says why, not the default of its dimension."""
    models = RepoModels(mnemo.OfflineLLM(), _Default(64), llm_given=False, embedder_given=False)
    _, embedder = models.load(REPO, None, "hash:64", 64)
    assert isinstance(embedder, UnavailableEmbedder)
    assert embedder.dim == 64


def test_a_record_of_ones_own_models_is_a_stand_in_of_its_name_whatever_it_holds() -> None:
    """A record no URI builds, braces and all, is a stand-in of that name and dimension (a
    name with braces was formatted as a legacy name's template, and raised KeyError)."""
    models = RepoModels(mnemo.OfflineLLM(), _Default(8), llm_given=False, embedder_given=False)
    llm, embedder = models.load(REPO, "my-{company}-llm", "my-{company}-embedder", 8)
    assert isinstance(embedder, UnavailableEmbedder)
    assert (embedder.name, embedder.dim) == ("my-{company}-embedder", 8)
    assert isinstance(llm, UnavailableLLM)
    assert llm.name == "my-{company}-llm"


@pytest.mark.parametrize("scheme", sorted(uri.LLM_SCHEMES))
def test_every_llm_a_uri_builds_is_rebuilt_from_its_record(
    scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Likewise for LLMs: each scheme's record brings its adapter back, not the default."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "ak-test")
    forms = {"offline": "offline", "openai": "openai:gpt-4o-mini",
             "anthropic": "anthropic:claude-x",
             "openai-compatible": "openai-compatible:m@http://127.0.0.1:9/v1"}
    built = mnemo.llm_from_uri(forms[scheme])
    default = mnemo.OpenAICompatible("the-default", base_url="http://127.0.0.1:9/v1")
    models = RepoModels(default, _Default(8), llm_given=False, embedder_given=False)
    rebuilt, _ = models.load(REPO, model_name(built), "hash2:8", 8)
    assert model_name(rebuilt) == model_name(built)
