"""Every page of a running console, rendered in headless Chromium (Playwright).

`check_pages(console_url, token)` logs in with an admin token, opens each
page from the sidebar, waits for Streamlit to finish its run, and records
per page whether an exception box or an error alert is on screen (and its
text). Screenshots go to `shots` when given. Needs Debian's Chromium at
`CHROMIUM` and the `playwright` package (`make browser-deps`).
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
PAGES = ("Cluster", "Planner", "History", "Tenants", "Cache")
ERROR_BOXES = '[data-testid="stException"], [data-testid="stAlertContentError"]'


@dataclass(frozen=True)
class PageResult:
    page: str
    ok: bool
    error: str | None = None  # the error box's text, or why the page did not render


def browser_available() -> str | None:
    """None when the check can run, else why not."""
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is missing (make browser-deps)"
    try:
        import playwright.sync_api  # noqa: F401 - presence check
    except ImportError:
        return "the playwright package is not installed"
    return None


def check_pages(
    console_url: str, token: str, *, shots: pathlib.Path | None = None, timeout_ms: int = 60_000
) -> list[PageResult]:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    results: list[PageResult] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.set_default_timeout(timeout_ms)
            page.goto(console_url)
            page.get_by_label("Admin token").fill(token)
            page.get_by_role("button", name="Log in").click()
            page.get_by_role("heading", name="Cluster").wait_for()
            for title in PAGES:
                try:
                    page.get_by_role("link", name=title).click()
                    page.get_by_role("heading", name=title).first.wait_for()
                    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')")
                    page.wait_for_timeout(1500)  # charts draw after the run
                    boxes = page.locator(ERROR_BOXES)
                    error = "; ".join(boxes.all_inner_texts())[:300] if boxes.count() else None
                    if shots is not None:
                        shots.mkdir(parents=True, exist_ok=True)
                        page.screenshot(path=str(shots / f"{title.lower()}.png"), full_page=True)
                    results.append(PageResult(title, error is None, error))
                except PlaywrightError as exc:
                    results.append(PageResult(title, False, f"did not render: {str(exc).splitlines()[0]}"))
        finally:
            browser.close()
    return results
