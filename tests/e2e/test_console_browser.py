"""The console in a real browser: headless Debian Chromium driven by Playwright.

Streamlit runs as a child process (the same command `evolving-infra console`
runs) against a live admin API served in this process (tests/integration/console_live.py).
Screenshots of every page land in test-output/screenshots/.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx
import pytest

from admin_ui.cli import console_command
from testing.console_live import LiveAdminApi, live_admin_api

if TYPE_CHECKING:  # the module itself is imported below, or the tests skipped
    from playwright.sync_api import Browser, Page

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
ROOT = pathlib.Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-output" / "screenshots"
PAGES = ["Cluster", "Planner", "History", "Tenants", "Cache"]

if not os.path.exists(CHROMIUM):
    pytest.skip(
        f"{CHROMIUM} is missing: install Debian's chromium and chromium-driver "
        "(make browser-deps) to run the browser tests",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright for Python is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveAdminApi]:
    with live_admin_api(tmp_path_factory.mktemp("console-browser")) as live:
        yield live


@pytest.fixture(scope="module")
def console_url(api: LiveAdminApi, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    argv, env = console_command(admin_url=api.url, port=port)
    log = (tmp_path_factory.mktemp("streamlit") / "streamlit.log").open("w")
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/_stcore/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"streamlit did not start (exit {proc.poll()}); see {log.name}")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


def logged_in_page(browser: Browser, console_url: str, token: str) -> Page:
    page = browser.new_page(viewport={"width": 1400, "height": 1500})
    page.set_default_timeout(30_000)
    page.goto(console_url)
    page.get_by_label("Admin token").fill(token)
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("heading", name="Cluster").wait_for()
    return page


def visit(page: Page, title: str) -> None:
    page.get_by_role("link", name=title).click()
    page.get_by_role("heading", name=title).first.wait_for()
    page.wait_for_load_state("networkidle")


def settle(page: Page) -> None:
    """Wait for Streamlit's rerun to finish and charts to draw."""
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')")
    page.wait_for_timeout(1200)


def test_every_page_renders_and_is_captured(browser: Browser, console_url: str, api: LiveAdminApi) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = logged_in_page(browser, console_url, api.tokens["operator"])
    page.locator(".node-tile").first.wait_for()
    assert page.locator(".node-tile").count() == 4
    assert page.locator('.node-tile[data-draining="yes"]').count() == 1
    for title in PAGES:
        visit(page, title)
        settle(page)
        assert page.locator('[data-testid="stException"]').count() == 0, title
        assert page.locator('[data-testid="stAlertContentError"]').count() == 0, title
        page.screenshot(path=str(SHOTS / f"{title.lower()}.png"), full_page=True)
    visit(page, "Tenants")
    for tab in ("Policy", "Usage"):
        page.get_by_role("tab", name=tab).click()
        settle(page)
        page.screenshot(path=str(SHOTS / f"tenants-{tab.lower()}.png"), full_page=True)
    page.close()


def test_pin_split_through_the_ui_and_read_it_back(browser: Browser, console_url: str, api: LiveAdminApi) -> None:
    page = logged_in_page(browser, console_url, api.tokens["operator"])
    visit(page, "Planner")
    prefill = page.get_by_label("Prefill nodes")
    prefill.fill("3")
    prefill.press("Enter")
    settle(page)
    page.get_by_role("button", name="Pin split", exact=True).click()
    page.get_by_text("3 prefill / 1 decode").wait_for()
    page.screenshot(path=str(SHOTS / "planner-confirm.png"), full_page=True)
    assert api.control.split_pin is None  # asked, not done
    page.get_by_role("button", name="Confirm").click()
    page.get_by_text("Done.").wait_for()
    settle(page)
    page.screenshot(path=str(SHOTS / "planner-pinned.png"), full_page=True)
    pins = httpx.get(
        api.url + "/admin/pins", timeout=10, headers={"Authorization": f"Bearer {api.tokens['viewer']}"}
    ).json()
    assert pins["split"] == 3
    cluster = httpx.get(
        api.url + "/admin/cluster", timeout=10, headers={"Authorization": f"Bearer {api.tokens['viewer']}"}
    ).json()
    assert cluster["split"] == [3, 1]
    page.close()


def test_history_csv_download(browser: Browser, console_url: str, api: LiveAdminApi) -> None:
    page = logged_in_page(browser, console_url, api.tokens["viewer"])
    visit(page, "History")
    with page.expect_download() as download:
        page.get_by_role("button", name="Download switch events (CSV)").click()
    lines = pathlib.Path(download.value.path()).read_text().splitlines()
    assert {"t", "node_id", "to_phase", "reason", "outcome"} <= set(lines[0].split(","))
    assert len(lines) >= 5  # header + the 4 seeded events (+ any switch the pin test caused)
    page.close()


def test_viewer_write_controls_are_disabled(browser: Browser, console_url: str, api: LiveAdminApi) -> None:
    page = logged_in_page(browser, console_url, api.tokens["viewer"])
    visit(page, "Planner")
    assert page.get_by_role("button", name="Pin split", exact=True).is_disabled()
    assert page.get_by_role("button", name="Set mode").is_disabled()
    page.screenshot(path=str(SHOTS / "planner-viewer.png"), full_page=True)
    page.close()
