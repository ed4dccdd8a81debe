"""Issue 52, point 5: simulated and real never mixed silently. With `JUPYTER_GPU_BACKEND=simulated:h200`, the panels
and the status bar showed an H200 while `%gpucheck`, in the same kernel, said "no NVIDIA GPU is visible on this
machine", with nothing saying which was which. First run, before the change: both tests failed (no such line; the
variable was not among the facts gathered).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from html import escape

import pytest
from machine_space import machine_states

from jupyter_gpu.gpucheck.diagnose.engine import diagnose

SNAPSHOT = machine_states(20)[3].snapshot()


def with_backend(value: str | None) -> dict:
    snapshot = json.loads(json.dumps(SNAPSHOT))
    snapshot.setdefault("context", {}).pop("simulated", None)  # a real machine's facts (the space marks its own)
    snapshot.setdefault("env", {}).pop("JUPYTER_GPU_BACKEND", None)
    if value is not None:
        snapshot["env"]["JUPYTER_GPU_BACKEND"] = value
    return snapshot


def test_a_simulated_or_replayed_panel_backend_is_said_beside_the_real_check() -> None:
    for backend in ("simulated:h200", "replay:/data/h200.json"):
        report = diagnose(with_backend(backend))
        line = f"The panels and %gpupanel show {backend} (JUPYTER_GPU_BACKEND), not this machine's GPUs"
        assert line in str(report) and escape(line) in report._repr_html_()
        assert str(report).splitlines()[1].strip().startswith("The panels")  # right under the verdict
        assert report.to_dict(include_facts=False)["panels_note"].startswith("The panels")
    for quiet in (None, "nvml"):
        report = diagnose(with_backend(quiet))
        assert "The panels" not in str(report) and report.panels_note is None
    simulated_check = with_backend("simulated:h200")
    simulated_check["context"]["simulated"] = True  # the check itself simulated: its own [simulated] label says it
    assert diagnose(simulated_check).panels_note is None


@pytest.mark.probe_children  # the real check in a child process: the whole suite, not the fast loop
def test_the_command_line_gathers_the_variable_and_says_it() -> None:
    env = {**os.environ, "JUPYTER_GPU_BACKEND": "simulated:h200"}
    done = subprocess.run([sys.executable, "-m", "jupyter_gpu", "check"], capture_output=True, text=True, env=env,
                          timeout=180)
    assert "The panels and %gpupanel show simulated:h200 (JUPYTER_GPU_BACKEND)" in done.stdout, done.stdout
    assert "this check reads the real machine" in done.stdout
