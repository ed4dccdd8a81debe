"""Headless Debian Chromium driven by Playwright (no browser download), for the side panel's tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

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


STREAM = "/jupyter-gpu/api/metrics/stream"


class LabPage:
    """One JupyterLab tab, with every dialog (an `alert()` from injected markup included) recorded, every poll of
    the metrics and every socket of the push stream.

    `stream`: "real" (the panel's sockets reach the server), "refused" (each one is closed before the server
    sees it, as a proxy without WebSockets does) or "proxied" (they reach the server through `self.stream_routes`,
    which a test can close to drop a socket in the middle).
    """

    PANEL = ".jp-GpuPanel"

    def __init__(self, browser: object, server: LabServer, stream: str = "real") -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.page.on("dialog", lambda dialog: (self.dialogs.append(dialog.message), dialog.dismiss()))
        self.metrics_requests: list[float] = []
        self.metrics_urls: list[str] = []
        self.series_urls: list[str] = []
        self.page.on("request", self._count)
        self.sockets: list[Socket] = []
        self.page.on("websocket", self._socket)
        self.stream_routes: list[object] = []
        if stream == "refused":
            self.page.route_web_socket(f"**{STREAM}**", lambda route: route.close())
        elif stream == "proxied":
            self.page.route_web_socket(f"**{STREAM}**", self._proxy)
        # ?reset: start from an empty workspace, not the layout an earlier test left on the server.
        self.page.goto(f"{server.base}lab?reset&token={TOKEN}")
        self.page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)

    def _proxy(self, route: object) -> None:
        route.connect_to_server()  # type: ignore[attr-defined]
        self.stream_routes.append(route)

    def _socket(self, websocket: object) -> None:
        if STREAM in websocket.url:  # type: ignore[attr-defined]
            socket = Socket(websocket.url)  # type: ignore[attr-defined]
            websocket.on("framereceived", lambda _frame: socket.frames.append(time.monotonic()))  # type: ignore[attr-defined]
            websocket.on("close", lambda _ws: setattr(socket, "closed", True))  # type: ignore[attr-defined]
            self.sockets.append(socket)

    @property
    def open_sockets(self) -> list[Socket]:
        return [socket for socket in self.sockets if not socket.closed]

    def _count(self, request: object) -> None:
        if "/jupyter-gpu/api/metrics" in request.url and STREAM not in request.url:  # type: ignore[attr-defined]
            self.metrics_requests.append(time.monotonic())
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


@dataclass
class Socket:
    """One push-stream socket the page opened: the monotonic times of the frames it received, and whether it closed."""

    url: str
    frames: list[float] = field(default_factory=list)
    closed: bool = False


@pytest.fixture
def lab_page(browser: object):
    pages: list[LabPage] = []

    def open_page(server: LabServer, stream: str = "real") -> LabPage:
        page = LabPage(browser, server, stream)
        pages.append(page)
        return page

    yield open_page
    for page in pages:
        page.close()
