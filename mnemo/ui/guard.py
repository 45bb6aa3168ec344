"""The web app's gate (`Gate`, one ASGI middleware before every route): the Host names it
answers (400 otherwise, against DNS rebinding), an optional access token (a bearer header, a
cookie, or `?token=` once), no write from another origin (403), and headers that keep pages
out of frames, caches and other sites."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from html import escape
from typing import NamedTuple
from urllib.parse import parse_qsl, quote, urlencode

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import cookie_parser
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mnemo.access import (
    LOOPBACK,
    WILDCARD_BINDS,
    check_token,
    host_pattern,
    hosts_of,
    is_loopback,
    same_token,
)
from mnemo.errors import InvalidInputError

TOKEN_PARAM = "token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
STATIC_PREFIX = "/static/"
# A Host header: a name or an IPv4 address, or a bracketed IPv6 address, then an optional port.
_HOST = re.compile(r"(?P<name>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?")
_COOKIE_KEY = b"mnemo ui cookie"
_DEFAULT_PORTS = {"http": 80, "https": 443}
SECURITY_HEADERS = (
    (
        "content-security-policy",
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"),
    ("x-frame-options", "DENY"),
    ("x-content-type-options", "nosniff"),
    # Not "no-referrer": with it a browser sends `Origin: null` on a same-origin form POST.
    ("referrer-policy", "same-origin"))


class Host(NamedTuple):
    """A parsed Host header: the lowercased name (an IPv6 address compressed, unbracketed) and
    the port (None when absent)."""

    name: str
    port: int | None


def parse_host(header: str | None) -> Host | None:
    """The Host header's name and port, None for a missing or malformed header."""
    match = _HOST.fullmatch((header or "").strip())
    if match is None:
        return None
    name = match["name"].lower().rstrip(".")
    if name.startswith("["):
        try:
            name = ipaddress.IPv6Address(name[1:-1]).compressed
        except ValueError:
            return None
    port = int(match["port"]) if match["port"] else None
    if port is not None and not 0 < port < 65536:
        return None
    return Host(name, port) if name else None


@dataclass(frozen=True, slots=True)
class Access:
    """Who the app answers: requests whose Host matches one of `hosts` and, with `token`, show it;
    InvalidInputError for a malformed pattern or token, or `*` without a token."""

    hosts: tuple[str, ...] = LOOPBACK
    token: str | None = None

    def __post_init__(self) -> None:
        hosts = tuple(dict.fromkeys(host_pattern(h) for h in self.hosts))
        if not hosts:
            raise InvalidInputError("the web app needs at least one allowed host")
        if "*" in hosts and self.token is None:
            raise InvalidInputError(
                "allowing any host ('*') turns the Host check off: it needs an access token")
        if self.token is not None:
            check_token(self.token)
        object.__setattr__(self, "hosts", hosts)

    @classmethod
    def bound(cls, bind: str, allow: Iterable[str] = (), token: str | None = None) -> Access:
        """The access of a server listening on `bind` (`mnemo.access.hosts_of`)."""
        return cls(hosts_of(bind, allow), token)

    def answers(self, name: str) -> bool:
        """Whether a request with this Host name (as `parse_host` gives it) is served."""
        return any(p in ("*", name) or (p.startswith("*.") and name.endswith(p[1:]))
                   for p in self.hosts)

    def cookie_value(self) -> str:
        """What the access cookie holds: an HMAC of the token (never the token itself)."""
        assert self.token is not None
        return hmac.new(self.token.encode(), _COOKIE_KEY, hashlib.sha256).hexdigest()


def exposure(bind: str, access: Access) -> list[str]:
    """Warnings for the operator about who can reach a server on `bind` with `access`: none
    for a loopback bind with the Host check on."""
    lines = []
    if not is_loopback(bind):
        where = "every interface" if bind.strip() in WILDCARD_BINDS else bind
        lines.append(
            f"mnemo ui listens on {where}: any machine that can reach this one can read the "
            "whole memory through it.")
        if access.token is None:
            lines.append(
                "No access token is set: anyone who connects sees everything. Set "
                "MNEMO_UI_TOKEN (or --token) to require one.")
        lines.append(
            "Host names answered: " + ", ".join(access.hosts)
            + " (add the names clients use with --allow-host).")
    if "*" in access.hosts:
        lines.append("Any Host is answered ('*'): only the access token keeps other sites out.")
    return lines


