"""Who a server on this machine answers (`mnemo ui`, `mnemo mcp --http`): loopback names,
wildcard binds, allowed hosts, and the access token rule."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterable

from mnemo.errors import InvalidInputError

# The names a loopback client uses (no web page can make a browser send one for its own name).
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Addresses that bind every interface: the bound address names no host to answer.
WILDCARD_BINDS = ("0.0.0.0", "::", "")
# A shorter token is guessable over the loopback.
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 512
_HOST_PATTERN = re.compile(r"(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?")


def host_pattern(value: str) -> str:
    """`value` as an allowed-host pattern (a host, an IP address, `*.domain` or `*`), lowercased;
    InvalidInputError for anything else."""
    if not isinstance(value, str):
        raise InvalidInputError(f"an allowed host must be a string, got {type(value).__name__}")
    pattern = value.strip().lower()
    if pattern == "*":
        return pattern
    bare = pattern[1:-1] if pattern.startswith("[") and pattern.endswith("]") else pattern
    try:
        return ipaddress.ip_address(bare).compressed
    except ValueError:
        pass
    if len(pattern) > 253 or not _HOST_PATTERN.fullmatch(pattern):
        raise InvalidInputError(
            f"{value!r} is not a host name, an IP address, '*.domain' or '*' (no scheme, "
            "port or path)")
    return pattern.rstrip(".")


def check_token(token: str) -> str:
    """`token`, checked to be printable ASCII without spaces within `MIN_TOKEN_CHARS` and
    `MAX_TOKEN_CHARS` (InvalidInputError)."""
    if not isinstance(token, str):
        raise InvalidInputError(f"the access token must be a string, got {type(token).__name__}")
    if not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS:
        raise InvalidInputError(
            f"the access token must have {MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS} characters, "
            f"got {len(token)} (make one with: python -c \"import secrets; "
            "print(secrets.token_urlsafe())\")")
    if not all("!" <= c <= "~" for c in token):
        raise InvalidInputError("the access token must be printable ASCII without spaces")
    return token


def hosts_of(bind: str, allow: Iterable[str]) -> tuple[str, ...]:
    """The host patterns a server on `bind` answers: the loopback names, the bound address and
    `allow`, each once."""
    own = () if bind.strip() in WILDCARD_BINDS else (bind.strip(),)
    return tuple(dict.fromkeys(host_pattern(h) for h in (*LOOPBACK, *own, *allow)))


def same_token(given: str, expected: str) -> bool:
    """Whether two texts are equal, in constant time (their SHA-256 digests compared)."""
    return hmac.compare_digest(hashlib.sha256(given.encode(errors="replace")).digest(),
                               hashlib.sha256(expected.encode(errors="replace")).digest())


def is_loopback(bind: str) -> bool:
    """Whether `bind` (an address or a name to listen on) reaches this machine only."""
    if bind.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        return False
