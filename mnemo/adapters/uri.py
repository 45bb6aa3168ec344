"""Models named by URIs (`LLM_FORMS`, `EMBEDDER_FORMS`): what `--llm`, `--embedder`, `MNEMO_LLM`,
`MNEMO_EMBEDDER` and a repo's record hold; each adapter's `.name` is its URI. A URI may end in a
query of settings (`?temperature=0.7&timeout=300`); keys come from the environment only."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode

from mnemo.errors import InvalidInputError
from mnemo.ports import LLM, Embedder

if TYPE_CHECKING:
    import httpx

LLM_FORMS = (
    "offline",
    "openai:MODEL",
    "anthropic:MODEL",
    "openai-compatible:MODEL@BASE_URL",
)
EMBEDDER_FORMS = ("minilm", "e5-small-q4", "hash[:DIM]", "openai:MODEL[@BASE_URL]")
# The scheme of every URI `llm_from_uri` and `embedder_from_uri` build (they refuse any other).
LLM_SCHEMES = ("offline", "openai", "anthropic", "openai-compatible")
EMBEDDER_SCHEMES = ("minilm", "e5-small-q4", "hash", "hash2", "openai")

KEY_VARIABLES = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


class ModelURIError(InvalidInputError):
    """A model URI that cannot be built; `variable` names the key's variable when one is missing."""

    def __init__(self, message: str, *, uri: str, variable: str | None = None) -> None:
        super().__init__(message)
        self.uri = uri
        self.variable = variable


LLM_SETTINGS = ("temperature", "timeout", "max_concurrency", "concurrency", "max_tokens")
OPENAI_SETTINGS = (*LLM_SETTINGS, "structured")
EMBEDDER_SETTINGS = ("timeout", "max_concurrency", "concurrency")
STRUCTURED = ("auto", "json_schema", "tool", "json")
# A number setting: what it must be, in words; whether whole; its lowest value.
_NUMBERS: dict[str, tuple[str, bool, float]] = {
    "temperature": ("a number >= 0, or server", False, 0.0),
    "timeout": ("a number of seconds > 0", False, math.ulp(0.0)),
    "max_concurrency": ("a whole number >= 1", True, 1),
    "concurrency": ("a whole number >= 1", True, 1),
    "max_tokens": ("a whole number >= 1", True, 1),
}


def with_settings(uri: str, **settings: object) -> str:
    """`uri` with these settings in its query, replacing those it had (None leaves one as it is)."""
    given = {name: value for name, value in settings.items() if value is not None}
    if not given:
        return uri
    base, _, query = uri.strip().partition("?")
    pairs = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k not in given]
    pairs += [(k, f"{v:g}" if isinstance(v, float) else str(v)) for k, v in given.items()]
    return f"{base}?{urlencode(pairs)}"


def _settings(uri: str, query: str, known: tuple[str, ...]) -> dict[str, Any]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise ModelURIError(
            f"{uri!r}: the settings after '?' must be name=value pairs joined by '&'", uri=uri
        ) from None
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name not in known:
            takes = ", ".join(known) if known else "none"
            raise ModelURIError(
                f"{uri!r}: unknown setting {name!r} (this model takes: {takes})", uri=uri
            )
        if name in out:
            raise ModelURIError(f"{uri!r}: setting {name!r} is given twice", uri=uri)
        out[name] = _setting(uri, name, value.strip())
    return out


def _setting(uri: str, name: str, value: str) -> float | int | str | None:
    if name == "temperature" and value.lower() == "server":
        return None
    if name == "structured":
        if value not in STRUCTURED:
            raise ModelURIError(
                f"{uri!r}: structured must be one of {', '.join(STRUCTURED)}, got {value!r}",
                uri=uri,
            )
        return value
    wanted, whole, lowest = _NUMBERS[name]
    try:
        number: float | int = int(value) if whole else float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number >= lowest):
        raise ModelURIError(f"{uri!r}: {name} must be {wanted}, got {value!r}", uri=uri)
    return number


