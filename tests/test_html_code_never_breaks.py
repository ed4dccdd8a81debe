"""Issue 52, points 1, 2 and 7 at the HTML level: a command or code a user copies never breaks inside a word, and
tables are tables with numbers right-aligned. In JupyterLab and Notebook 7 every `pre` of an output inherits
`word-break: break-all` (`.jp-OutputArea-output pre`): the Fix block wrapped `https://download.pytorch.or` /
`g/whl/cu128`; `%%gpuprofile --apply`'s before-and-after was a `<pre>` dump of a text table.

Every `<pre>` and `<code>` of our HTML must say how it wraps (scroll, or at spaces only), checked on every finding of
the generated machines and on a --apply report. First run, before the change: 2 of 3 failed (the third guards that
the text rendering kept its content through the change). (Screenshots at
800 px in a browser are not taken by this file.)
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

from machine_space import machine_states

from jupyter_gpu.gpucheck.diagnose.engine import diagnose
from jupyter_gpu.gpuprofile.result import AppliedFixes
from jupyter_gpu.rendering.kit import CODE_BLOCK_STYLE, CODE_INLINE_STYLE

sys.path.insert(0, str(Path(__file__).parent / "gpuprofile"))
from test_gpuprofile_pure import profile
from test_neighbours_commands import _runs

PRE = re.compile(r"<pre(?P<attrs>[^>]*)>")
CODE = re.compile(r"<code(?P<attrs>[^>]*)>")


def unbreakable(html: str) -> list[str]:
    """The <pre> and <code> tags of `html` that do not say how they wrap."""
    bad = [m.group(0) for m in PRE.finditer(html) if CODE_BLOCK_STYLE not in m.group("attrs")]
    return bad + [m.group(0) for m in CODE.finditer(html) if CODE_INLINE_STYLE not in m.group("attrs")
                  and "word-break:normal" not in m.group("attrs")]


def test_no_fix_block_of_any_generated_machine_breaks_a_word() -> None:
    blocks = 0
    for machine in machine_states(480):
        html = diagnose(machine.snapshot())._repr_html_()
        blocks += len(PRE.findall(html))
        assert not [m for m in PRE.finditer(html) if CODE_BLOCK_STYLE not in m.group("attrs")], html
    assert blocks > 400


def applied_report():
    before = _runs(0.021, "fp32", 1e9 / 0.021 / 0.20, 1e9)
    after = _runs(0.010, "bf16", 1e9 / 0.010 / 0.18, 1e9)
    applied = AppliedFixes(applied=["bf16 autocast"], left_out=[("fused AdamW", "did not help on this step (0.98x)")],
                           checked=["%speedprobe profile_train_step --try amp-bf16 --steps 8"],
                           code=["model.train()"], before=before, after=after)
    return replace(profile(), applied=applied)


def test_apply_is_html_tables_with_numbers_right_aligned_and_a_code_block() -> None:
    html = applied_report()._repr_html_()
    section = html[html.index("--apply: before and after"):]
    assert "<pre>" not in section and section.count("<table") == 2
    # the before/after columns: right-aligned, never wrapped
    assert re.search(r'<td style="text-align:right;white-space:nowrap[^"]*">21\.0 ms</td>', section), section
    assert "model.train()" in section and f'<pre style="{CODE_BLOCK_STYLE}">' in section
    assert not unbreakable(html), unbreakable(html)


def test_the_text_rendering_keeps_the_same_content() -> None:
    text = str(applied_report())
    section = text[text.index("--apply"):]
    assert "applied: bf16 autocast" in section and "left out: did not help on this step (0.98x)" in section
    assert "    model.train()" in section and "measured with: %speedprobe profile_train_step" in section


def test_the_steps_sparkline_is_glyphs_in_text_and_bars_in_the_browser() -> None:
    # Chromium's default monospace font drew ██████▇▇ as one solid black bar.
    seconds = [0.1, 0.12, 0.09, 0.3, 0.1, 0.11]
    buckets = [{"data": s / 2, "forward": s / 2} for s in seconds]
    result = replace(profile(), step_seconds=seconds, step_buckets=buckets)
    glyphs = set("▁▂▃▄▅▆▇█")
    assert glyphs & set(str(result))  # the text keeps its sparkline
    html = result._repr_html_()
    assert not glyphs & set(html), html
    assert "each profiled step in the order it ran" in html  # the same order, drawn with CSS bars
