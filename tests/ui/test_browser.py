"""The web app in a real browser: `mnemo ui`'s app served by uvicorn on 127.0.0.1, driven by
headless Chromium through selenium. Skipped, saying why, where no Chromium is installed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ui._browser import browser, running_server
from tests.ui.conftest import REPO, THREAD, Sample

pytest.importorskip("selenium")

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.wait import WebDriverWait

pytestmark = pytest.mark.slow  # selenium starts chromedriver

WAIT = 30


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


def test_pages_can_be_captured(site: tuple[Any, str], tmp_path: Path) -> None:
    """A screenshot of the graph page is a PNG of real content (what the README shows)."""
    driver, base = site
    driver.get(f"{base}/graph?repo={REPO}")
    shot = tmp_path / "graph.png"
    assert driver.save_screenshot(str(shot))
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG")
    assert len(data) > 10_000
