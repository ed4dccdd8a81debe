"""`%%gputime`'s findings: no GPU work, copy-bound, sync-heavy, idle, throttled."""

from __future__ import annotations

import pytest
from timing_results import NO_GPU, codes, findings, ops

from jupyter_gpu.gputime.ops import (
    HOST_TO_DEVICE,
)
from jupyter_gpu.gputime.result import GpuBusy
from jupyter_gpu.gputime.stats import summarize


def test_cpu_only_ops_with_usable_gpu_is_no_gpu_work() -> None:
    [finding] = findings(ops=ops({"cpu": 1234}))
    assert (finding.code, finding.severity) == ("NO_GPU_WORK", "warn")
    assert "1,234" in finding.headline and "cuda:0" in finding.headline
    fix = "\n".join(finding.fix)
    assert "model.to(device)" in fix and "pin_memory" in fix


def test_zero_ops_is_no_torch_work() -> None:
    [finding] = findings(ops=ops({}))
    assert (finding.code, finding.severity) == ("NO_TORCH_WORK", "info")


@pytest.mark.parametrize("by_device", [{"cpu": 50}, {}])
def test_no_device_finding_without_usable_gpu(by_device: dict[str, int]) -> None:
    assert findings(ops=ops(by_device), availability=NO_GPU) == []


def test_gpu_ops_give_no_device_finding() -> None:
    assert findings(ops=ops({"cuda": 10, "cpu": 90})) == []


@pytest.mark.parametrize(("blocked", "first_time", "copy_bound"), [
    (0.6, 1.0, True),
    (0.5, 1.0, False),        # half is not over half
    (0.0009, 0.001, False),   # 90% but under the 1 ms floor
    (0.002, 0.003, True),
])
def test_copy_bound_when_blocked_over_half_the_first_run(blocked: float, first_time: float, copy_bound: bool) -> None:
    found = findings(ops=ops(blocking_seconds=blocked, copies={HOST_TO_DEVICE: 3}), first_time=first_time)
    assert ("COPY_BOUND" in codes(found)) is copy_bound


def test_copy_bound_needs_accelerator_ops() -> None:
    found = findings(ops=ops({"cpu": 10}, blocking_seconds=0.9), availability=NO_GPU)
    assert "COPY_BOUND" not in codes(found)


@pytest.mark.parametrize(("syncs", "heavy"), [(10, True), (9, False)])
def test_sync_heavy_from_ten_waits(syncs: int, heavy: bool) -> None:
    found = findings(ops=ops(syncs={".item()": syncs}))
    assert ("SYNC_HEAVY" in codes(found)) is heavy


def test_copy_bound_replaces_sync_heavy() -> None:
    found = findings(ops=ops(syncs={".item()": 50}, blocking_seconds=0.9))
    assert "COPY_BOUND" in codes(found) and "SYNC_HEAVY" not in codes(found)


@pytest.mark.parametrize(("times", "large"), [([1.0, 5.0], True), ([1.0, 1.5], False)])
def test_large_spread_from_stats(times: list[float], large: bool) -> None:
    assert ("LARGE_SPREAD" in codes(findings(stats=summarize(times)))) is large


def test_throttling_lists_reasons() -> None:
    [finding] = findings(throttle_reasons=["hw_slowdown", "sw_power_cap"])
    assert (finding.code, finding.severity) == ("GPU_THROTTLED", "warn")
    assert finding.evidence["throttle reasons"] == "hw_slowdown, sw_power_cap"


def test_mostly_idle_gpu_headline() -> None:
    [finding] = findings(ops=ops(), busy=GpuBusy(percent=23.0, samples=12, devices=["cuda:0"]))
    assert finding.code == "GPU_MOSTLY_IDLE"
    assert finding.headline == "GPU busy 23% of the cell: input pipeline or host-bound."


def test_busy_gpu_is_not_idle() -> None:
    assert findings(ops=ops(), busy=GpuBusy(percent=85.0, samples=12, devices=["cuda:0"])) == []


def test_idle_needs_accelerator_ops() -> None:
    found = findings(ops=ops({"cpu": 5}), availability=NO_GPU, busy=GpuBusy(percent=3.0, samples=5, devices=["0"]))
    assert "GPU_MOSTLY_IDLE" not in codes(found)


def test_cuda_initialised_by_cell_is_info() -> None:
    [finding] = findings(cuda_initialized_by_cell=True, first_time=1.5)
    assert (finding.code, finding.severity) == ("CUDA_INITIALIZED_BY_CELL", "info")
    assert finding.evidence["first run"] == "1.50 s"


def test_findings_ordered_warn_before_info() -> None:
    found = findings(ops=ops(syncs={".item()": 20}), stats=summarize([1.0, 9.0]), cuda_initialized_by_cell=True)
    assert codes(found) == ["LARGE_SPREAD", "SYNC_HEAVY", "CUDA_INITIALIZED_BY_CELL"]
    assert [f.severity for f in found] == ["warn", "info", "info"]
