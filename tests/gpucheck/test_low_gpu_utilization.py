"""Was the GPU busy during the last long cell? Sampler readings in the snapshot's notebook activity -> the stack's
"last long cell" row and LOW_GPU_UTILIZATION. The diagnosis is a pure function of the snapshot."""

from __future__ import annotations

import pytest
from fake_machine import Machine

from jupyter_gpu.facts.gather import gather_facts
from jupyter_gpu.gpucheck.diagnose.engine import diagnose

PID = 4242
UUID_A = "1b2c3d4e-0000-1111-2222-333344445555"  # as torch prints it; NVML says GPU-<the same>
UUID_B = "2f3e4d5c-0000-1111-2222-333344445555"
START = 1_000_000.0


def activity(utilization: float, *, seconds: float = 30.0, pids: list[int] | None = None, every: float = 1.0,
             cells: list[dict] | None = None, simulated: bool = False) -> dict:
    readings = [{"t": START + every * (i + 1), "devices": [
        {"index": 0, "uuid": f"GPU-{UUID_A}", "name": "NVIDIA H100", "utilization_gpu": utilization,
         "pids": [PID] if pids is None else pids},
        {"index": 1, "uuid": f"GPU-{UUID_B}", "name": "NVIDIA H100", "utilization_gpu": 99.0, "pids": [999]}]}
        for i in range(int(seconds / every))]
    return {"pid": PID, "backend": "nvml", "simulated": simulated, "samples": readings,
            "cells": cells or [{"execution_count": 7, "started": START, "ended": START + seconds},
                               {"execution_count": 8, "started": START + seconds + 1, "ended": START + seconds + 1.5}]}


@pytest.fixture
def check_activity(lay_out):
    def check(notebook_activity: dict, **in_kernel):
        snapshot = gather_facts(lay_out(Machine().nvidia_host().cuda_torch()),
                                notebook={"torch_imported": False, "activity": notebook_activity})
        if in_kernel:
            snapshot["in_kernel"] = {"torch_imported": True, **in_kernel}
        return diagnose(snapshot)
    return check


def low(report):
    return next((f for f in report.findings if f.code == "LOW_GPU_UTILIZATION"), None)


def test_a_kernel_holding_the_gpu_that_barely_used_it_gets_a_warning(check_activity):
    report = check_activity(activity(4.0))
    finding = low(report)
    assert finding.severity == "warn"
    assert finding.headline.startswith("The GPU was busy 4% of the time during In [7] (30 s)")
    assert finding.evidence["gpus"] == ["GPU 0"]  # only the GPU NVML lists this kernel on, not the busy GPU 1
    assert finding.fix[0].startswith("%%gpuprofile") and finding.fix[1].startswith("%%gputime")
    assert "In [7], 30 s: GPU 0 busy 4% on average (30 readings)" in str(report)


def test_a_busy_gpu_gives_only_the_stack_row(check_activity):
    report = check_activity(activity(87.0))
    assert low(report) is None
    assert report.stack.last_cell.utilization_percent == 87.0
    assert "last long cell" in str(report) and "GPU 0 busy 87% on average" in str(report)


def test_a_gpu_this_kernel_never_held_is_not_blamed_on_it(check_activity):
    report = check_activity(activity(2.0, pids=[]))  # NVML lists no process of this kernel, CUDA not started
    assert low(report) is None
    assert report.stack.last_cell.held_gpu is False


def test_a_cuda_context_counts_as_holding_the_gpu_when_nvml_shows_host_pids(check_activity):
    # In a container NVML lists host PIDs, so the kernel's own PID is missing: its CUDA context still counts.
    uuid_only = activity(3.0, pids=[123456])
    report = check_activity(uuid_only, cuda_initialized=True, device_count=1,
                            devices=[{"index": 0, "name": "NVIDIA H100", "uuid": UUID_A}])
    finding = low(report)
    assert finding is not None and finding.evidence["gpus"] == ["GPU 0"]  # matched by the CUDA device's UUID


def test_a_short_cell_is_not_a_long_cell(check_activity):
    assert check_activity(activity(1.0, seconds=4.0)).stack.last_cell is None  # under five seconds


def test_an_unwatched_long_cell_says_nothing(check_activity):
    sparse = activity(1.0, seconds=30.0, every=15.0)  # two readings cannot say how busy a GPU was
    report = check_activity(sparse)
    assert report.stack.last_cell is None and low(report) is None


def test_simulated_readings_are_labelled(check_activity):
    report = check_activity(activity(5.0, simulated=True))
    assert low(report).evidence["backend"] == "simulated"
    assert "[simulated]" in next(line for line in str(report).splitlines() if "last long cell" in line)
