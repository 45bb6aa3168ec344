"""The web app in a real browser: `mnemo ui`'s app served by uvicorn on 127.0.0.1, driven by
headless Chromium through selenium: navigation, htmx, a rebinding name and a cross-site form
refused, the token's cookie, and every page at a phone's and a desktop's width. Skipped,
saying why, where no Chromium is installed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

import mnemo
from mnemo.ui.guard import Access
from tests.ui._browser import browser, running_server, serving, viewport
from tests.ui.conftest import REPO, THREAD, Sample

pytest.importorskip("selenium")

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.wait import WebDriverWait

pytestmark = pytest.mark.slow  # selenium starts chromedriver

WAIT = 30
TOKEN = "browser-token-0123456789"
PHONE = (390, 844)
DESKTOP = (1100, 800)


@pytest.fixture(scope="module")
def site(
    sample_master: Sample, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, str]]:
    """One server and one browser for the module: starting Chromium takes seconds, and no
    page writes (tests/ui/test_app.py checks that)."""
    with browser(tmp_path_factory.mktemp("browser")) as driver, \
            running_server(sample_master.db) as base:
        yield driver, base


def _until(driver: Any, condition: Any) -> Any:
    return WebDriverWait(driver, WAIT).until(condition)


def test_links_lead_from_the_repos_to_a_fact_its_steps_and_their_session(
    site: tuple[Any, str], sample_master: Sample
) -> None:
    """Clicking through: repo -> graph -> a fact -> its provenance step -> the session."""
    driver, base = site
    driver.get(base + "/")
    assert driver.title == "Repos · mnemo"
    driver.find_element(By.CSS_SELECTOR, "a.repo").click()
    _until(driver, ec.title_is(f"Graph of {REPO} · mnemo"))
    facts = driver.find_elements(By.CSS_SELECTOR, "#nodes a.node-link")
    fact = next(a for a in facts if "gunicorn" in a.text)
    fact.click()
    _until(driver, ec.title_is("semantic node · mnemo"))
    assert "nginx returns 502" in driver.find_element(By.ID, "provenance").text
    driver.find_element(By.CSS_SELECTOR, "#provenance a.step-session").click()
    _until(driver, ec.title_is(f"Session {sample_master.committed_session} · mnemo"))
    assert driver.current_url.split("#")[1].startswith("step-")
    assert len(driver.find_elements(By.CSS_SELECTOR, "tr.step")) == 2


def test_sessions_and_threads_pages_render(site: tuple[Any, str]) -> None:
    """The nav leads to sessions (with states) and threads (boundary, snapshot, messages)."""
    driver, base = site
    driver.get(base + "/")
    driver.find_element(By.ID, "nav-sessions").click()
    _until(driver, ec.title_is("Sessions · mnemo"))
    assert "collecting" in driver.find_element(By.ID, "sessions").text
    driver.find_element(By.ID, "nav-threads").click()
    _until(driver, ec.title_is("Threads · mnemo"))
    driver.find_element(By.CSS_SELECTOR, "a.thread").click()
    _until(driver, ec.title_is(f"Thread {THREAD} · mnemo"))
    assert "Viewport boundary at seq" in driver.find_element(By.ID, "boundary").text
    assert driver.find_elements(By.CSS_SELECTOR, "#snapshots li b")
    assert len(driver.find_elements(By.CSS_SELECTOR, "li.message")) == 24


def test_recall_playground_swaps_in_results_without_a_page_load(site: tuple[Any, str]) -> None:
    """A recall query returns scored results into the page through htmx (no navigation)."""
    driver, base = site
    driver.get(f"{base}/recall?repo={REPO}")
    _until(driver, lambda d: d.execute_script("return window.htmx !== undefined"))
    driver.execute_script("window.stillHere = true")
    box = driver.find_element(By.CSS_SELECTOR, "#recall input[name=q]")
    box.send_keys("which port does gunicorn use?")
    driver.find_element(By.CSS_SELECTOR, "#recall button").click()
    _until(driver, ec.presence_of_element_located((By.CSS_SELECTOR, "#recalled tr.hit")))
    assert driver.execute_script("return window.stillHere") is True
    rows = driver.find_elements(By.CSS_SELECTOR, "#recalled tr.hit")
    first = rows[0]
    assert float(first.find_element(By.CSS_SELECTOR, ".score").text) > 0
    assert first.find_element(By.CSS_SELECTOR, ".phase").text
    assert first.find_element(By.CSS_SELECTOR, ".hop").text.isdigit()
    assert any("gunicorn" in row.text for row in rows)
    assert "q=which%20port" in driver.current_url  # pushed: the result has an address


def test_graph_search_swaps_in_matching_nodes(site: tuple[Any, str]) -> None:
    """The graph page's search lists matching nodes in place; a result opens its node."""
    driver, base = site
    driver.get(f"{base}/graph?repo={REPO}")
    _until(driver, lambda d: d.execute_script("return window.htmx !== undefined"))
    driver.find_element(By.CSS_SELECTOR, "#search input[name=q]").send_keys("certbot")
    driver.find_element(By.CSS_SELECTOR, "#search button").click()
    _until(driver, ec.presence_of_element_located((By.CSS_SELECTOR, "#results a.node-link")))
    hit = driver.find_element(By.CSS_SELECTOR, "#results a.node-link")
    assert "certbot" in hit.text.lower()
    hit.click()
    _until(driver, ec.presence_of_element_located((By.ID, "node-text")))
    assert "certbot" in driver.find_element(By.ID, "node-text").text.lower()


