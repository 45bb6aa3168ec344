"""Screenshots of `mnemo ui` for the README (docs/img/ui-*.png).

Fills a fresh memory with the demo's conversation (a week of an assistant's work, offline) and
leaves those sessions idle, adds a live session
and a thread with an eviction, serves the web app on 127.0.0.1 and captures a few pages with
the system's headless Chromium (apt: chromium, chromium-driver; pip: selenium).

    python scripts/ui_screenshots.py [--out docs/img]
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import threading
from pathlib import Path

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


async def fill(db: Path) -> None:
    conversation = load_conversation(default_data())
    async with mnemo.Memory(db) as mem:
        await mem.open_repo(DEFAULT_REPO)
        for script in conversation.sessions:
            done = await mem.start_session(script.goal, repo=DEFAULT_REPO)
            for observation, action in script.steps:
                await mem.append(done, observation, action)
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


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


def capture(db: Path, out: Path) -> None:
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
    try:
        out.mkdir(parents=True, exist_ok=True)
        driver.get(f"{base}/graph?repo={DEFAULT_REPO}")
        driver.save_screenshot(str(out / "ui-graph.png"))
        fact = driver.find_element(By.CSS_SELECTOR, "#nodes a.node-link")
        fact.click()
        wait.until(ec.presence_of_element_located((By.ID, "provenance")))
        driver.save_screenshot(str(out / "ui-node.png"))
        driver.get(f"{base}/recall?repo={DEFAULT_REPO}")
        driver.find_element(By.CSS_SELECTOR, "#recall input[name=q]").send_keys(
            "which port does gunicorn listen on?")
        driver.find_element(By.CSS_SELECTOR, "#recall button").click()
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#recalled tr.hit")))
        driver.save_screenshot(str(out / "ui-recall.png"))
        driver.get(f"{base}/sessions")
        driver.find_element(By.CSS_SELECTOR, "a.session").click()
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "tr.step")))
        driver.save_screenshot(str(out / "ui-session.png"))
        driver.get(f"{base}/thread?id={THREAD}&budget=260")
        driver.save_screenshot(str(out / "ui-thread.png"))
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
        anyio.run(fill, db)
        capture(db, args.out)
    for png in sorted(args.out.glob("ui-*.png")):
        print(f"{png}: {png.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
