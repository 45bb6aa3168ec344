"""Model URIs: every form builds its adapter named by its URI; errors are one line."""

from __future__ import annotations

from dataclasses import replace

import anyio
import pytest

import mnemo
from mnemo.adapters.uri import ModelURIError
from mnemo.calls.tasks import ask
from mnemo.ports import model_name
from tests.adapters.provider_server import ProviderServer, Slow

KEYS = {"OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "ak-test"}


@pytest.mark.parametrize(
    ("uri", "kind", "model"),
    [
        ("offline", mnemo.OfflineLLM, None),
        ("openai:gpt-4o-mini", mnemo.OpenAICompatible, "gpt-4o-mini"),
        ("anthropic:claude-3-5-haiku-latest", mnemo.Anthropic, "claude-3-5-haiku-latest"),
        ("anthropic:claude-x@http://127.0.0.1:9/", mnemo.Anthropic, "claude-x"),
        ("openai-compatible:llama3.2:3b@http://localhost:11434/v1", mnemo.OpenAICompatible,
         "llama3.2:3b"),
    ],
)
def test_each_llm_form_builds_its_adapter_named_by_its_uri(
    uri: str, kind: type, model: str | None
) -> None:
    """llm_from_uri builds the adapter of each form; its name is the URI it came from."""
    llm = mnemo.llm_from_uri(uri, env=KEYS)
    assert isinstance(llm, kind)
    assert getattr(llm, "model", None) == model
    assert model_name(llm) == uri.rstrip("/")
    assert model_name(mnemo.llm_from_uri(model_name(llm), env=KEYS)) == model_name(llm)


@pytest.mark.parametrize(
    ("uri", "dim", "name"),
    [
        ("hash", 512, "hash2"),
        ("hash:64", 64, "hash2:64"),
        ("HASH:64", 64, "hash2:64"),
        ("hash2:64", 64, "hash2:64"),
        ("minilm", 384, "minilm"),
        ("e5-small-q4", 384, "e5-small-q4"),
    ],
)
def test_local_embedders_are_built_with_their_dimension(uri: str, dim: int, name: str) -> None:
    """hash[:DIM] and minilm build local embedders whose name is the canonical URI (the
    hashed embedder's names its features' version, hash2)."""
    embedder = mnemo.embedder_from_uri(uri, env={})
    assert (embedder.dim, model_name(embedder)) == (dim, name)


def test_openai_embedder_takes_a_base_url_and_a_known_dimension() -> None:
    """openai:MODEL[@URL] builds OpenAIEmbedder, with `dim` given when the repo knows it."""
    own = mnemo.embedder_from_uri("openai:text-embedding-3-small", env=KEYS, dim=1536)
    assert isinstance(own, mnemo.OpenAIEmbedder)
    assert (own.dim, model_name(own)) == (1536, "openai:text-embedding-3-small")
    local = mnemo.embedder_from_uri("openai:nomic@http://127.0.0.1:9/v1", env={})
    assert model_name(local) == "openai:nomic@http://127.0.0.1:9/v1"


def test_adapters_made_by_hand_carry_the_same_uris() -> None:
    """Adapters built directly name themselves with the URI that rebuilds them."""
    assert mnemo.OpenAICompatible("m", api_key="k").name == "openai:m"
    assert (
        mnemo.OpenAICompatible("m", base_url="http://h:1/v1/").name
        == "openai-compatible:m@http://h:1/v1"
    )
    assert mnemo.Anthropic("c", api_key="k").name == "anthropic:c"
    assert mnemo.HashEmbedder(32).name == "hash2:32"
    assert mnemo.OfflineLLM().name == "offline"


@pytest.mark.parametrize(
    ("uri", "variable"),
    [
        ("openai:gpt-4o-mini", "OPENAI_API_KEY"),
        ("anthropic:claude-3-5-haiku-latest", "ANTHROPIC_API_KEY"),
    ],
)
def test_a_missing_key_names_its_variable(uri: str, variable: str) -> None:
    """A provider's own API without its key is one line naming the variable to set."""
    with pytest.raises(ModelURIError) as caught:
        mnemo.llm_from_uri(uri, env={})
    assert caught.value.variable == variable
    assert variable in str(caught.value)
    assert "\n" not in str(caught.value)
    with pytest.raises(ModelURIError, match="OPENAI_API_KEY"):
        mnemo.embedder_from_uri("openai:text-embedding-3-small", env={})


def test_keys_come_from_the_process_environment_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without `env`, the key is read from os.environ when the model is built."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ModelURIError, match="OPENAI_API_KEY"):
        mnemo.llm_from_uri("openai:gpt-4o-mini")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert model_name(mnemo.llm_from_uri("openai:gpt-4o-mini")) == "openai:gpt-4o-mini"


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("gemini:pro", "unknown LLM provider 'gemini'"),
        ("", "non-blank"),
        ("openai:", "names no model"),
        ("openai-compatible:llama", "names no server"),
        ("openai:gpt@http://h/v1", "openai-compatible:gpt@http://h/v1"),
        ("openai-compatible:m@localhost", "http(s)://"),
        ("offline:x", "takes no model"),
    ],
)
def test_bad_llm_uris_are_one_readable_line(uri: str, words: str) -> None:
    """Each malformed or unknown LLM URI is an InvalidInputError of one line saying what."""
    with pytest.raises(mnemo.InvalidInputError) as caught:
        mnemo.llm_from_uri(uri, env=KEYS)
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("e5:small", "unknown embedder provider 'e5'"),
        ("hash:0", "positive whole dimension"),
        ("hash:x", "positive whole dimension"),
        ("minilm:big", "takes no model"),
        ("hash:8@http://h", "takes no URL"),
        ("openai:", "names no model"),
    ],
)
def test_bad_embedder_uris_are_one_readable_line(uri: str, words: str) -> None:
    """Each malformed or unknown embedder URI is an InvalidInputError of one line."""
    with pytest.raises(mnemo.InvalidInputError) as caught:
        mnemo.embedder_from_uri(uri, env=KEYS)
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_object_without_a_uri_is_recorded_by_its_class() -> None:
    """A model with no name is recorded by its qualified class name, which no parser knows."""

    class Custom:
        pass

    assert model_name(Custom()).endswith("Custom")


