"""The JupyterLab side panel and the status-bar item in a real JupyterLab and a real (headless) Chromium, as a user
sees them.

The server runs the simulated backends; kernels are real and hold simulated GPU memory through claims.
The a100 server sits under a JupyterHub-style base URL (/user/alice/), so every test here also checks that
the panel finds its API there.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator

import pytest
from lab_server import TOKEN, LabServer, start_lab_server

XSS = "<img src=x onerror=alert(1)>"


def wait_until(lab, condition, timeout: float = 20.0, message: str = "condition") -> None:
    # Waits through Playwright, never time.sleep: the sync API delivers page events (requests, dialogs)
    # only while it runs, so a plain sleep would freeze the request counter.
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{message} not met in {timeout} s"
        lab.page.wait_for_timeout(100)


def test_the_panel_shows_every_gpu_and_its_utilisation_moves(lab_a100, lab_page) -> None:
    lab = lab_page(lab_a100)
    lab.open_panel()
    assert lab.texts(".jp-GpuPanel-deviceName") == ["NVIDIA A100-SXM4-80GB"] * 8
    assert "simulated" in lab.texts(".jp-GpuPanel-simulated")[0]
    # The header shows the backend's whole name, inside the panel (it was cut to 'simulated:a100x…').
    assert lab.texts(".jp-GpuPanel-backend") == ["simulated:a100x8-mig"]
    for width in (None, 200):  # as opened, then as narrow as a side panel is dragged
        if width is not None:
            lab.page.evaluate("w => { document.querySelector('.jp-GpuPanel').style.width = w + 'px'; }", width)
            lab.page.wait_for_timeout(200)
        shown = lab.page.evaluate("""() => {
            const name = document.querySelector('.jp-GpuPanel-backend').getBoundingClientRect();
            const panel = document.querySelector('.jp-GpuPanel').getBoundingClientRect();
            const node = document.querySelector('.jp-GpuPanel-backend');
            return {cut: node.scrollWidth > node.clientWidth + 1, right: name.right, panel: panel.right,
                    ellipsis: getComputedStyle(node).textOverflow};
        }""")
        assert not shown["cut"] and shown["right"] <= shown["panel"] + 1 and shown["ellipsis"] != "ellipsis", shown
    # MIG boards do not report utilisation: "n/a", never 0 %.
    utilisation = lab.texts(".jp-GpuPanel-utilization")
    assert utilisation[0] == utilisation[1] == "n/a"
    assert all(text.endswith("%") for text in utilisation[2:])
    assert all(" / 80.0 GiB" in text for text in lab.texts(".jp-GpuPanel-memory"))
    assert all("W" in text for text in lab.texts(".jp-GpuPanel-power"))
    assert all("°C" in text for text in lab.texts(".jp-GpuPanel-temperature"))
    first_stamp = lab.attribute(".jp-GpuPanel", "data-last-sample")
    wait_until(lab, lambda: lab.texts(".jp-GpuPanel-utilization") != utilisation, message="utilisation moving")
    assert lab.attribute(".jp-GpuPanel", "data-last-sample") != first_stamp
    points = int(lab.attribute('.jp-GpuPanel-device[data-gpu-index="2"] '
                               'svg.jp-GpuPanel-chart[data-metric="utilization"]', "data-points") or 0)
    assert points >= 2
    assert lab.page.locator('.jp-GpuPanel-alert[data-code="THROTTLED"]').count() == 1  # GPU 6 is power-capped
    assert lab.dialogs == []


def test_the_kernel_table_names_the_notebook_that_holds_memory_and_opens_it(lab_a100, lab_page) -> None:
    session = lab_a100.new_notebook("train-resnet.ipynb")
    lab_a100.hold_memory(lab_a100.kernel_pid(session["kernel"]["id"]), "22GB", device=4)
    lab = lab_page(lab_a100)
    lab.open_panel()
    row = lab.page.locator('tr.jp-GpuPanel-holder[data-kind="kernel"]', has_text="train-resnet.ipynb")
    row.wait_for(timeout=20_000)
    assert row.locator(".jp-GpuPanel-holderLabel").inner_text() == "train-resnet.ipynb"
    assert "20.5 GiB" in row.locator(".jp-GpuPanel-holderMemory").inner_text()
    assert row.locator(".jp-GpuPanel-holderSummary").inner_text().startswith(
        "train-resnet.ipynb holds 20.5 GiB on GPU 4")
    # Other users' processes: memory only.
    others = lab.page.locator('tr.jp-GpuPanel-holder[data-kind="other"] .jp-GpuPanel-holderLabel').all_inner_texts()
    assert others and all(re.fullmatch(r"other process|\d+ other processes", label) for label in others)
    row.locator("button.jp-GpuPanel-open").click()
    lab.page.locator(".lm-DockPanel-tabBar .lm-TabBar-tabLabel", has_text="train-resnet.ipynb").wait_for(
        timeout=20_000)


def test_names_from_nvml_and_notebook_paths_render_as_text(lab_a100, lab_page) -> None:
    session = lab_a100.new_notebook(f"{XSS}.ipynb")
    lab_a100.hold_memory(lab_a100.kernel_pid(session["kernel"]["id"]), "4GiB", device=3)
    program = lab_a100.spawn(["bash", "-c", f"exec -a '{XSS}' sleep 300"])
    time.sleep(0.3)  # exec replaces bash with the renamed sleep
    lab_a100.hold_memory(program.pid, "1GiB", device=7)
    lab = lab_page(lab_a100)
    lab.open_panel()
    labels = '.jp-GpuPanel-holderLabel'
    wait_until(lab, lambda: lab.texts(labels).count(f"{XSS}.ipynb") == 1 and lab.texts(labels).count(XSS) == 1,
               message="both crafted names listed")
    assert any(text.startswith(f"{XSS}.ipynb holds 4.0 GiB on GPU 3") for text in
               lab.texts(".jp-GpuPanel-holderSummary"))
    assert lab.page.locator(".jp-GpuPanel img").count() == 0
    lab.page.wait_for_timeout(1500)  # a few more refreshes: an injected onerror would have fired by now
    assert lab.dialogs == []


def test_history_comes_from_the_server_and_survives_closing_the_panel(lab_a100, lab_page) -> None:
    lab = lab_page(lab_a100)
    lab.open_panel()
    chart = '.jp-GpuPanel-device[data-gpu-index="4"] svg.jp-GpuPanel-chart[data-metric="memory"]'
    before = int(lab.attribute(chart, "data-points") or 0)
    assert before >= 10  # the server kept readings from before this tab existed
    lab.toggle_panel()
    lab.page.wait_for_timeout(2000)
    lab.open_panel()
    # Reopened: the readings taken while it was closed are there at once (server interval 0.5 s).
    wait_until(lab, lambda: int(lab.attribute(chart, "data-points") or 0) >= min(before + 3, 600),
               timeout=3.0, message="history refilled")


def test_the_window_selector_shows_a_minute_ten_or_an_hour_of_min_mean_max_buckets(lab_a100, lab_page) -> None:
    lab = lab_page(lab_a100)
    lab.open_panel()
    chart = '.jp-GpuPanel-device[data-gpu-index="2"] svg.jp-GpuPanel-chart[data-metric="utilization"]'
    caption = ".jp-GpuPanel-devicesSection .jp-GpuPanel-caption"
    assert lab.attribute(".jp-GpuPanel", "data-window") == "10m" and lab.texts(caption) == ["last 10 min"]
    lab.page.click('.jp-GpuPanel-window[data-window="1m"]')
    assert lab.texts(caption) == ["last 1 min"]
    assert lab.attribute('.jp-GpuPanel-window[data-window="1m"]', "aria-pressed") == "true"
    # The server samples every 0.5 s: a minute holds at most ~120 readings, whatever the history kept.
    assert 2 <= int(lab.attribute(chart, "data-points") or 0) <= 125
    lab.page.click('.jp-GpuPanel-window[data-window="1h"]')
    # An hour comes from the server's series (GET .../api/series), drawn as the mean with a min-max band.
    wait_until(lab, lambda: lab.texts(caption) == ["last 1 h, 12 s buckets: mean, min to max"],
               message="the hour's series")
    assert any("/jupyter-gpu/api/series?" in url and "window=3600" in url for url in lab.metrics_urls + lab.series_urls)
    assert lab.attribute(chart, "data-band") == "min-max"
    assert 1 <= int(lab.attribute(chart, "data-points") or 0) <= 300
    mig = '.jp-GpuPanel-device[data-gpu-index="0"] svg.jp-GpuPanel-chart[data-metric="utilization"]'
    assert lab.attribute(mig, "data-points") == "0"  # a MIG board: no line, never a line at 0


def on_the_stream(lab) -> None:
    wait_until(lab, lambda: lab.attribute(".jp-GpuPanel", "data-transport") == "stream", message="the push stream")


def test_each_reading_is_pushed_to_the_panel_as_it_is_made_without_polling(lab_a100, lab_page) -> None:
    lab = lab_page(lab_a100)
    lab.open_panel()
    on_the_stream(lab)
    polls = len(lab.metrics_requests)
    shown = []
    for _ in range(8):  # 4 s; the panel's default rate is a frame a second, the server reads every 0.5 s
        lab.page.wait_for_timeout(500)
        stamp = float(lab.attribute(".jp-GpuPanel", "data-last-sample") or 0)
        age = lab.page.evaluate("Date.now() / 1000") - stamp
        shown.append((stamp, age))
    assert len(lab.metrics_requests) == polls, lab.metrics_urls[polls:]  # not one poll meanwhile
    assert len({stamp for stamp, _ in shown}) >= 3, shown  # new readings kept coming
    # Drawn as they come: never older than the panel's 1 s rate plus the server's 0.5 s between readings.
    assert max(age for _, age in shown) < 2.0, shown
    assert len(lab.open_sockets) == 1


def test_with_the_panel_hidden_the_status_bar_keeps_the_one_stream_and_showing_it_asks_for_the_history_once(
        lab_a100, lab_page) -> None:
    lab = lab_page(lab_a100)
    lab.open_panel()
    on_the_stream(lab)
    lab.toggle_panel()
    lab.page.wait_for_timeout(500)
    hidden_from, sockets = len(lab.metrics_requests), len(lab.sockets)
    frames = len(lab.open_sockets[0].frames)
    lab.page.wait_for_timeout(3000)
    # The status bar shows the GPUs all the time, so the stream stays open for it alone: frames, and no poll.
    assert len(lab.metrics_requests) == hidden_from and len(lab.sockets) == sockets
    assert len(lab.open_sockets) == 1 and len(lab.open_sockets[0].frames) >= frames + 2
    lab.open_panel()
    # Shown again: the whole history once (the charts draw it), then the stream again from its newest reading.
    wait_until(lab, lambda: any("since=" not in url for url in lab.metrics_urls[hidden_from:]),
               message="the whole history asked for again")
    on_the_stream(lab)
    # data-transport can still read "stream" from before the panel was shown again, while a socket the panel judged
    # silent (on a loaded CI machine) is being replaced after that one poll: wait for the one open socket.
    wait_until(lab, lambda: len(lab.open_sockets) == 1, message="one open stream")
    assert len(lab.metrics_requests) == hidden_from + 1 and len(lab.open_sockets) == 1


def test_a_dropped_stream_is_followed_by_one_poll_for_the_gap_and_a_new_stream(lab_a100, lab_page) -> None:
    lab = lab_page(lab_a100, stream="proxied")
    lab.open_panel()
    on_the_stream(lab)
    lab.page.wait_for_timeout(5500)  # a socket that lived under 5 s counts as refused (see panel.ts)
    polls, (dropped,) = len(lab.metrics_requests), lab.open_sockets
    lab.stream_routes[-1].close(code=1001, reason="going away")  # as the server does when it stops
    wait_until(lab, lambda: len(lab.metrics_requests) > polls, message="a poll after the drop")
    assert all("since=" in url for url in lab.metrics_urls[polls:])  # only the gap, not the whole history
    wait_until(lab, lambda: len(lab.open_sockets) == 1 and lab.open_sockets[0] is not dropped, message="a new socket")
    on_the_stream(lab)
    before = float(lab.attribute(".jp-GpuPanel", "data-last-sample") or 0)
    wait_until(lab, lambda: float(lab.attribute(".jp-GpuPanel", "data-last-sample") or 0) > before,
               timeout=5.0, message="readings on the new socket")


def test_where_the_stream_is_refused_the_panel_polls_and_its_errors_back_off_then_recover(lab_a100, lab_page) -> None:
    lab = lab_page(lab_a100, stream="refused")
    lab.open_panel()
    start = len(lab.metrics_requests)
    lab.page.wait_for_timeout(3000)
    # A proxy without WebSockets: the panel polls instead, about once a second (its default rate), and says so.
    assert 2 <= len(lab.metrics_requests) - start <= 5
    assert lab.attribute(".jp-GpuPanel", "data-transport") == "poll" and lab.open_sockets == []
    start = len(lab.metrics_requests)
    lab.page.route("**/jupyter-gpu/api/metrics**", lambda route: route.fulfill(status=502, body="Bad Gateway"))
    lab.page.locator(".jp-GpuPanel-error").wait_for(timeout=10_000)
    lab.page.wait_for_timeout(15_000)
    failed = lab.metrics_requests[start:]
    gaps = [b - a for a, b in itertools.pairwise(failed)]
    # At the 1 s interval, 15 s of failures would be ~15 requests. Lumino's backoff draws each wait between
    # the interval and 3x the last one, so the count varies, but stays far below that.
    assert 2 <= len(failed) < 10, f"{len(failed)} requests in 15 s: {gaps}"
    assert max(gaps) > 1.8
    lab.page.unroute("**/jupyter-gpu/api/metrics**")
    lab.page.locator(".jp-GpuPanel-error").wait_for(state="detached", timeout=70_000)
    lab.page.wait_for_selector('.jp-GpuPanel[data-state="ok"]')


def test_settings_choose_which_charts_show(lab_a100, lab_page) -> None:
    raw = json.dumps({"showHolders": False, "showMemory": False, "refreshInterval": 2})
    assert lab_a100.request("lab/api/settings/jupyter-gpu:plugin", method="PUT", body={"raw": raw}).status == 204
    try:
        lab = lab_page(lab_a100)
        lab.open_panel()
        assert lab.page.locator('svg.jp-GpuPanel-chart[data-metric="utilization"]').count() == 8
        assert lab.page.locator('svg.jp-GpuPanel-chart[data-metric="memory"]').count() == 0
        assert lab.page.locator("table.jp-GpuPanel-holders").count() == 0
        # The refresh interval is the stream's rate: the server sends a frame every 2 s, not every 0.5 s reading.
        on_the_stream(lab)
        (socket,) = lab.open_sockets
        assert "every=2" in socket.url
        first = len(socket.frames)
        lab.page.wait_for_timeout(4500)
        assert 1 <= len(socket.frames) - first <= 3, socket.frames
    finally:
        lab_a100.request("lab/api/settings/jupyter-gpu:plugin", method="PUT", body={"raw": "{}"})


def test_the_settings_editor_changes_the_open_panel_live(lab_a100, lab_page) -> None:
    lab = lab_page(lab_a100)
    lab.open_panel()
    assert lab.page.locator("section.jp-GpuPanel-holdersSection").count() == 1
    try:
        lab.page.keyboard.press("Control+,")  # Settings → Settings Editor
        lab.page.locator(".jp-PluginList").get_by_text("GPU panel", exact=True).click()
        lab.page.get_by_label("Show who holds GPU memory").uncheck()
        lab.page.locator("section.jp-GpuPanel-holdersSection").wait_for(state="detached", timeout=10_000)
        assert lab.page.locator(".jp-GpuPanel-device").count() == 8  # the rest stays
    finally:
        lab_a100.request("lab/api/settings/jupyter-gpu:plugin", method="PUT", body={"raw": "{}"})


def test_the_settings_editor_lists_the_panels_settings(lab_a100) -> None:
    schema = lab_a100.request("lab/api/settings/jupyter-gpu:plugin").json()["schema"]
    assert {"refreshInterval", "showUtilization", "showMemory", "showPowerAndTemperature", "showHolders"} <= set(
        schema["properties"])


def test_no_gpu_shows_the_reason_and_the_fix_instead_of_a_blank_panel(lab_nodriver, lab_page) -> None:
    lab = lab_page(lab_nodriver)
    lab.open_panel(state="unavailable")
    assert "NVML Shared Library Not Found" in lab.texts(".jp-GpuPanel-reason")[0]
    assert lab.texts(".jp-GpuPanel-verdict")[0].strip()
    assert lab.texts("pre.jp-GpuPanel-fix")[0].strip()
    assert lab.page.locator(".jp-GpuPanel-device").count() == 0


# -- the status-bar item: the GPUs of the notebook in focus, fed by the panel's poll ----------------------------
# In this module, not one of its own: a module shares one Chromium, and on one xdist worker one JupyterLab.

ITEM = ".jp-GpuStatus"


@pytest.fixture(scope="module")
def lab_lost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """One busy H200 that falls off the bus 5 s after the server's sampler starts (the `lost` scenario)."""
    server = start_lab_server(tmp_path_factory.mktemp("lab-lost"), "lost")
    yield server
    server.stop()