def test_the_graph_page_draws_a_picture_whose_nodes_open_their_pages(
    site: tuple[Any, str], tmp_path: Path
) -> None:
    """Chromium draws the graph page's SVG: a marker and a link per node, lines between
    them, every marker inside the picture and of a colour of its own type; a node opens its
    page, whose "see it in the graph" draws the part around it, the node standing out."""
    driver, base = site
    driver.get(f"{base}/graph?repo={REPO}")
    svg = driver.find_element(By.ID, "graph-picture")
    assert svg.is_displayed()
    assert svg.size["width"] > 600
    spots = svg.find_elements(By.CSS_SELECTOR, "a.spot")
    assert len(spots) == len(svg.find_elements(By.CSS_SELECTOR, "a.spot path.mark")) > 10
    assert len(svg.find_elements(By.CSS_SELECTOR, "path.line")) > 10
    outside, colours = driver.execute_script(
        "const svg = arguments[0]; const box = svg.viewBox.baseVal; const colours = {};"
        "const outside = [...svg.querySelectorAll('path.mark')].filter(m => {"
        "  const b = m.getBBox(); const kind = [...m.classList].find(c => c.startsWith('mark-'));"
        "  colours[kind] = getComputedStyle(m).fill;"
        "  return b.x < 0 || b.y < 0 || b.x + b.width > box.width || b.y + b.height > box.height;"
        "}).length; return [outside, colours];", svg)
    assert outside == 0
    assert len(set(colours.values())) == len(colours) >= 4
    fact = next(s for s in spots if "mark-semantic" in
                s.find_element(By.CSS_SELECTOR, "path").get_attribute("class"))
    fact_id = fact.get_attribute("data-id")
    fact.click()
    _until(driver, ec.presence_of_element_located((By.ID, "node-text")))
    assert driver.title == "semantic node · mnemo"
    assert fact_id in driver.find_element(By.CSS_SELECTOR, "p.meta code").text
    driver.find_element(By.ID, "in-graph").click()
    _until(driver, ec.presence_of_element_located((By.CSS_SELECTOR, "a.spot.focus")))
    assert driver.find_element(By.CSS_SELECTOR, "a.spot.focus").get_attribute(
        "data-id") == fact_id


def test_pages_can_be_captured(site: tuple[Any, str], tmp_path: Path) -> None:
    """A screenshot of the graph page is a PNG of real content (what the README shows)."""
    driver, base = site
    driver.get(f"{base}/graph?repo={REPO}")
    shot = tmp_path / "graph.png"
    assert driver.save_screenshot(str(shot))
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG")
    assert len(data) > 10_000


def test_a_rebound_name_reads_nothing(site: tuple[Any, str]) -> None:
    """A page at a foreign name that resolves to 127.0.0.1 (DNS rebinding) gets a refusal,
    also for its own same-origin fetch; the app's own address gets the page."""
    driver, base = site
    port = base.rsplit(":", 1)[1]
    driver.get(f"http://evil.example.com:{port}/sessions")
    body = driver.find_element(By.TAG_NAME, "body").text
    assert "only the host names" in body
    assert "Tune postgres" not in body
    status, text = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/sessions').then(r => r.text().then(t => done([r.status, t])))"
        ".catch(e => done([0, String(e)]));"
    )
    assert status == 400
    assert "Tune postgres" not in text
    driver.get(f"{base}/sessions")
    assert "Tune postgres" in driver.find_element(By.ID, "sessions").text


@pytest.fixture
def writable(sample: Sample) -> Iterator[str]:
    """`mnemo ui --allow-writes` over this test's copy of the sample."""
    with running_server(sample.db, allow_writes=True) as base:
        yield base


def _history(db: Path) -> list[str]:
    async def read() -> list[str]:
        async with mnemo.Memory(db) as mem:
            return [c.id for c in await mem.history(REPO)]

    return anyio.run(read)


