"""`Pool`: the network under mnemo's `httpx.AsyncClient`: requests go over aiohttp's keep-alive
connections, replies are read whole, aiohttp's errors become httpx's. aiohttp is imported, and
its session made, on the first request."""

from __future__ import annotations

import functools
import ssl
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    import aiohttp


@functools.cache
def _verified() -> ssl.SSLContext:
    """httpx's verifying TLS context, made once a process: loading the CA bundle takes tens of
    milliseconds, and every Pool verifies alike."""
    return httpx.create_ssl_context()


class Pool(httpx.AsyncBaseTransport):
    """An httpx transport over aiohttp: at most `max_connections` connections, https verified as
    httpx does."""

    def __init__(self, *, max_connections: int | None = None) -> None:
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        # HTTP(S)_PROXY and ALL_PROXY, read once as httpx reads them (it honours them only without
        # a transport of its own); NO_PROXY is checked per host; aiohttp speaks no socks://.
        self._proxies = {scheme: url for scheme, url in urllib.request.getproxies().items()
                         if scheme in ("http", "https", "all")
                         and url.startswith(("http://", "https://"))}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        import aiohttp

        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections or 0,
                limit_per_host=0,
                keepalive_timeout=5.0,  # httpx's default for an idle connection
                ssl=_verified(),
            )
            # No cookie jar nor default headers: httpx keeps the cookies and sends the headers.
            # No trust_env: aiohttp would read ~/.netrc on a thread for every request.
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False, skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        session = self._session
        timeout = request.extensions.get("timeout", {})
        body = await request.aread()
        with _as_httpx(request):
            async with session.request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=body or None,
                allow_redirects=False,
                compress=None,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=timeout.get("pool"),
                    sock_connect=timeout.get("connect"),
                    sock_read=timeout.get("read"),
                ),
                server_hostname=request.extensions.get("sni_hostname"),
                proxy=self._proxy_for(request.url),
            ) as response:
                content = await response.read()
        version = response.version or aiohttp.HttpVersion11
        return httpx.Response(
            response.status,
            headers=list(response.raw_headers),
            stream=httpx.ByteStream(content),
            extensions={
                "http_version": f"HTTP/{version.major}.{version.minor}".encode(),
                "reason_phrase": (response.reason or "").encode(),
            },
        )

    def _proxy_for(self, url: httpx.URL) -> str | None:
        proxy = self._proxies.get(url.scheme) or self._proxies.get("all")
        return None if proxy is None or urllib.request.proxy_bypass(url.host) else proxy

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


@contextmanager
def _as_httpx(request: httpx.Request) -> Iterator[None]:
    import aiohttp

    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:
        raise httpx.ConnectTimeout(str(exc) or "connect timed out", request=request) from exc
    except aiohttp.ServerTimeoutError as exc:
        raise httpx.ReadTimeout(str(exc) or "read timed out", request=request) from exc
    except aiohttp.ClientConnectorError as exc:
        raise httpx.ConnectError(str(exc), request=request) from exc
    except (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError) as exc:
        raise httpx.UnsupportedProtocol(str(exc), request=request) from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError,
            aiohttp.ClientResponseError) as exc:
        raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__, request=request) from exc
    except aiohttp.ClientError as exc:
        raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from exc