def open_notebook(lab, server: LabServer, path: str) -> None:
    lab.page.goto(f"{server.base}lab/tree/{path}?reset&token={TOKEN}")  # reset: not the layout a test left
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


def test_in_notebook_7_the_item_sits_in_the_top_bar_of_its_pages_and_a_click_opens_the_panel(
        lab_a100, lab_page) -> None:
    # Notebook 7 (the `notebook` package, served by the same server) has no status bar: the item goes in its top bar.
    session = lab_a100.new_notebook("nb7/train.ipynb")
    lab_a100.hold_memory(lab_a100.kernel_pid(session["kernel"]["id"]), "2GiB", device=3)
    lab = lab_page(lab_a100)
    lab.page.goto(f"{lab_a100.base}tree?token={TOKEN}")
    wait_for_item(lab, "GPU: none")
    wait_for_title(lab, "No notebook is in focus.\nThis server has 8 GPUs.")
    assert lab.page.locator(f"#top-panel {ITEM}").count() == 1
    lab.page.goto(f"{lab_a100.base}notebooks/nb7/train.ipynb?token={TOKEN}")
    wait_for_item(lab, r"GPU 3 · \d+ % · 2\.0 GiB / 80\.0 GiB")
    assert lab.page.locator(f"#top-panel {ITEM}").count() == 1 and not lab.page.locator(".jp-GpuPanel").is_visible()
    lab.page.locator(ITEM).click()
    lab.page.wait_for_selector('.jp-GpuPanel[data-state="ok"]', state="visible", timeout=30_000)
    on_the_stream(lab)
    assert any("nb7/train.ipynb" in text for text in lab.texts(".jp-GpuPanel-holders tbody tr"))


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


def test_one_stream_feeds_the_status_bar_and_the_panel(lab_a100, lab_page) -> None:
    lab = lab_page(lab_a100)
    wait_for_item(lab, r"GPU.*")
    wait_until(lab, lambda: len(lab.open_sockets) == 1 and lab.open_sockets[0].frames, message="the stream")
    start, socket = len(lab.metrics_requests), lab.open_sockets[0]
    first = len(socket.frames)
    lab.page.wait_for_timeout(4000)
    # The status bar alone: one socket, a frame a second (the panel's default rate), no poll.
    assert len(lab.metrics_requests) == start and lab.open_sockets == [socket]
    assert 2 <= len(socket.frames) - first <= 6, socket.frames
    lab.open_panel()
    on_the_stream(lab)
    lab.page.wait_for_timeout(1000)
    start, (socket,) = len(lab.metrics_requests), lab.open_sockets
    first = len(socket.frames)
    lab.page.wait_for_timeout(4000)
    # The panel shown: still one socket (never two followers), no poll.
    assert len(lab.metrics_requests) == start and lab.open_sockets == [socket]
    assert 2 <= len(socket.frames) - first <= 6, socket.frames
