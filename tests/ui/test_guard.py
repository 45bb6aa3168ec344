"""The web app's gate through httpx against the ASGI app: foreign Host names refused (DNS
rebinding), the access token, POSTs only from the app's own pages (CSRF), and the headers
every answer carries. tests/ui/test_served.py and test_browser.py do the same over a real
server and in a real browser."""

from __future__ import annotations

import logging

import httpx
import pytest
from starlette.types import Message

import mnemo
from mnemo.access import check_token, host_pattern, is_loopback
from mnemo.ui.app import create_app
from mnemo.ui.guard import Access, Redaction, exposure, parse_host, redact
from mnemo.ui.source import MemorySource
from tests.ui.conftest import BASE, REPO, THREAD, client_of

TOKEN = "s3cret-token-0123456789"
PAGES = ["/", "/sessions", f"/graph?repo={REPO}", f"/history?repo={REPO}",
         f"/thread?id={THREAD}", "/static/style.css"]


@pytest.mark.parametrize("path", PAGES)
@pytest.mark.parametrize(
    "host",
    ["evil.example.com", "evil.example.com:8765", "127.0.0.1.evil.example.com",
     "localhost.evil.example.com", "127.0.0.1@evil.example.com", "[::1", "", "a b"],
)
async def test_a_foreign_host_is_refused_on_every_route(
    client: httpx.AsyncClient, path: str, host: str
) -> None:
    """A request naming a Host the app was not started for is a 400 that shows nothing of
    the memory, static files included."""
    page = await client.get(path, headers={"host": host})
    assert page.status_code == 400
    assert "only the host names" in page.text
    for content in ("Deploy the blog", "week/1", "Tune postgres", "ops<"):
        assert content not in page.text


@pytest.mark.parametrize(
    "host", ["127.0.0.1:8765", "localhost:8765", "[::1]:8765", "LOCALHOST", "127.0.0.1"]
)
async def test_the_loopback_names_are_answered(client: httpx.AsyncClient, host: str) -> None:
    """By default the app answers the loopback names, with any port."""
    page = await client.get("/sessions", headers={"host": host})
    assert page.status_code == 200
    assert "Tune postgres" in page.text


async def test_allowed_hosts_add_names_and_subdomains(memory: mnemo.Memory) -> None:
    """A server on every interface answers the loopback names and the allowed patterns; its
    own LAN address only when listed; a bound address is answered as itself."""
    access = Access.bound("0.0.0.0", ["Mnemo.LAN", "*.example.org", "[fd00::5]"])
    async with client_of(create_app(MemorySource(memory), access=access)) as c:
        for host, status in [("mnemo.lan:8765", 200), ("a.b.example.org", 200),
                             ("[fd00::5]:8765", 200), ("127.0.0.1", 200),
                             ("example.org", 400), ("evilexample.org", 400),
                             ("192.168.1.5:8765", 400)]:
            page = await c.get("/", headers={"host": host})
            assert page.status_code == status, host
    assert "192.168.1.5" in Access.bound("192.168.1.5").hosts
    assert Access.bound("::").hosts == ("127.0.0.1", "localhost", "::1")


def test_host_patterns_are_names_addresses_or_subdomain_wildcards() -> None:
    """--allow-host takes a name, an address or '*.domain', normalised; nothing with a
    scheme, a port, a path or a wildcard elsewhere."""
    assert host_pattern(" Mnemo.LAN ") == "mnemo.lan"
    assert host_pattern("[::1]") == "::1"
    assert host_pattern("FD00:0::5") == "fd00::5"
    assert host_pattern("*.Example.org") == "*.example.org"
    for bad in ("http://x.org", "x.org:80", "x.org/a", "*x.org", "a.*.org", "", "a b", "x..y"):
        with pytest.raises(mnemo.InvalidInputError):
            host_pattern(bad)


def test_answering_any_host_needs_a_token() -> None:
    """'*' turns the Host check off: refused without a token, accepted with one."""
    with pytest.raises(mnemo.InvalidInputError, match="token"):
        Access(("*",))
    assert Access(("*",), TOKEN).answers("anything.example.com")


def test_parse_host_reads_names_addresses_and_ports() -> None:
    """The Host header parser lowercases, unbrackets IPv6 and refuses what is not a host."""
    assert parse_host("LocalHost:8765") == ("localhost", 8765)
    assert parse_host("[0:0::1]") == ("::1", None)
    assert parse_host("example.com.") == ("example.com", None)
    for bad in (None, "", "a@b", "[zz::1]", "x:99999", "x:", "/x"):
        assert parse_host(bad) is None


def test_tokens_are_long_printable_and_bounded() -> None:
    """A token is 16 to 512 printable ASCII characters without spaces."""
    assert check_token(TOKEN) == TOKEN
    for bad in ("short", "x" * 513, "sixteen chars ok", "é" * 20):
        with pytest.raises(mnemo.InvalidInputError):
            check_token(bad)


@pytest.fixture
async def guarded(memory: mnemo.Memory) -> httpx.AsyncClient:
    return client_of(create_app(MemorySource(memory), access=Access(token=TOKEN)))


async def test_without_the_token_nothing_is_shown(guarded: httpx.AsyncClient) -> None:
    """With a token set, a request without it, or with another, is a 401 that shows
    nothing of the memory, static files included."""
    async with guarded as c:
        for path in PAGES:
            for headers in ({}, {"authorization": "Bearer wrong-token-0123456789"},
                            {"authorization": TOKEN}, {"cookie": f"mnemo_ui_8765={TOKEN}"}):
                page = await c.get(path, headers=headers)
                assert page.status_code == 401, (path, headers)
                assert page.headers["www-authenticate"] == "Bearer"
                assert "Tune postgres" not in page.text
        wrong = await c.get("/sessions", params={"token": "wrong-token-0123456789"})
        assert wrong.status_code == 401
        assert "token given is wrong" in wrong.text
        assert "set-cookie" not in wrong.headers


