"""The status-bar item in a real JupyterLab and a real (headless) Chromium: the GPUs of the notebook in focus, the
three states a user must notice (no GPU, amber, red), the click that opens the panel, and one poll for both.

The servers run the simulated backends; the notebooks' kernels are real and hold simulated GPU memory through claims.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from lab_server import TOKEN, LabServer, start_lab_server

ITEM = ".jp-GpuStatus"


@pytest.fixture(scope="module")
def lab_lost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """One busy H200 that falls off the bus 5 s after the server's sampler starts (the `lost` scenario)."""
    server = start_lab_server(tmp_path_factory.mktemp("lab-lost"), "lost")
    yield server
    server.stop()


def open_notebook(lab, server: LabServer, path: str) -> None:
    lab.page.goto(f"{server.base}lab/tree/{path}?token={TOKEN}")
    lab.page.locator(".jp-NotebookPanel").first.wait_for(timeout=60_000)


def wait_for_item(lab, pattern: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = lab.page.locator(ITEM).inner_text().strip()
        if re.fullmatch(pattern, text):
            return text
        lab.page.wait_for_timeout(200)  # through Playwright, so page events keep flowing
    raise AssertionError(f"the status bar says {text!r}, not {pattern!r}")


def wait_for_title(lab, fragment: str, timeout: float = 30.0) -> str:
    """The tooltip, once it says `fragment`: the item follows the notebook's kernel from the next poll on."""
    deadline = time.monotonic() + timeout
    title = ""
    while time.monotonic() < deadline:
        title = lab.page.locator(ITEM).get_attribute("title") or ""
        if fragment in title:
            return title
        lab.page.wait_for_timeout(200)
    raise AssertionError(f"the status bar's tooltip is {title!r}, without {fragment!r}")


def test_the_notebook_in_focus_shows_its_gpu_busy_share_and_memory_and_a_click_opens_the_panel(
        lab_a100, lab_page) -> None:
    session = lab_a100.new_notebook("status/train.ipynb")
    lab_a100.hold_memory(lab_a100.kernel_pid(session["kernel"]["id"]), "3GiB", device=4)
    lab = lab_page(lab_a100)
    open_notebook(lab, lab_a100, "status/train.ipynb")
    wait_for_item(lab, r"GPU 4 · \d+ % · 3\.0 GiB / 80\.0 GiB")
    item = lab.page.locator(ITEM)
    assert item.get_attribute("data-level") == "ok"
    assert item.get_attribute("title").startswith("status/train.ipynb holds 3.0 GiB on GPU 4")
    assert lab.page.locator(".jp-GpuPanel").is_hidden()
    item.click()
    lab.page.wait_for_selector('.jp-GpuPanel[data-state="ok"]', timeout=30_000)
    assert lab.page.locator(".jp-GpuPanel").is_visible()


def test_a_notebook_whose_kernel_holds_no_gpu_memory_says_none_and_why(lab_a100, lab_page) -> None:
    lab_a100.new_notebook("status/plotting.ipynb")
    lab = lab_page(lab_a100)
    open_notebook(lab, lab_a100, "status/plotting.ipynb")
    title = wait_for_title(lab, "kernel holds no GPU memory")
    assert "This server has 8 GPUs" in title
    assert lab.page.locator(ITEM).inner_text().strip() == "GPU: none"
    assert lab.page.locator(ITEM).get_attribute("data-level") == "none"


def test_amber_once_the_kernel_has_held_memory_without_running_for_the_set_minutes(lab_a100, lab_page) -> None:
    session = lab_a100.new_notebook("status/forgotten.ipynb")
    lab_a100.hold_memory(lab_a100.kernel_pid(session["kernel"]["id"]), "2GiB", device=3)
    assert lab_a100.request("lab/api/settings/jupyter-gpu:plugin", method="PUT",
                            body={"raw": '{"idleWarningMinutes": 0}'}).status == 204
    try:
        lab = lab_page(lab_a100)
        open_notebook(lab, lab_a100, "status/forgotten.ipynb")
        wait_for_item(lab, r"GPU 3 · \d+ % · 2\.0 GiB / 80\.0 GiB")
        item = lab.page.locator(ITEM)
        lab.page.wait_for_selector(f'{ITEM}[data-level="warn"]', timeout=20_000)
        tooltip = wait_for_title(lab, "while holding 2.0 GiB of GPU memory")
        assert "%gpumem --free NAME" in tooltip
        assert item.evaluate("node => getComputedStyle(node).backgroundColor") not in ("rgba(0, 0, 0, 0)", "")
        # The panel lists the idle holders first, each with how to give its memory back.
        item.click()
        row = lab.page.locator('tr.jp-GpuPanel-holder[data-idle="true"]', has_text="status/forgotten.ipynb")
        row.wait_for(timeout=20_000)
        assert "%gpumem --free NAME" in row.locator(".jp-GpuPanel-holderHint").inner_text()
        idle_marks = [r.get_attribute("data-idle") for r in lab.page.locator("tr.jp-GpuPanel-holder").all()]
        assert idle_marks == sorted(idle_marks, key=lambda mark: mark != "true"), idle_marks
    finally:
        lab_a100.request("lab/api/settings/jupyter-gpu:plugin", method="PUT", body={"raw": "{}"})


def test_no_gpu_on_the_server_says_none_with_nvmls_reason(lab_nodriver, lab_page) -> None:
    lab_nodriver.new_notebook("status/any.ipynb")
    lab = lab_page(lab_nodriver)
    open_notebook(lab, lab_nodriver, "status/any.ipynb")
    wait_for_item(lab, "GPU: none")
    wait_for_title(lab, "NVML Shared Library Not Found")


def test_red_when_a_gpu_is_lost(lab_lost, lab_page) -> None:
    lab_lost.new_notebook("status/lost.ipynb")
    lab = lab_page(lab_lost)
    open_notebook(lab, lab_lost, "status/lost.ipynb")
    wait_for_item(lab, "GPU 0 lost")
    assert lab.page.locator(ITEM).get_attribute("data-level") == "fail"
    wait_for_title(lab, "fell off the bus")


def test_one_poll_feeds_the_status_bar_and_the_panel(lab_a100, lab_page) -> None:
    lab = lab_page(lab_a100)
    wait_for_item(lab, r"GPU.*")
    lab.page.wait_for_timeout(1500)  # past the first replies
    start = len(lab.metrics_requests)
    lab.page.wait_for_timeout(6000)
    closed = len(lab.metrics_requests) - start
    lab.open_panel()
    lab.page.wait_for_timeout(1500)
    start = len(lab.metrics_requests)
    lab.page.wait_for_timeout(6000)
    opened = len(lab.metrics_requests) - start
    # The poll runs every second (the panel's default, slower than the server's 0.5 s): about 6 in 6 s either way,
    # never two pollers (12).
    assert 3 <= closed <= 8 and 3 <= opened <= 8, (closed, opened)
