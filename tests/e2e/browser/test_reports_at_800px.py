"""Issue 52, point 1: every magic's report read in the browser at a common width. In a 1200 px window with the file
browser open, JupyterLab's output area is about 800 px, and Notebook 7's is similar; there the Fix block of
%gpucheck broke `https://download.pytorch.or` / `g/whl/cu128` and `importe` / `d.`, and number cells ("119 ms")
wrapped onto two lines.

Each example notebook (their stored outputs are every magic's example output) is opened in JupyterLab and in
Notebook 7 at that width, and for every HTML output of ours:
- no `pre` or `code` breaks words (its computed `word-break` is not `break-all`, its `overflow-wrap` not `anywhere`);
- no right-aligned number cell of a table wraps (it is one line high);
- a screenshot of the output is written to the folder the test names (JUPYTER_GPU_SCREENSHOTS, else a temporary
  folder; docs/internals.md says how to regenerate them).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from lab_server import TOKEN

REPO = Path(__file__).resolve().parents[3]
NOTEBOOKS = sorted(path.name for path in (REPO / "example_notebooks").glob("0*.ipynb"))

# What the page reports for our HTML outputs: word-breaking code, wrapped number cells, and the output area's width.
CHECK = """() => {
  const ours = [...document.querySelectorAll('.jp-OutputArea-output.jp-RenderedHTMLCommon')];
  const breaking = [], wrapped = [];
  for (const out of ours) {
    for (const el of out.querySelectorAll('pre, code')) {
      const cs = getComputedStyle(el);
      if (cs.wordBreak === 'break-all' || cs.overflowWrap === 'anywhere') breaking.push(el.outerHTML.slice(0, 160));
    }
    for (const td of out.querySelectorAll('td')) {
      if (getComputedStyle(td).textAlign !== 'right' || !td.textContent.trim()) continue;
      // The lines the cell's own text takes (a tall row is not a wrapped number: another cell made it tall).
      const range = document.createRange();
      range.selectNodeContents(td);
      const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
      if (tops.size > 1) wrapped.push(td.textContent.trim());
    }
  }
  const widths = ours.map(out => out.getBoundingClientRect().width).filter(w => w > 0);
  return {outputs: ours.length, breaking, wrapped, width: widths.length ? Math.max(...widths) : 0};
}"""


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get("JUPYTER_GPU_SCREENSHOTS") or tmp_path_factory.mktemp("report-screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"screenshots of every report at 800 px: {folder}")
    return folder


# The window each surface is read in: JupyterLab at 1200 px with its file browser open (an output area of about
# 800 px, as the issue measured it); Notebook 7 has no side bar, so its window is narrower for the same output width.
WINDOW = {"lab": 1200, "notebooks": 900}


@pytest.mark.parametrize("surface", ["lab", "notebooks"])
def test_every_report_reads_right_at_800_px(browser, lab_a100, shots: Path, surface: str) -> None:
    folder = lab_a100.root / "reports"
    folder.mkdir(exist_ok=True)
    for name in NOTEBOOKS:
        shutil.copy(REPO / "example_notebooks" / name, folder / name)
    # Every cell in the page at once: JupyterLab 4 renders only the cells in view by default (windowing).
    reply = lab_a100.request("lab/api/settings/@jupyterlab/notebook-extension:tracker", method="PUT",
                             body={"raw": json.dumps({"windowingMode": "none"})})
    assert reply.status in (200, 204), reply.body
    context = browser.new_context(viewport={"width": WINDOW[surface], "height": 900})
    page = context.new_page()
    problems: list[str] = []
    try:
        for name in NOTEBOOKS:
            cells = len(json.loads((folder / name).read_text())["cells"])
            page.goto(f"{lab_a100.base}{surface}/{'tree/' if surface == 'lab' else ''}reports/{name}"
                      f"?{'reset&' if surface == 'lab' else ''}token={TOKEN}")
            page.wait_for_function(f"document.querySelectorAll('.jp-Notebook .jp-Cell').length >= {cells}",
                                   timeout=90_000)
            page.wait_for_timeout(1000)  # the outputs render and their layout settles
            seen = page.evaluate(CHECK)
            if seen["outputs"]:
                assert 700 <= seen["width"] <= 900, (name, surface, seen["width"])  # about 800 px, as a user sees it
            problems += [f"{surface} {name}: breaks words: {html}" for html in seen["breaking"]]
            problems += [f"{surface} {name}: a number wraps: {text!r}" for text in seen["wrapped"]]
            for index, output in enumerate(page.locator(".jp-OutputArea-output.jp-RenderedHTMLCommon").all()):
                output.scroll_into_view_if_needed()
                output.screenshot(path=str(shots / f"{surface}-{name.removesuffix('.ipynb')}-{index:02d}.png"))
    finally:
        context.close()
    assert not problems, "\n".join(problems)
    assert len(list(shots.glob(f"{surface}-*.png"))) >= len(NOTEBOOKS)
