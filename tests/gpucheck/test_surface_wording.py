"""Issue 52, point 4: one wording per surface. `jupyter-gpu check` and `./dev check` printed "Run this notebook on a
machine...", `%pip install ...`, "restart the kernel (Kernel → Restart Kernel)" and "Install packages from the
notebook with %pip" to a terminal, where the fix is `python -m pip` with the interpreter that runs torch and there is
no kernel to restart.

Every finding of the generated machines (tests/fixtures/machine_space.py: several hundred machines, every layer's
states) is rendered both ways: the notebook keeps its wording, the terminal gets none of it. Before the change, the
text `jupyter-gpu check` printed spoke of `%pip`, `%env`, a kernel to restart or a notebook on 383 of the 479
machines (every one of them has a fix line).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from machine_space import machine_states

from jupyter_gpu.gpucheck.diagnose.engine import diagnose
from jupyter_gpu.gpucheck.surface import TERMINAL, for_terminal

MACHINES = machine_states(480)
NOTEBOOK_ONLY = re.compile(r"%pip|%env|Kernel →|Kernel >|[Rr]estart the kernel|this kernel|this notebook|"
                           r"the notebook from the top|!pip")


def _reports():
    for machine in MACHINES:
        yield diagnose(machine.snapshot())


def test_no_terminal_line_of_any_generated_machine_speaks_of_a_notebook() -> None:
    worded = 0
    for report in _reports():
        terminal = report.worded_for(TERMINAL)
        text = str(terminal)
        assert not NOTEBOOK_ONLY.search(text), text
        for before, after in zip(report.findings, terminal.terminal_findings, strict=True):
            for notebook_line, terminal_line in zip(before.fix, after.fix, strict=True):
                if "%pip" in notebook_line:
                    worded += 1
                    assert f"{report.python} -m pip" in terminal_line, (notebook_line, terminal_line)
    assert worded >= 50  # the machines do reach the pip fixes


def test_the_notebook_keeps_its_own_wording_and_the_json_carries_both() -> None:
    seen = 0
    for report in _reports():
        data = report.to_dict(include_facts=False)
        for finding, shown in zip(report.findings, data["findings"], strict=True):
            assert shown["fix"] == finding.fix  # the notebook's
            assert shown["fix_terminal"] == [for_terminal(line, report.python) for line in finding.fix]
            if any("%pip" in line for line in finding.fix):
                seen += 1
                assert "%pip" in str(report) and "%pip" in report._repr_html_()
    assert seen >= 50


@pytest.mark.parametrize(("notebook", "terminal"), [
    ("%pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu128",
     "/opt/py/bin/python -m pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu128"),
    ("Then restart the kernel (Kernel → Restart Kernel) so the new torch is the one imported.",
     "Then start Python again so the new torch is the one imported."),
    ("Unset it before torch first uses CUDA: %env CUDA_VISIBLE_DEVICES=0  (then restart the kernel)",
     "Unset it before torch first uses CUDA: export CUDA_VISIBLE_DEVICES=0  (then start Python again)"),
    ("Run this notebook on a machine or cloud instance with an NVIDIA GPU.",
     "Run this on a machine or cloud instance with an NVIDIA GPU."),
    ("Install packages from the notebook with %pip, which targets this kernel.",
     "Install packages with /opt/py/bin/python -m pip, which targets this Python."),
    ("Kernel → Restart Kernel, then run the notebook from the top.",
     "Start Python again, then run your script from the top."),
])
def test_each_notebook_phrase_has_its_terminal_form(notebook: str, terminal: str) -> None:
    assert for_terminal(notebook, "/opt/py/bin/python") == terminal


def test_a_path_with_spaces_is_quoted_for_the_shell() -> None:
    assert for_terminal("%pip install torch", "/Users/a b/py/bin/python") == \
        "'/Users/a b/py/bin/python' -m pip install torch"


@pytest.mark.probe_children  # the real check in a child process: the whole suite, not the fast loop
def test_the_command_line_prints_the_terminal_wording_and_its_json_both(tmp_path) -> None:
    # A CPU-only torch on a GPU machine, from the generated space: the fix is a reinstall from the CUDA index.
    machine = next(m for m in MACHINES if any("%pip install" in line for f in diagnose(m.snapshot()).findings
                                              for line in f.fix))
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(machine.snapshot()))
    done = subprocess.run([sys.executable, "-m", "jupyter_gpu", "check", "--facts", str(facts)],
                          capture_output=True, text=True, timeout=120)
    assert "-m pip install" in done.stdout and not NOTEBOOK_ONLY.search(done.stdout), done.stdout
    data = json.loads(subprocess.run([sys.executable, "-m", "jupyter_gpu", "check", "--facts", str(facts), "--json"],
                                     capture_output=True, text=True, timeout=120).stdout)
    assert data["surface"] == "terminal"
    assert any("%pip" in line for finding in data["findings"] for line in finding["fix"])
    assert all("%pip" not in line for finding in data["findings"] for line in finding["fix_terminal"])


def test_every_notebook_phrase_written_in_the_rules_has_a_terminal_form() -> None:
    # The generated machines reach 25 of the catalogue's codes; the rules' own wording is checked here, every string
    # literal of gpucheck/diagnose that speaks of %pip, a kernel or a notebook, whether a machine reaches it or not.
    rules = Path(__file__).resolve().parents[2] / "jupyter_gpu" / "gpucheck" / "diagnose"
    phrases = [(path.name, node.value) for path in sorted(rules.glob("*.py"))
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Constant) and isinstance(node.value, str) and NOTEBOOK_ONLY.search(node.value)]
    assert len(phrases) > 40
    left = [(name, text) for name, text in phrases if NOTEBOOK_ONLY.search(for_terminal(text, "python"))]
    assert not left, left


@pytest.mark.probe_children  # runs the CLI as a process: the whole suite's, not the fast loop's
def test_the_distributed_checks_words_have_a_terminal_form_and_the_cli_prints_it() -> None:
    # `jupyter-gpu check --distributed` printed "Run `%gpucheck`: it names ... the exact `%pip install` line" and
    # "`%gpucheck` (or `jupyter-gpu check`) says ..." to a terminal. The launch table's "checked from a notebook:
    # `%gpucheck --distributed` there" stays: those launches can only be checked from a notebook.
    magic = re.compile(NOTEBOOK_ONLY.pattern + r"|`%gpucheck`")
    rooms = Path(__file__).resolve().parents[2] / "jupyter_gpu" / "distributed"
    phrases = [(path.name, node.value) for path in [*sorted(rooms.glob("*rules.py")), rooms / "readiness.py"]
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Constant) and isinstance(node.value, str) and magic.search(node.value)]
    assert len(phrases) >= 3
    left = [(name, text) for name, text in phrases if magic.search(for_terminal(text, "python"))]
    assert not left, left
    assert for_terminal("`%gpucheck` (or `jupyter-gpu check`) says why", "python") == "`jupyter-gpu check` says why"
    done = subprocess.run([sys.executable, "-m", "jupyter_gpu", "check", "--distributed"], capture_output=True,
                          text=True, timeout=120)
    findings = [line for line in done.stdout.splitlines() if "checked from a notebook" not in line]
    assert not [line for line in findings if magic.search(line)], done.stdout