async def test_a_bearer_header_opens_every_page(guarded: httpx.AsyncClient) -> None:
    """`Authorization: Bearer TOKEN` is enough for a script."""
    async with guarded as c:
        page = await c.get("/sessions", headers={"authorization": f"Bearer {TOKEN}"})
    assert page.status_code == 200
    assert "Tune postgres" in page.text


async def test_the_token_in_an_address_sets_a_cookie_and_leaves_the_address(
    guarded: httpx.AsyncClient,
) -> None:
    """?token= once: a 303 to the same address without it, and an HttpOnly, SameSite cookie
    holding a digest (not the token) that opens the pages from then on."""
    async with guarded as c:
        hop = await c.get("/thread", params={"id": THREAD, "token": TOKEN, "budget": "300"})
        assert hop.status_code == 303
        assert hop.headers["location"] == "/thread?id=week%2F1&budget=300"
        cookie = hop.headers["set-cookie"]
        assert cookie.startswith("mnemo_ui_8765=")
        assert "HttpOnly" in cookie
        assert "SameSite=lax" in cookie
        assert TOKEN not in cookie
        page = await c.get(hop.headers["location"])
        assert page.status_code == 200
        assert "Viewport boundary" in page.text
        c.cookies.clear()
        assert (await c.get("/sessions")).status_code == 401


async def test_the_token_page_escapes_the_address(guarded: httpx.AsyncClient) -> None:
    """The 401 page's form names the requested path without letting it into the HTML."""
    async with guarded as c:
        page = await c.get('/"><script>alert(1)</script>')
    assert page.status_code == 401
    assert "<script>" not in page.text


async def test_a_post_needs_the_apps_own_origin(
    writer: httpx.AsyncClient, memory: mnemo.Memory
) -> None:
    """A POST without an Origin, from another site, from another port of this host or from
    an opaque origin is refused (403) and counts nothing; from the app's origin it runs."""
    form = {"repo": REPO, "q": "gunicorn port"}
    for origin in (None, "http://evil.example.com", "http://127.0.0.1:9999",
                   "https://127.0.0.1:8765", "null", "http://127.0.0.1:8765/x"):
        headers = {"origin": origin} if origin else {}
        if origin is None:
            del writer.headers["origin"]
        page = await writer.post("/recall", data=form, headers=headers)
        assert page.status_code == 403, origin
        writer.headers["origin"] = BASE
    facts = await memory.get_nodes_by_type(REPO, [mnemo.NodeType.SEMANTIC])
    stats = await memory._graph.access_stats(REPO, [f.id for f in facts])
    assert all(count == 0 for count, _ in stats.values())
    page = await writer.post("/recall", data=form)
    assert page.status_code == 200
    assert "counted as accesses" in page.text


async def test_every_answer_carries_the_security_headers(client: httpx.AsyncClient) -> None:
    """Pages, refusals and static files forbid framing and foreign scripts; pages and
    refusals are not cached, the app's own static files may be."""
    for path, host in (("/", "127.0.0.1"), ("/", "evil.example.com"),
                       ("/static/htmx.min.js", "127.0.0.1")):
        page = await client.get(path, headers={"host": host})
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["referrer-policy"] == "same-origin"
        assert (page.headers.get("cache-control") == "no-store") == (path == "/")


def test_a_bind_beyond_the_loopback_is_warned_about() -> None:
    """A loopback bind warns of nothing; every interface or a LAN address warns that the
    memory is exposed, louder without a token; '*' warns too."""
    assert exposure("127.0.0.1", Access.bound("127.0.0.1")) == []
    assert exposure("localhost", Access.bound("localhost")) == []
    assert exposure("::1", Access.bound("::1")) == []
    bare = " ".join(exposure("0.0.0.0", Access.bound("0.0.0.0")))
    assert "every interface" in bare
    assert "No access token" in bare
    assert "--allow-host" in bare
    tokened = " ".join(exposure("192.168.1.5", Access.bound("192.168.1.5", token=TOKEN)))
    assert "192.168.1.5" in tokened
    assert "No access token" not in tokened
    anyone = " ".join(exposure("127.0.0.1", Access.bound("127.0.0.1", ["*"], TOKEN)))
    assert "Any Host" in anyone
    assert is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0")


def test_tokens_in_addresses_stay_out_of_the_log() -> None:
    """The access log's filter hides each token= value, and only it."""
    assert redact("/a?token=abc&x=1") == "/a?token=[hidden]&x=1"
    assert redact("/a?x=1&token=abc") == "/a?x=1&token=[hidden]"
    assert redact("/a?mytoken=abc") == "/a?mytoken=abc"
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", f"/sessions?token={TOKEN}", "1.1", 303), None,
    )
    assert Redaction().filter(record)
    assert TOKEN not in record.getMessage()
    assert "token=[hidden]" in record.getMessage()


async def test_a_websocket_is_closed_at_the_gate(memory: mnemo.Memory) -> None:
    """The app serves no websocket: the gate closes one before any route sees it."""
    app = create_app(MemorySource(memory))
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "websocket.connect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "websocket", "path": "/", "headers": [(b"host", b"127.0.0.1")],
             "query_string": b"", "root_path": "", "app": app}
    await app(scope, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1008}]