def redact(text: str) -> str:
    """`text` (an address, a log line) with the value of every `token=` parameter hidden."""
    return re.sub(r"(?<=[?&]token=)[^&\s\"]*", "[hidden]", text)


class Redaction(logging.Filter):
    """A logging filter that hides `token=` values in a record's message and arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True


class Gate:
    """The ASGI middleware that applies an `Access` (see the module's docstring)."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            # The app serves none; closed here, no check can be missed on one added later.
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope, Headers(scope=scope))
        cached = refusal is None and scope["path"].startswith(STATIC_PREFIX)
        await (refusal or self.app)(scope, receive, _with_security_headers(send, cached=cached))

    def _refusal(self, scope: Scope, headers: Headers) -> Response | None:
        host = parse_host(headers.get("host"))
        if host is None or not self.access.answers(host.name):
            return PlainTextResponse(
                "mnemo ui answers only the host names it was started for (--allow-host); "
                "this request named another one.\n",
                status_code=400)
        method = scope["method"]
        if self.access.token is not None:
            refusal = self._token_refusal(scope, headers, host, method)
            if refusal is not None:
                return refusal
        if method not in SAFE_METHODS and not _same_origin(
            headers.get("origin"), scope.get("scheme", "http"), host):
            return PlainTextResponse(
                "mnemo ui takes a change only from its own pages: this request's Origin "
                "header is missing or names another site.\n",
                status_code=403)
        return None

    def _token_refusal(self, scope: Scope, headers: Headers, host: Host,
                       method: str) -> Response | None:
        assert self.access.token is not None
        cookie = f"mnemo_ui_{host.port or _DEFAULT_PORTS.get(scope.get('scheme', 'http'), 0)}"
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                          keep_blank_values=True)
        offered = [v for k, v in query if k == TOKEN_PARAM]
        if offered and method in ("GET", "HEAD"):
            if not same_token(offered[-1], self.access.token):
                return _ask_for_token(scope["path"], wrong=True)
            rest = urlencode([(k, v) for k, v in query if k != TOKEN_PARAM])
            target = quote(scope.get("root_path", "") + scope["path"])
            target += f"?{rest}" if rest else ""
            response = RedirectResponse(target, status_code=303)
            response.set_cookie(
                cookie, self.access.cookie_value(), httponly=True, samesite="lax", path="/")
            return response
        scheme, _, credentials = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and same_token(credentials.strip(), self.access.token):
            return None
        held = cookie_parser("; ".join(headers.getlist("cookie"))).get(cookie)
        if held is not None and same_token(held, self.access.cookie_value()):
            return None
        return _ask_for_token(scope["path"], wrong=False)


def _same_origin(origin: str | None, scheme: str, host: Host) -> bool:
    """Whether the Origin header names this server, as the Host header does."""
    given, sep, rest = (origin or "").partition("://")
    named = parse_host(rest.removesuffix("/")) if sep and given == scheme else None
    default = _DEFAULT_PORTS.get(scheme)
    return (named is not None and named.name == host.name
            and (named.port or default) == (host.port or default))


def _ask_for_token(path: str, *, wrong: bool) -> Response:
    said = "The token given is wrong." if wrong else "This mnemo ui needs its access token."
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>Access token · mnemo</title></head><body>"
        f"<h1>Access token</h1><p>{escape(said)} Open the address with "
        "<code>?token=…</code> once, or enter the token:</p>"
        f'<form method="get" action="{escape(quote(path))}"><label>token '
        '<input type="password" name="token" autocomplete="off" required></label> '
        '<button type="submit">Open</button></form></body></html>')
    return HTMLResponse(page, status_code=401, headers={"www-authenticate": "Bearer"})


def _with_security_headers(send: Send, *, cached: bool) -> Send:
    """`send`, adding the security headers to the response; `no-store` unless `cached` (the
    app's own static files hold nothing of the memory)."""
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            for name, value in SECURITY_HEADERS:
                headers.setdefault(name, value)
            if not cached:
                headers.setdefault("cache-control", "no-store")
        await send(message)

    return sending
