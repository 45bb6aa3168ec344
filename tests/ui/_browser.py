"""A real server and a real browser for the web app's tests: uvicorn on 127.0.0.1 in a thread
of its own, and the system's Chromium driven by selenium. The browser resolves the names in
FOREIGN to 127.0.0.1, as a rebinding attacker's DNS would: a page there is another site that
reaches the app's address."""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from mnemo.ui import open_view
from mnemo.ui.app import create_app
from mnemo.ui.guard import Access

FOREIGN = ("evil.example.com", "attacker.example.net")
CHROMIUM_FLAGS = (
    "--host-resolver-rules=" + ", ".join(f"MAP {name} 127.0.0.1" for name in FOREIGN),
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1100,800",
)
BINARIES = ("chromium", "chromium-browser", "google-chrome")
DRIVERS = ("chromedriver", "/usr/lib/chromium/chromedriver")
WHY_SKIPPED = (
    "no Chromium with chromedriver on this machine: scripts/test installs the chromium and "
    "chromium-driver packages when it runs as root on a system with apt-get"
)


def chromium() -> tuple[str, str] | None:
    """The paths of the system's Chromium and its driver, None when either is missing."""
    binary = next((p for b in BINARIES if (p := shutil.which(b))), None)
    driver = next((p for d in DRIVERS if (p := shutil.which(d))), None)
    return (binary, driver) if binary and driver else None


class _Server(uvicorn.Server):
    """A uvicorn server that says when it listens (its app's startup done)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


@contextmanager
def serving(app: Any, sock: socket.socket | None = None) -> Iterator[str]:
    """An ASGI app served by uvicorn on a free port of 127.0.0.1 (or on `sock`); yields its
    base URL."""
    if sock is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = _Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        # Opening the memory loads the embedder: allow for a slow machine.
        assert server.ready.wait(60), "the server did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@contextmanager
def running_server(
    db: Path, *, allow_writes: bool = False, access: Access | None = None
) -> Iterator[str]:
    """`mnemo ui`'s app over `db`, served on a free port of 127.0.0.1; yields its base URL."""
    app = create_app(
        open_view=lambda: open_view(db, allow_writes=allow_writes),
        allow_writes=allow_writes,
        access=access,
    )
    with serving(app) as base:
        yield base


def viewport(driver: Any, width: int, height: int) -> None:
    """Makes the page's viewport `width` x `height`; below 600 a phone's (mobile)."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600})


@contextmanager
def browser(tmp: Path) -> Iterator[Any]:
    """A headless Chromium under selenium, with a fresh profile; skips without one."""
    webdriver = pytest.importorskip("selenium.webdriver")
    found = chromium()
    if found is None:
        pytest.skip(WHY_SKIPPED)
    binary, driver_path = found
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp / 'chromium-profile'}")
    # The console, for the tests that check no page breaks its Content-Security-Policy.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: selenium-manager would try to download one.
    service = webdriver.ChromeService(executable_path=driver_path)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()
