"""The torch child starts as soon as the host files show a GPU, beside the base child, not after it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fake_machine import Machine

from jupyter_gpu.facts.context import ProbeContext
from jupyter_gpu.facts.gather import gather_facts
from jupyter_gpu.gpucheck.diagnose.engine import diagnose

SLOW_S = 1.0


def slow_base_child(ctx: ProbeContext) -> None:
    """The base child imports pynvml: make that import take SLOW_S."""
    pynvml = Path(ctx.env["PYTHONPATH"]) / "pynvml.py"
    pynvml.write_text(f"import time\ntime.sleep({SLOW_S})\n" + pynvml.read_text())


def timed_gather(ctx: ProbeContext) -> tuple[float, dict]:
    started = time.monotonic()
    snapshot = gather_facts(ctx)
    return time.monotonic() - started, snapshot


@pytest.mark.timing
def test_torch_and_base_children_run_at_the_same_time(lay_out):
    ctx = lay_out(Machine().nvidia_host().cuda_torch(hang_s=SLOW_S))
    slow_base_child(ctx)
    elapsed, snapshot = timed_gather(ctx)
    base, torch = snapshot["probe"]["base"], snapshot["probe"]["torch"]
    assert base["wall_s"] >= SLOW_S and torch["wall_s"] >= SLOW_S and torch["ran"]
    # One after the other would take over 2 s; side by side about 1.1 s (generous: 2 noisy cores).
    assert elapsed < 2 * SLOW_S - 0.25, f"{elapsed:.2f} s: the children ran one after the other"
    assert diagnose(snapshot).status == "ok"


def test_nvml_alone_still_leads_to_a_torch_child_afterwards(lay_out):
    # No PCI device, node or driver file: only the base child (NVML) can tell there is a GPU.
    machine = Machine().nvidia_host().cuda_torch()
    machine.pci, machine.nodes, machine.files, machine.symlinks = [], [], {}, {}
    snapshot = gather_facts(lay_out(machine))
    record = snapshot["probe"]["torch"]
    assert record["ran"] and record["ok"] and record["reason"] == "GPU evidence: NVML ok"
    assert snapshot["torch"]["device_count"] == 1


def test_a_child_started_early_is_dropped_when_torch_is_not_installed(lay_out):
    snapshot = gather_facts(lay_out(Machine().nvidia_host()))  # a GPU, but no torch in this environment
    assert snapshot["torch"] is None
    assert snapshot["probe"]["torch"] == {"ran": False, "cached": False,
                                          "reason": "torch is not importable, so there is nothing to import"}
    assert diagnose(snapshot).primary.code == "TORCH_NOT_INSTALLED"


def test_a_hanging_torch_child_started_early_still_times_out(lay_out):
    ctx = lay_out(Machine().nvidia_host().cuda_torch(hang_s=30), probe_timeout_s=1.5)
    elapsed, snapshot = timed_gather(ctx)
    record = snapshot["probe"]["torch"]
    assert record["timed_out"] and record["timeout_s"] == 1.5 and not record["ok"]
    assert elapsed < 10, "the hanging child was waited for past its time limit"
