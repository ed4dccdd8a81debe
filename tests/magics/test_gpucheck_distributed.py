"""`%gpucheck --distributed` in a real IPython shell, and `jupyter-gpu check --distributed` as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

CELL = """
from torch import nn
def train(rank):
    pass
model = nn.DataParallel(nn.Linear(4, 4))
"""


@pytest.fixture
def simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_GPU_BACKEND", "simulated:a100x8-mig")


def test_the_notebook_report_sees_its_functions_and_data_parallel(ip: InteractiveShell, simulated: None) -> None:
    ip.run_cell(CELL)
    with capture_output() as shown:
        report = ip.run_line_magic("gpucheck", "--distributed -o")
    assert "NV12" in shown.stdout or any("NV12" in o.data.get("text/plain", "") for o in shown.outputs)
    found = {f.code for f in report.findings}
    assert {"DIST_DATA_PARALLEL", "DIST_SPAWN_NOTEBOOK_FUNCTIONS", "DIST_NO_NCCL"} <= found
    spawn = next(m for m in report.launches if m.name == "spawn from this kernel")
    assert spawn.works is False and "train" in spawn.why
    assert next(m for m in report.launches if m.name == "fork from this kernel").works is True
    html = report._repr_html_()
    assert "[simulated]" in html and "DIST_DATA_PARALLEL" in html


def test_json_and_save_then_replay(ip: InteractiveShell, simulated: None, tmp_path: Path) -> None:
    saved = tmp_path / "facts.json"
    with capture_output() as printed:
        ip.run_line_magic("gpucheck", f"--distributed --json --save {saved}")
    as_json = json.loads(printed.stdout)
    assert as_json["simulated"] is True and as_json["facts"]["topology"]["source"] == "simulated:a100x8-mig"
    replayed = ip.run_line_magic("gpucheck", f"--distributed --facts {saved} -o -q")
    assert replayed.verdict == as_json["verdict"]


@pytest.mark.parametrize(("line", "words"), [
    ("--bench", "add --distributed"),
    ("--distributed --bench --facts x.json", "cannot replay"),
    ("--distributed model", "NAMEs only narrow"),
])
def test_bad_combinations_are_one_sentence(ip: InteractiveShell, line: str, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        ip.run_line_magic("gpucheck", line)


def test_a_file_that_is_no_snapshot_is_refused(ip: InteractiveShell, tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"schema": {"name": "jupyter-gpu/facts"}}')
    with pytest.raises(UsageError, match="not a distributed readiness snapshot"):
        ip.run_line_magic("gpucheck", f"--distributed --facts {other}")


def test_the_command_line_exits_one_on_a_failing_check() -> None:
    env = {**os.environ, "JUPYTER_GPU_BACKEND": "simulated:pcie-pair", "RANK": "5", "WORLD_SIZE": "2",
           "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}
    done = subprocess.run([sys.executable, "-m", "jupyter_gpu", "check", "--distributed"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "RANK=5 is outside 0..1 (WORLD_SIZE=2)" in done.stdout
    assert "PHB, no P2P" in done.stdout and "[simulated]" in done.stdout
