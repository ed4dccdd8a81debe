"""Takes the side panel's screenshots for docs/side-panel.md (simulated GPUs, real JupyterLab and kernels).

    .venv/bin/python scripts/screenshot_side_panel.py      # writes docs/side-panel.png, docs/side-panel-nodriver.png

Three notebooks hold simulated memory on eight A100s: one idle for a while, one busy in a cell (a 10-minute
sleep) on a GPU that does nothing, so the panel raises "GPU idle while a kernel is busy".
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
sys.path.insert(0, str(ROOT / "tests" / "e2e" / "browser"))

from jupyter_client import BlockingKernelClient  # noqa: E402
from lab_server import TOKEN, chromium_path, start_lab_server  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]


def shoot(scenario: str, out: Path, setup) -> None:
    server = start_lab_server(Path(tempfile.mkdtemp()), scenario, interval=1.0)
    try:
        setup(server)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 1500})
            page.goto(f"{server.base}lab?token={TOKEN}")
            page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
            page.click('.jp-SideBar [data-id="jupyter-gpu-panel"]')
            page.wait_for_selector(".jp-GpuPanel[data-state]:not([data-state=loading])", timeout=30_000)
            time.sleep(8)  # some history, and the idle-GPU alert (5 s into the busy cell)
            page.locator("#jp-right-stack").screenshot(path=str(out))
            browser.close()
        print(f"wrote {out}")
    finally:
        server.stop()


def notebooks(server) -> None:
    idle = server.new_notebook("Untitled3.ipynb")
    server.hold_memory(server.kernel_pid(idle["kernel"]["id"]), "22GB", device=4)
    busy = server.new_notebook("experiments/train-resnet.ipynb")
    server.hold_memory(server.kernel_pid(busy["kernel"]["id"]), "9GB", device=4)
    client = BlockingKernelClient(connection_file=str(server.connection_file(busy["kernel"]["id"])))
    client.load_connection_file()
    client.start_channels()
    client.execute("import time; time.sleep(600)")  # the kernel stays busy while the GPU idles
    time.sleep(2)


if __name__ == "__main__":
    docs = ROOT / "docs"
    shoot("a100x8-mig", docs / "side-panel.png", notebooks)
    shoot("nodriver", docs / "side-panel-nodriver.png", lambda server: None)
