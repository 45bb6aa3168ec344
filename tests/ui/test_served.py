"""The gate over a real connection: `mnemo ui`'s app served by uvicorn on 127.0.0.1, asked by
httpx and by a bare socket, as `curl -H 'Host: evil.example.com'` would ask it."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from mnemo.ui.guard import Access
from tests.ui._browser import running_server
from tests.ui.conftest import REPO, Sample

pytestmark = pytest.mark.slow  # a server in a thread, over real sockets

TOKEN = "served-token-0123456789"


@pytest.fixture(scope="module")
def base(sample_master: Sample) -> Iterator[str]:
    with running_server(sample_master.db) as url:
        yield url


def _raw(base: str, request: bytes) -> bytes:
    """The whole answer to `request`, sent as bytes on a new connection."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("path", ["/sessions", f"/graph?repo={REPO}", "/static/htmx.min.js"])
def test_a_foreign_host_header_gets_nothing_over_http(base: str, path: str) -> None:
    """The served app refuses a request whose Host is another name (400, no content), and
    answers the same request naming its own address."""
    refused = httpx.get(base + path, headers={"host": "evil.example.com"}, timeout=30)
    assert refused.status_code == 400
    assert "Tune postgres" not in refused.text
    assert "htmx" not in refused.text
    answered = httpx.get(base + path, timeout=30)
    assert answered.status_code == 200


def test_a_request_without_a_host_is_refused(base: str) -> None:
    """An HTTP/1.0 request with no Host header is refused, not served."""
    answer = _raw(base, b"GET /sessions HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400")
    assert b"Tune postgres" not in answer


def test_the_served_app_needs_its_token(sample_master: Sample) -> None:
    """With a token, the served app answers a client only with `Authorization: Bearer`."""
    with running_server(sample_master.db, access=Access(token=TOKEN)) as url:
        assert httpx.get(f"{url}/sessions", timeout=30).status_code == 401
        page = httpx.get(f"{url}/sessions", headers={"authorization": f"Bearer {TOKEN}"},
                         timeout=30)
    assert page.status_code == 200
    assert "Tune postgres" in page.text
