"""The panel's alert rules: each fires on what it names, stays silent on missing data, says what to do."""

from __future__ import annotations

import pytest

from jupyter_gpu.metrics.alerts import (
    IDLE_AFTER_S,
    KernelView,
    kernel_memory,
    sample_alerts,
    uses_device,
)
from jupyter_gpu.metrics.sample import DeviceSample, GpuProcess, Sample

GIB = 1024**3
ME = 4242
NOW = 1_000.0


def device(**values) -> DeviceSample:
    base = dict(index=0, name="NVIDIA H200", uuid="GPU-1", utilization_gpu=50.0, memory_used=10 * GIB,
                memory_total=100 * GIB, processes=(GpuProcess(ME, 8 * GIB),))
    base.update(values)
    return DeviceSample(**base)


def sample(*devices: DeviceSample, timestamp: float = NOW, **values) -> Sample:
    return Sample(timestamp, "simulated:test", True, devices=devices, **values)


def codes(alerts) -> list[str]:
    return [a.code for a in alerts]


def idle_history(percent: float, count: int = 6, start: float = NOW - 6) -> list[Sample]:
    return [sample(device(utilization_gpu=percent), timestamp=start + i) for i in range(count)]


KERNEL = KernelView(pids=frozenset({ME}))


def test_a_healthy_gpu_raises_nothing():
    assert sample_alerts(sample(device()), [], KERNEL) == []


@pytest.mark.parametrize(("used", "fires"), [(90 * GIB, False), (91 * GIB, True), (None, False)])
def test_memory_above_90_percent(used, fires):
    alerts = sample_alerts(sample(device(memory_used=used)), [], KERNEL)
    assert ("MEMORY_NEARLY_FULL" in codes(alerts)) is fires
    if fires:
        assert "91% full" in alerts[0].message and "out of memory" in alerts[0].message


def test_idle_gpu_while_a_cell_runs_points_at_gpucheck():
    kernel = KernelView(pids=frozenset({ME}), cell_started=NOW - 10)
    alerts = sample_alerts(sample(device(utilization_gpu=3.0)), idle_history(3.0), kernel)
    assert codes(alerts) == ["GPU_IDLE_DURING_CELL"]
    assert "input pipeline or host-bound" in alerts[0].message and "%gpucheck" in alerts[0].message
    assert "10.0 s" in alerts[0].message


@pytest.mark.parametrize(("kernel", "history", "why"), [
    (KernelView(pids=frozenset({ME})), idle_history(3.0), "no cell is running"),
    (KernelView(pids=frozenset({ME}), cell_started=NOW - IDLE_AFTER_S + 1), idle_history(3.0), "cell just started"),
    (KernelView(pids=frozenset({ME}), cell_started=NOW - 10), idle_history(30.0), "busy enough"),
    (KernelView(pids=frozenset({ME}), cell_started=NOW - 10), idle_history(3.0, count=2), "too few samples"),
    (KernelView(pids=frozenset({1}), cell_started=NOW - 10), idle_history(3.0), "this kernel is not on this GPU"),
    (KernelView(pids=frozenset({ME}), cell_started=NOW - 10), idle_history(3.0, start=NOW - 30), "idle before"),
])
def test_idle_rule_stays_silent(kernel, history, why):
    alerts = sample_alerts(sample(device(utilization_gpu=3.0)), history, kernel)
    assert "GPU_IDLE_DURING_CELL" not in codes(alerts), why


def test_idle_rule_counts_pytorch_memory_when_nvml_lists_host_pids():
    # In a container NVML lists host PIDs; PyTorch's allocator still shows the kernel is on this GPU.
    containered = device(utilization_gpu=1.0, processes=(GpuProcess(99999, 8 * GIB),), torch_reserved=2 * GIB)
    kernel = KernelView(pids=frozenset({ME}), cell_started=NOW - 10)
    history = [sample(containered, timestamp=NOW - 6 + i) for i in range(6)]
    assert "GPU_IDLE_DURING_CELL" in codes(sample_alerts(sample(containered), history, kernel))
    assert uses_device(containered, kernel) and kernel_memory(containered, kernel) == 2 * GIB


def test_thermal_and_power_throttling_name_the_reason():
    hot = device(throttle_reasons=("gpu_idle", "hw_thermal_slowdown"), temperature_c=89.0, sm_clock_mhz=1200.0)
    [alert] = sample_alerts(sample(hot), [], KERNEL)
    assert alert.code == "THROTTLED" and "thermal" in alert.message and "89 °C" in alert.message
    assert "1200 MHz" in alert.message
    [alert] = sample_alerts(sample(device(throttle_reasons=("sw_power_cap",))), [], KERNEL)
    assert "power throttling" in alert.message and "sw power cap" in alert.message


def test_normal_clock_states_are_not_throttling():
    calm = device(throttle_reasons=("gpu_idle", "applications_clocks_setting", "sync_boost"))
    assert sample_alerts(sample(calm), [], KERNEL) == []


def test_another_process_holding_most_memory():
    crowded = device(memory_used=70 * GIB, processes=(GpuProcess(ME, 5 * GIB), GpuProcess(777, 60 * GIB)))
    [alert] = sample_alerts(sample(crowded), [], KERNEL)
    assert alert.code == "OTHER_PROCESS_MEMORY" and "pid 777" in alert.message and "60.0 GiB" in alert.message


@pytest.mark.parametrize("processes", [None, (), (GpuProcess(777, None),), (GpuProcess(ME, 60 * GIB),)])
def test_other_process_rule_needs_a_known_figure_from_someone_else(processes):
    assert sample_alerts(sample(device(processes=processes)), [], KERNEL) == []


def test_lost_gpu_and_no_driver_are_failures_with_their_message():
    lost = DeviceSample(0, "NVIDIA H200", "GPU-1", status="lost", error="NVML reports GPU 0 is lost.")
    [alert] = sample_alerts(sample(lost), [], KERNEL)
    assert (alert.code, alert.severity, alert.message) == ("GPU_LOST", "fail", "NVML reports GPU 0 is lost.")
    [alert] = sample_alerts(sample(status="no_driver", message="NVML could not start."), [], KERNEL)
    assert (alert.code, alert.device, alert.message) == ("NO_GPU", None, "NVML could not start.")
    [alert] = sample_alerts(sample(status="error", message="Reading failed."), [], KERNEL)
    assert alert.code == "READ_FAILED"


def test_alerts_are_per_device():
    devices = (device(index=0), device(index=1, memory_used=99 * GIB))
    [alert] = sample_alerts(sample(*devices), [], KERNEL)
    assert alert.device == 1 and "GPU 1" in alert.message