async def test_settings_in_the_uri_reach_the_wire() -> None:
    """`?temperature=...&max_tokens=...` on an openai-compatible URI is sent with every
    request; the adapter's name (what a repo records) leaves the settings out."""
    with ProviderServer() as server:
        uri = f"openai-compatible:m@{server.openai_url}?temperature=0.7&max_tokens=300"
        llm = mnemo.llm_from_uri(uri, env={})
        assert model_name(llm) == f"openai-compatible:m@{server.openai_url}"
        assert isinstance(llm, mnemo.OpenAICompatible)
        async with llm:
            await llm.generate(
                mnemo.LLMRequest("state", "Say.", [{"role": "user", "content": "x"}])
            )
        server_default = mnemo.llm_from_uri(
            f"anthropic:c@{server.url}?temperature=server", env={}
        )
        assert isinstance(server_default, mnemo.Anthropic)
        async with server_default:
            await server_default.generate(
                mnemo.LLMRequest("state", "Say.", [{"role": "user", "content": "x"}])
            )
    first, second = (r.body for r in server.requests)
    assert (first["temperature"], first["max_tokens"]) == (0.7, 300)
    assert "temperature" not in second


async def test_a_timeout_in_the_uri_bounds_each_request() -> None:
    """`?timeout=0.2` makes a server slower than that a timeout (one attempt, no retry)."""
    with ProviderServer() as server:
        server.script(Slow(5))
        llm = mnemo.llm_from_uri(f"openai-compatible:m@{server.openai_url}?timeout=0.2", env={})
        assert isinstance(llm, mnemo.OpenAICompatible)
        policy = replace(llm.retry_policy, max_calls=1)
        async with llm:
            with anyio.fail_after(4), pytest.raises(mnemo.LLMError, match=r"no reply within 0\.2"):
                await ask(
                    llm, mnemo.LLMRequest("state", "S.", [{"role": "user", "content": "x"}]),
                    lambda response: response.text, policy=policy,
                )


def test_embedder_uris_take_their_settings() -> None:
    """An openai embedder URI takes timeout and max_concurrency; a local one takes none."""
    embedder = mnemo.embedder_from_uri(
        "openai:nomic@http://127.0.0.1:9/v1?timeout=5&max_concurrency=2", env={}
    )
    assert model_name(embedder) == "openai:nomic@http://127.0.0.1:9/v1"
    with pytest.raises(ModelURIError, match=r"unknown setting 'timeout'.*none"):
        mnemo.embedder_from_uri("hash:8?timeout=5", env={})


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("openai:gpt?temperature=-1", "temperature must be a number >= 0"),
        ("openai:gpt?temperature=hot", "temperature must be"),
        ("openai:gpt?timeout=0", "timeout must be a number of seconds > 0"),
        ("openai:gpt?max_concurrency=0", "max_concurrency must be a whole number >= 1"),
        ("openai:gpt?max_tokens=1.5", "max_tokens must be a whole number"),
        ("openai:gpt?concurrency=0", "concurrency must be a whole number >= 1"),
        ("openai:gpt?top_p=1", "unknown setting 'top_p'"),
        ("openai:gpt?timeout=1&timeout=2", "given twice"),
        ("openai:gpt?timeout", "name=value pairs"),
        ("offline?temperature=1", "unknown setting 'temperature'"),
        ("openai:gpt?structured=xml", "structured must be one of auto, json_schema"),
        ("anthropic:c?structured=tool", "unknown setting 'structured'"),
    ],
)
def test_bad_settings_are_one_readable_line(uri: str, words: str) -> None:
    """A malformed, unknown, repeated or out-of-range setting is a ModelURIError of one line."""
    with pytest.raises(ModelURIError) as caught:
        mnemo.llm_from_uri(uri, env=KEYS)
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_structured_mode_can_be_pinned_in_the_uri() -> None:
    """`?structured=tool` builds an OpenAI-compatible adapter that starts in tool mode (a
    server known to refuse json_schema is not asked it first)."""
    llm = mnemo.llm_from_uri("openai-compatible:m@http://127.0.0.1:9/v1?structured=tool", env={})
    assert isinstance(llm, mnemo.OpenAICompatible)
    assert llm.structured_mode == "tool"


def test_the_concurrency_can_be_pinned_in_the_uri() -> None:
    """`?concurrency=1` pins the adapter's limit (no adapting to the server) and
    `max_concurrency` sets its ceiling."""
    llm = mnemo.llm_from_uri(
        "openai-compatible:m@http://127.0.0.1:9/v1?concurrency=1&max_concurrency=3", env={}
    )
    assert isinstance(llm, mnemo.OpenAICompatible)
    assert (llm.concurrency.pinned, llm.concurrency.ceiling) == (1, 3)
