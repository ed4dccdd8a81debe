"""Headless Debian Chromium driven by Playwright (no browser download), for the side panel's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lab_server import TOKEN, LabServer, chromium_path

# As root Chromium needs --no-sandbox; the network flags stop it calling Google's hosts, which this
# machine's closed network refuses (and which would slow every start).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    # Module scope, not session: Playwright's sync API keeps an asyncio loop running on this thread until
    # it exits, and later tests (asyncio.run, nbval's kernels) need the thread without one.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class LabPage:
    """One JupyterLab tab, with every dialog (an `alert()` from injected markup included) recorded."""

    PANEL = ".jp-GpuPanel"

    def __init__(self, browser: object, server: LabServer) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.page.on("dialog", lambda dialog: (self.dialogs.append(dialog.message), dialog.dismiss()))
        self.metrics_requests: list[float] = []
        self.metrics_urls: list[str] = []
        self.series_urls: list[str] = []
        self.page.on("request", self._count)
        # ?reset: start from an empty workspace, not the layout an earlier test left on the server.
        self.page.goto(f"{server.base}lab?reset&token={TOKEN}")
        self.page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)

    def _count(self, request: object) -> None:
        if "/jupyter-gpu/api/metrics" in request.url:  # type: ignore[attr-defined]
            self.metrics_requests.append(__import__("time").monotonic())
            self.metrics_urls.append(request.url)  # type: ignore[attr-defined]
        elif "/jupyter-gpu/api/series" in request.url:  # type: ignore[attr-defined]
            self.series_urls.append(request.url)  # type: ignore[attr-defined]

    def toggle_panel(self) -> None:
        self.page.click('.jp-SideBar [data-id="jupyter-gpu-panel"]')

    def open_panel(self, state: str = "ok") -> None:
        self.toggle_panel()
        self.page.wait_for_selector(f'{self.PANEL}[data-state="{state}"]', timeout=30_000)

    def texts(self, selector: str) -> list[str]:
        return self.page.locator(selector).all_inner_texts()

    def attribute(self, selector: str, name: str) -> str | None:
        return self.page.locator(selector).first.get_attribute(name)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def lab_page(browser: object):
    pages: list[LabPage] = []

    def open_page(server: LabServer) -> LabPage:
        page = LabPage(browser, server)
        pages.append(page)
        return page

    yield open_page
    for page in pages:
        page.close()
