"""Screenshots of `mnemo ui` for the README (docs/img/ui-*.png), at a desktop width and at a
phone's (docs/img/ui-phone-*.png).

Fills a fresh memory with the demo's conversation (a week of an assistant's work, offline) and
leaves those sessions idle, adds a live session and a thread with an eviction, serves the web
app on 127.0.0.1 and captures its pages with the system's headless Chromium (apt: chromium,
chromium-driver; pip: selenium). A shot is as tall as its page, up to MAX_HEIGHT.

    python scripts/ui_screenshots.py [--out docs/img]
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import threading
from pathlib import Path
from urllib.parse import quote

import anyio
import uvicorn
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.wait import WebDriverWait

import mnemo
from mnemo.cli.demo import DEFAULT_REPO, default_data, load_conversation
from mnemo.ui import open_view
from mnemo.ui.app import create_app

THREAD = "support/42"
CHAT = [
    ("user", "Never run a migration on a Friday: the release train leaves on Fridays."),
    ("user", "Our staging database is orders_stage on db-2; production is orders on db-1."),
    ("assistant", "Noted: staging is orders_stage on db-2, production orders on db-1."),
    ("user", "The migration adds a NOT NULL column shipped_at to orders."),
    ("assistant", "Then it needs a default or a backfill before the constraint."),
    ("user", "Backfill from the shipments table, in batches of 10,000 rows."),
    ("assistant", "I'll write the backfill as a loop over id ranges of 10,000."),
    ("user", "Run it on orders_stage first and time it."),
    ("assistant", "On orders_stage the backfill took 4 minutes for 2.1 million rows."),
    ("user", "Good. Schedule production for Tuesday 06:00, never on a Friday."),
    ("assistant", "Scheduled for Tuesday 06:00 UTC with a rollback script ready."),
    ("user", "Also page Dana if the lock wait passes 5 seconds."),
    ("assistant", "Added an alert: lock wait above 5 s pages Dana."),
    ("user", "What did we decide about the shipped_at default?"),
    ("assistant", "No default: the backfill fills it, then the NOT NULL constraint is added."),
]


DESKTOP = (1100, 760)
PHONE = (390, 844)
MAX_HEIGHT = 1500


async def fill(db: Path) -> str:
    """Fills `db`; returns the id of the fact with the most links (at most 14), the one whose
    neighbourhood is drawn."""
    conversation = load_conversation(default_data())
    async with mnemo.Memory(db) as mem:
        await mem.open_repo(DEFAULT_REPO)
        for script in conversation.sessions:
            done = await mem.start_session(script.goal, repo=DEFAULT_REPO)
            for step in script.steps:
                await mem.append(done, step.observation, step.action)
            # A generous wait: the offline extraction of a long session takes seconds.
            await mem.close_and_commit(done, max_polls=2400)
        sid = await mem.start_session("Prepare the orders migration", repo=DEFAULT_REPO)
        await mem.append(sid, "The migration adds a NOT NULL column shipped_at to orders.",
                         "Write a batched backfill from the shipments table.")
        await mem.append(sid, "The backfill took 4 minutes on orders_stage.",
                         "Schedule production for Tuesday 06:00 UTC.")
        await mem.conversation().save(THREAD, [{"role": r, "content": c} for r, c in CHAT])
        await mem.add_goal(THREAD, "Run the orders migration on Tuesday")
        await mem.evict(THREAD, token_budget=260)
        best, most = "", -1
        for fact in await mem.get_nodes_by_type(DEFAULT_REPO, [mnemo.NodeType.SEMANTIC]):
            linked = len(await mem.get_linked_nodes(DEFAULT_REPO, [fact.id]))
            if most < linked <= 14:
                best, most = fact.id, linked
        return best


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


def shoot(driver: webdriver.Chrome, url: str, png: Path, size: tuple[int, int]) -> None:
    """`url` at a viewport of `size` (a phone's is a mobile one), as tall as the page, with
    a commit's links unfolded."""
    width, height = size
    mobile = width < 600
    metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    driver.get(url)
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script("return document.readyState") == "complete")
    driver.execute_script("const links = document.querySelector('#links details');"
                          "if (links) links.open = true;")
    full = driver.execute_script("return document.documentElement.scrollHeight")
    metrics["height"] = max(height, min(int(full), MAX_HEIGHT))
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    # The page painted at its new height: a large SVG was shot half drawn otherwise.
    driver.execute_async_script(
        "requestAnimationFrame(() => requestAnimationFrame(arguments[0]))")
    driver.save_screenshot(str(png))


def capture(db: Path, fact: str, out: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = Server(uvicorn.Config(create_app(open_view=lambda: open_view(db)),
                                   log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    if not server.ready.wait(60):
        raise SystemExit("the server did not start")
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1100,760",
                 "--hide-scrollbars", f"--user-data-dir={tempfile.mkdtemp()}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(
        options=options, service=webdriver.ChromeService(executable_path="/usr/bin/chromedriver")
    )
    wait = WebDriverWait(driver, 30)
    repo = quote(DEFAULT_REPO)
    try:
        out.mkdir(parents=True, exist_ok=True)
        driver.get(f"{base}/history?repo={repo}")
        commits = driver.find_elements(By.CSS_SELECTOR, "a.commit-link")
        # The oldest commit: the first session of the week.
        commit = commits[-1].get_attribute("href")
        node = f"{base}/node?repo={repo}&id={quote(fact)}"
        pages = {
            "graph": f"{base}/graph?repo={repo}",
            "graph-focus": f"{base}/graph?repo={repo}&focus={quote(fact)}",
            "node": node,
            "history": f"{base}/history?repo={repo}",
            "commit": commit,
            "session": None,
            "thread": f"{base}/thread?id={quote(THREAD, safe='')}&budget=260",
        }
        driver.get(f"{base}/sessions")
        pages["session"] = driver.find_element(By.CSS_SELECTOR, "a.session").get_attribute(
            "href")
        for name, url in pages.items():
            assert url is not None
            shoot(driver, url, out / f"ui-{name}.png", DESKTOP)
        for name in ("graph", "node", "history", "commit"):
            url = pages[name]
            assert url is not None
            shoot(driver, url, out / f"ui-phone-{name}.png", PHONE)
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": DESKTOP[0], "height": DESKTOP[1],
                                "deviceScaleFactor": 1, "mobile": False})
        driver.get(f"{base}/recall?repo={repo}")
        driver.find_element(By.CSS_SELECTOR, "#recall input[name=q]").send_keys(
            "which port does gunicorn listen on?")
        driver.find_element(By.CSS_SELECTOR, "#recall button").click()
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#recalled tr.hit")))
        driver.save_screenshot(str(out / "ui-recall.png"))
    finally:
        driver.quit()
        server.should_exit = True
        thread.join(30)
        sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "ui.db"
        fact = anyio.run(fill, db)
        capture(db, fact, args.out)
    for png in sorted(args.out.glob("ui-*.png")):
        print(f"{png}: {png.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