def test_a_cross_site_form_cannot_revert_but_the_commit_page_can(
    site: tuple[Any, str], writable: str, sample: Sample
) -> None:
    """With --allow-writes, a form on another site that posts a revert to the app is
    refused and nothing changes; the commit page's own form reverts."""
    driver, _ = site
    newest = _history(sample.db)[0]
    attack = (
        f'<form id="f" method="post" action="{writable}/revert">'
        f'<input name="repo" value="{REPO}"><input name="id" value="{newest}">'
        '<input name="confirm" value="yes"></form>'
        "<script>document.getElementById('f').submit()</script>"
    )

    async def attacker(request: Any) -> HTMLResponse:
        return HTMLResponse(attack)

    with serving(Starlette(routes=[Route("/", attacker)])) as other:
        driver.get(other.replace("127.0.0.1", "attacker.example.net") + "/")
        _until(driver, lambda d: "only from its own pages" in d.page_source)
    assert _history(sample.db)[0] == newest
    driver.get(f"{writable}/commit?repo={REPO}&id={newest}")
    driver.find_element(By.CSS_SELECTOR, "#revert input[name=confirm]").click()
    driver.find_element(By.CSS_SELECTOR, "#revert button").click()
    _until(driver, ec.presence_of_element_located((By.ID, "reverted")))
    assert newest in driver.find_element(By.ID, "reverted").text
    assert _history(sample.db)[:2] == [_history(sample.db)[0], newest]
    assert _history(sample.db)[0].startswith("revert_")


def test_a_counted_recall_posts_from_the_playground(
    site: tuple[Any, str], writable: str
) -> None:
    """With --allow-writes, the playground's second button posts through htmx (the browser
    sends the app's Origin) and swaps in results counted as accesses."""
    driver, _ = site
    driver.get(f"{writable}/recall?repo={REPO}")
    _until(driver, lambda d: d.execute_script("return window.htmx !== undefined"))
    driver.execute_script("window.stillHere = true")
    driver.find_element(By.CSS_SELECTOR, "#recall input[name=q]").send_keys("gunicorn port")
    driver.find_element(By.ID, "recall-count").click()
    _until(driver, ec.presence_of_element_located((By.CSS_SELECTOR, "#recalled tr.hit")))
    assert "counted as accesses" in driver.find_element(By.ID, "results").text
    assert driver.execute_script("return window.stillHere") is True


def test_the_token_in_an_address_opens_the_app_with_a_cookie_scripts_cannot_read(
    site: tuple[Any, str], sample_master: Sample
) -> None:
    """With a token, a page without it asks for it; opening ?token= once leaves an address
    without it and a cookie that opens the other pages and that no script can read."""
    driver, _ = site
    with running_server(sample_master.db, access=Access(token=TOKEN)) as base:
        driver.get(f"{base}/sessions")
        assert "needs its access token" in driver.find_element(By.TAG_NAME, "body").text
        driver.get(f"{base}/sessions?token={TOKEN}")
        _until(driver, ec.title_is("Sessions · mnemo"))
        assert driver.current_url == f"{base}/sessions"
        assert driver.execute_script("return document.cookie") == ""
        driver.get(f"{base}/threads")
        assert driver.title == "Threads · mnemo"


def _pages(driver: Any, base: str, sample: Sample) -> list[str]:
    """One address of each page, a fact's and a commit's included."""
    driver.get(f"{base}/graph?repo={REPO}&type=semantic")
    fact = next(a.get_attribute("href") for a in
                driver.find_elements(By.CSS_SELECTOR, "#nodes a.node-link")
                if "gunicorn" in a.text)
    driver.get(f"{base}/history?repo={REPO}")
    commit = driver.find_elements(By.CSS_SELECTOR, "a.commit-link")[-1].get_attribute("href")
    return [
        f"{base}/", f"{base}/graph?repo={REPO}", fact, commit, f"{base}/history?repo={REPO}",
        f"{base}/recall?repo={REPO}&q=which+port+does+gunicorn+use",
        f"{base}/sessions", f"{base}/session?id={sample.committed_session}",
        f"{base}/threads", f"{base}/thread?id={quote(THREAD, safe='')}&budget=300",
    ]


@pytest.mark.parametrize("size", [PHONE, DESKTOP], ids=["phone", "desktop"])
def test_every_page_fits_the_screen_and_keeps_its_policy(
    site: tuple[Any, str], sample_master: Sample, size: tuple[int, int]
) -> None:
    """At a phone's and a desktop's width, no page scrolls sideways (a table scrolls
    inside itself), the drawing that shows fits its picture, and no page logs an error
    (a Content-Security-Policy refusal among them)."""
    driver, base = site
    try:
        pages = _pages(driver, base, sample_master)
        viewport(driver, *size)
        driver.get_log("browser")
        for url in pages:
            driver.get(url)
            overflow = driver.execute_script(
                "return document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, url
        drawn = pages[2]
        driver.get(drawn)
        shown = [svg for svg in driver.find_elements(By.CSS_SELECTOR, ".drawing svg")
                 if svg.is_displayed()]
        assert len(shown) == 1
        assert shown[0].get_attribute("id") == (
            "drawing-narrow" if size == PHONE else "drawing-wide")
        beyond = driver.execute_script(
            "const svg = arguments[0]; const w = svg.viewBox.baseVal.width;"
            "return [...svg.querySelectorAll('text')].filter("
            "t => { const b = t.getBBox(); return b.x < 0 || b.x + b.width > w; }).length;",
            shown[0])
        assert beyond == 0
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        viewport(driver, *DESKTOP)