def _split(
    uri: object, kind: str, forms: tuple[str, ...], schemes: tuple[str, ...]
) -> tuple[str, str, str | None, str, str]:
    """(scheme, model, base URL or None, the settings' query or "", the URI stripped) of `uri`,
    whose scheme must be one of `schemes`."""
    if not isinstance(uri, str) or not uri.strip():
        raise ModelURIError(
            f"the {kind} must be a non-blank URI ({', '.join(forms)}), got {uri!r}", uri=str(uri)
        )
    text, _, query = uri.strip().partition("?")
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
    if scheme not in schemes:
        raise ModelURIError(f"unknown {kind} provider {scheme!r} in {uri.strip()!r} (use one "
                            f"of: {', '.join(forms)})", uri=uri.strip())
    return scheme, rest.strip(), base_url, query.strip(), uri.strip()


def _key(provider: str, uri: str, env: Mapping[str, str], *, required: bool) -> str:
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
    """The LLM a URI names (`LLM_FORMS`), its keys from `env` (default `os.environ`); raises
    ModelURIError for a bad URI or a missing key."""
    env = os.environ if env is None else env
    scheme, model, base_url, query, text = _split(uri, "LLM", LLM_FORMS, LLM_SCHEMES)
    if scheme == "offline":
        if model or base_url:
            raise ModelURIError(f"the offline LLM takes no model, got {text!r}", uri=text)
        from mnemo.adapters.offline import OfflineLLM

        _settings(text, query, ())
        return OfflineLLM()
    _need_model("LLM", scheme, model, text)
    from mnemo.adapters._model import ANTHROPIC_BASE_URL, OPENAI_BASE_URL
    from mnemo.adapters.anthropic import Anthropic
    from mnemo.adapters.openai import OpenAICompatible

    settings = _settings(text, query, LLM_SETTINGS if scheme == "anthropic" else OPENAI_SETTINGS)
    if scheme == "anthropic":
        url = base_url or ANTHROPIC_BASE_URL
        key = _key("anthropic", text, env, required=url == ANTHROPIC_BASE_URL)
        return Anthropic(model, base_url=url, api_key=key, transport=transport, **settings)
    if scheme == "openai" and base_url is not None:
        raise ModelURIError(
            f"{text!r}: for another server than OpenAI's write "
            f"openai-compatible:{model}@{base_url}",
            uri=text,
        )
    if scheme == "openai-compatible" and base_url is None:
        raise ModelURIError(
            f"{text!r} names no server: write openai-compatible:{model}@BASE_URL "
            "(e.g. @http://localhost:11434/v1)",
            uri=text,
        )
    url = base_url or OPENAI_BASE_URL
    key = _key("openai", text, env, required=url == OPENAI_BASE_URL)
    return OpenAICompatible(model, base_url=url, api_key=key, transport=transport, **settings)


def embedder_from_uri(
    uri: str,
    *,
    env: Mapping[str, str] | None = None,
    dim: int | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Embedder:
    """The embedder a URI names (`EMBEDDER_FORMS`) of `dim`, if known; raises ModelURIError for a
    bad URI or a missing key."""
    env = os.environ if env is None else env
    scheme, model, base_url, query, text = _split(uri, "embedder", EMBEDDER_FORMS,
                                                  EMBEDDER_SCHEMES)
    settings = _settings(text, query, EMBEDDER_SETTINGS if scheme == "openai" else ())
    if scheme in ("minilm", "e5-small-q4", "hash", "hash2") and base_url is not None:
        raise ModelURIError(f"the {scheme} embedder runs here, it takes no URL: {text!r}", uri=text)
    if scheme in ("minilm", "e5-small-q4"):
        if model:
            raise ModelURIError(f"the {scheme} embedder takes no model, got {text!r}", uri=text)
        from mnemo.adapters.e5 import E5SmallEmbedder
        from mnemo.adapters.minilm import MiniLMEmbedder

        return MiniLMEmbedder() if scheme == "minilm" else E5SmallEmbedder()
    from mnemo.adapters.hashing import HashEmbedder

    if scheme in ("hash", "hash2"):
        if not model:
            return HashEmbedder()
        if not model.isdigit() or int(model) < 1:
            raise ModelURIError(
                f"{scheme}:DIM needs a positive whole dimension, got {text!r}", uri=text
            )
        return HashEmbedder(int(model))
    from mnemo.adapters._model import OPENAI_BASE_URL
    from mnemo.adapters.embeddings import OpenAIEmbedder

    _need_model("embedder", scheme, model, text)
    url = base_url or OPENAI_BASE_URL
    key = _key("openai", text, env, required=url == OPENAI_BASE_URL)
    return OpenAIEmbedder(model, base_url=url, api_key=key, dim=dim, transport=transport,
                          **settings)
