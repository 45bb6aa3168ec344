"""Models named by URIs: what `--llm`, `--embedder`, `MNEMO_LLM`, `MNEMO_EMBEDDER` and a repo's
record of its models hold.

LLMs: `offline` (the default), `openai:MODEL`, `anthropic:MODEL[@BASE_URL]`,
`openai-compatible:MODEL@BASE_URL` (Ollama, vLLM, llama.cpp, ...). Embedders: `minilm`,
`e5-small-q4` (the `e5` extra), `hash[:DIM]`, `openai:MODEL[@BASE_URL]`. Each adapter's
`.name` is its URI, so a repo records the URI of the models it was opened with and a later
`Memory` builds them again.

A URI never holds a key: keys come from the providers' usual variables, `OPENAI_API_KEY` and
`ANTHROPIC_API_KEY` (read when the model is built, from `env`, by default the process's
environment). An `openai-compatible` server gets `OPENAI_API_KEY` when it is set, as
`OpenAICompatible` does, and none otherwise (a local server needs none).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from mnemo.errors import InvalidInputError
from mnemo.ports import LLM, Embedder, model_name

if TYPE_CHECKING:
    import httpx

# The adapters are imported by the URI that names them: a memory run offline never imports
# httpx and jsonschema (a third of a command's start-up).

LLM_FORMS = (
    "offline",
    "openai:MODEL",
    "anthropic:MODEL",
    "openai-compatible:MODEL@BASE_URL",
)
EMBEDDER_FORMS = ("minilm", "e5-small-q4", "hash[:DIM]", "openai:MODEL[@BASE_URL]")

# Which variable holds each provider's key, and whether the provider's own API needs it.
KEY_VARIABLES = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


class ModelURIError(InvalidInputError):
    """A model URI that cannot be built: malformed, an unknown provider, or a missing key
    (`variable` then names the environment variable to set). The message is one line."""

    def __init__(self, message: str, *, uri: str, variable: str | None = None) -> None:
        super().__init__(message)
        self.uri = uri
        self.variable = variable


def model_uri(model: object) -> str:
    """The URI a model object is recorded under (`ports.model_name`: its `name`, else its
    class's qualified name, which no URI parser knows: such a model cannot be rebuilt from the
    record)."""
    return model_name(model)


def _split(uri: object, kind: str, forms: tuple[str, ...]) -> tuple[str, str, str | None]:
    """(scheme, model, base URL or None) of `uri`."""
    if not isinstance(uri, str) or not uri.strip():
        raise ModelURIError(
            f"the {kind} must be a non-blank URI ({', '.join(forms)}), got {uri!r}", uri=str(uri)
        )
    text = uri.strip()
    scheme, _, rest = text.partition(":")
    scheme = scheme.lower()
    base_url: str | None = None
    # A model name may hold ':' (llama3.2:3b) and, rarely, '@': the base URL starts at the
    # last '@' that is followed by http(s)://.
    at = max(rest.rfind("@http://"), rest.rfind("@https://"))
    if at >= 0:
        rest, base_url = rest[:at], rest[at + 1 :].rstrip("/")
    elif "@" in rest:
        raise ModelURIError(
            f"{kind} URI {text!r}: the part after '@' must be an http(s):// base URL", uri=text
        )
    return scheme, rest.strip(), base_url


def _unknown(kind: str, scheme: str, uri: str, forms: tuple[str, ...]) -> ModelURIError:
    return ModelURIError(
        f"unknown {kind} provider {scheme!r} in {uri!r} (use one of: {', '.join(forms)})",
        uri=uri,
    )


def _key(provider: str, uri: str, env: Mapping[str, str], *, required: bool) -> str:
    """The provider's key from `env`; "" when there is none and none is required."""
    variable = KEY_VARIABLES[provider]
    key = env.get(variable, "")
    if not key and required:
        raise ModelURIError(
            f"{uri} needs an API key: set {variable} in the environment", uri=uri,
            variable=variable,
        )
    return key


def _need_model(kind: str, scheme: str, model: str, uri: str) -> None:
    if not model:
        raise ModelURIError(f"{kind} URI {uri!r} names no model: write {scheme}:MODEL", uri=uri)


