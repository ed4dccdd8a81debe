"""The start-up check's child process and the one line it leads to, with the real check on fake machines."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest
from fake_machine import Machine

from jupyter_gpu.autoload.notice import brief_line, failure_notice, first_fix
from jupyter_gpu.autoload.startup import CheckChild, outcome_of

REPO = Path(__file__).resolve().parents[2]
TAIL = "  (%gpucheck for details; JUPYTER_GPU_AUTOLOAD=0 silences this)"


def test_a_cpu_torch_on_a_gpu_machine_is_one_line_with_the_install_command(check_machine):
    report = check_machine(Machine().nvidia_host().cpu_torch())
    line = failure_notice(report.to_dict())
    brief = report.brief()
    assert line == f"jupyter-gpu: {brief.verdict} Fix: {brief.fix[0]}{TAIL}"
    assert "%pip install --force-reinstall torch==2.13.0 --index-url https://download.pytorch.org/whl/cu" in line
    assert "\n" not in line


def test_a_usable_gpu_gives_no_line(check_machine):
    report = check_machine(Machine().nvidia_host().cuda_torch())
    assert report.gpu_usable
    assert failure_notice(report.to_dict()) is None


def test_the_line_keeps_a_headline_the_verdict_does_not_say_and_stays_one_line(check_machine):
    report = check_machine(Machine().nvidia_host().cpu_torch())
    brief = replace(report.brief(), headline="Something else\nis wrong.", fix=["Do this:", "pip install x"])
    expected = f"jupyter-gpu: {brief.verdict} Something else is wrong. Fix: Do this: pip install x{TAIL}"
    assert brief_line(brief) == expected


def test_an_introduction_takes_its_command_along():
    assert first_fix(["On a machine with an NVIDIA GPU, install a CUDA build:", "%pip install torch"]) == \
        "On a machine with an NVIDIA GPU, install a CUDA build: %pip install torch"
    assert first_fix(["docker run --gpus all ...", "Kubernetes: ..."]) == "docker run --gpus all ..."
    assert first_fix([]) is None


def child_env(monkeypatch: pytest.MonkeyPatch, machine: Machine, tmp_path: Path, bare_python: str) -> None:
    """The child inherits the kernel's environment: make it a fake machine's, with jupyter_gpu importable."""
    ctx = machine.build(tmp_path, bare_python)
    monkeypatch.setenv("JUPYTER_GPU_ROOT", str(ctx.root))
    monkeypatch.setenv("PYTHONPATH", f"{ctx.env['PYTHONPATH']}:{REPO}")
    monkeypatch.chdir(ctx.cwd)


def test_the_child_runs_the_real_check_of_a_healthy_machine(monkeypatch, tmp_path, bare_python):
    child_env(monkeypatch, Machine().nvidia_host().cuda_torch(), tmp_path, bare_python)
    outcome = CheckChild(bare_python).wait()
    assert (outcome.status, outcome.notice) == ("ok", None)


def test_a_child_that_cannot_run_the_check_is_one_line_not_a_traceback(bare_python, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    outcome = CheckChild(bare_python).wait()  # a Python without jupyter_gpu: the child fails at once
    assert outcome.status is None
    assert outcome.notice == ("jupyter-gpu: the start-up GPU check could not run (the check process exited with "
                              f"status 1 and no report: {bare_python}: No module named jupyter_gpu); run %gpucheck "
                              f"to see why.{TAIL}")


def test_a_crashed_child_names_the_signal():
    outcome = outcome_of(-signal.SIGSEGV, b"", b"")
    assert outcome.notice.startswith("jupyter-gpu: the start-up GPU check could not run (the check process was "
                                     "killed by SIGSEGV); run %gpucheck to see why.")
    assert outcome_of(1, b'{"not": "a report"}', b"Traceback (most recent call last):\n  ...\nKeyError: 'x'\n"
                      ).notice.startswith("jupyter-gpu: the start-up GPU check could not run (the check process "
                                          "exited with status 1 and no report: KeyError: 'x')")


def test_a_stuck_child_is_ended_with_everything_it_started(monkeypatch, tmp_path, bare_python):
    # torch that hangs on import: the check's own probe waits for it (up to its 60 s limit) in a grandchild.
    child_env(monkeypatch, Machine().nvidia_host().cuda_torch(hang_s=60), tmp_path, bare_python)
    child = CheckChild(bare_python)
    started = time.monotonic()
    outcome = child.wait(timeout=3)
    assert time.monotonic() - started < 10
    assert outcome.notice.startswith("jupyter-gpu: the start-up GPU check could not run (it did not finish within "
                                     "3 s); run %gpucheck to see why.")
    group = child.process.pid  # its own session: the torch probe it started is in the same process group
    deadline = time.monotonic() + 5
    while _group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _group_alive(group)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