def llm_from_uri(
    uri: str,
    *,
    env: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> LLM:
    """The LLM a URI names: `offline`, `openai:MODEL`, `anthropic:MODEL[@BASE_URL]` or
    `openai-compatible:MODEL@BASE_URL`. Keys come from `env` (default: `os.environ`), never
    from the URI. `transport` replaces httpx's network transport (tests).

    Raises:
        ModelURIError: a malformed URI, an unknown provider, or no key in `env` for a
            provider's own API (the message names the variable).
    """
    env = os.environ if env is None else env
    scheme, model, base_url = _split(uri, "LLM", LLM_FORMS)
    text = uri.strip()
    if scheme == "offline":
        if model or base_url:
            raise ModelURIError(f"the offline LLM takes no model, got {text!r}", uri=text)
        from mnemo.adapters.offline import OfflineLLM

        return OfflineLLM()
    _need_model("LLM", scheme, model, text)
    from mnemo.adapters.anthropic import ANTHROPIC_BASE_URL, Anthropic
    from mnemo.adapters.openai import OPENAI_BASE_URL, OpenAICompatible

    if scheme == "openai":
        if base_url is not None:
            raise ModelURIError(
                f"{text!r}: for another server than OpenAI's write "
                f"openai-compatible:{model}@{base_url}",
                uri=text,
            )
        key = _key("openai", text, env, required=True)
        return OpenAICompatible(model, api_key=key, transport=transport)
    if scheme == "openai-compatible":
        if base_url is None:
            raise ModelURIError(
                f"{text!r} names no server: write openai-compatible:{model}@BASE_URL "
                "(e.g. @http://localhost:11434/v1)",
                uri=text,
            )
        key = _key("openai", text, env, required=base_url == OPENAI_BASE_URL)
        return OpenAICompatible(model, base_url=base_url, api_key=key, transport=transport)
    if scheme == "anthropic":
        url = base_url or ANTHROPIC_BASE_URL
        key = _key("anthropic", text, env, required=url == ANTHROPIC_BASE_URL)
        return Anthropic(model, base_url=url, api_key=key, transport=transport)
    raise _unknown("LLM", scheme, text, LLM_FORMS)


def embedder_from_uri(
    uri: str,
    *,
    env: Mapping[str, str] | None = None,
    dim: int | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Embedder:
    """The embedder a URI names: `minilm`, `e5-small-q4`, `hash[:DIM]` (512 by default) or
    `openai:MODEL[@BASE_URL]`. `dim` is the dimension already known (a repo's), which spares an
    OpenAI embedder the request that detects it. Keys come from `env` (default: `os.environ`).

    Raises:
        ModelURIError: a malformed URI, an unknown provider, a bad dimension, or no key in
            `env` for OpenAI's own API (the message names the variable).
    """
    env = os.environ if env is None else env
    scheme, model, base_url = _split(uri, "embedder", EMBEDDER_FORMS)
    text = uri.strip()
    if scheme in ("minilm", "e5-small-q4", "hash") and base_url is not None:
        raise ModelURIError(f"the {scheme} embedder runs here, it takes no URL: {text!r}", uri=text)
    if scheme == "minilm":
        if model:
            raise ModelURIError(f"the minilm embedder takes no model, got {text!r}", uri=text)
        from mnemo.adapters.minilm import MiniLMEmbedder

        return MiniLMEmbedder()
    if scheme == "e5-small-q4":
        if model:
            raise ModelURIError(f"the e5-small-q4 embedder takes no model, got {text!r}", uri=text)
        from mnemo.adapters.e5 import E5SmallEmbedder

        return E5SmallEmbedder()
    from mnemo.adapters.hashing import HashEmbedder

    if scheme == "hash":
        if not model:
            return HashEmbedder()
        if not model.isdigit() or int(model) < 1:
            raise ModelURIError(
                f"hash:DIM needs a positive whole dimension, got {text!r}", uri=text
            )
        return HashEmbedder(int(model))
    if scheme == "openai":
        from mnemo.adapters.embeddings import OpenAIEmbedder
        from mnemo.adapters.openai import OPENAI_BASE_URL

        _need_model("embedder", scheme, model, text)
        url = base_url or OPENAI_BASE_URL
        key = _key("openai", text, env, required=url == OPENAI_BASE_URL)
        return OpenAIEmbedder(model, base_url=url, api_key=key, dim=dim, transport=transport)
    raise _unknown("embedder", scheme, text, EMBEDDER_FORMS)
