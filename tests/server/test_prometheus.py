"""The Prometheus text endpoint's body: the same figures as the panel, scrapeable, nothing faked."""

from __future__ import annotations

import re

from jupyter_gpu.metrics.sample import DeviceSample, GpuProcess, Sample
from jupyter_gpu.server.attribution import attribute
from jupyter_gpu.server.kernels import KernelInfo
from jupyter_gpu.server.processes import ProcessInfo
from jupyter_gpu.server.prometheus import escape_label, render

# name{labels} value: the exposition format's sample line.
LINE = re.compile(r'^[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? -?[0-9.e+-]+$')


def metric(text: str, name: str) -> dict[str, str]:
    return {line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1] for line in text.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")}


def test_every_line_is_valid_exposition_format_with_help_and_type() -> None:
    device = DeviceSample(0, 'Evil "GPU"\\\n', "GPU-1", utilization_gpu=42.0, memory_used=5, memory_total=10,
                          throttle_reasons=("sw_power_cap",), processes=(GpuProcess(77, 5),))
    kernels = [KernelInfo("k1", "python3", 77, "idle", None, None, ('a "b".ipynb',))]
    sample = Sample(1.5, "nvml", False, devices=(device,))
    text = render(sample, attribute(sample, kernels, lambda pid: ProcessInfo(pid, 1, 0, "x"), 0))
    for line in text.splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or LINE.match(line), line
    assert metric(text, "jupyter_gpu_utilization_percent") == {
        'jupyter_gpu_utilization_percent{gpu="0",uuid="GPU-1",name="Evil \\"GPU\\"\\\\\\n"}': "42.0"}
    assert metric(text, "jupyter_gpu_throttled") == {
        'jupyter_gpu_throttled{gpu="0",uuid="GPU-1",name="Evil \\"GPU\\"\\\\\\n"}': "1"}
    assert metric(text, "jupyter_gpu_holder_memory_bytes") == {
        'jupyter_gpu_holder_memory_bytes{gpu="0",kind="kernel",kernel_id="k1",notebook="a \\"b\\".ipynb"}': "5"}


def test_a_field_the_gpu_does_not_report_is_left_out_not_zero() -> None:
    sample = Sample(1.0, "nvml", False, devices=(DeviceSample(0, "A", "U", memory_used=1, memory_total=2),))
    text = render(sample, [])
    assert "jupyter_gpu_utilization_percent" not in text
    assert "jupyter_gpu_temperature_celsius" not in text
    assert metric(text, "jupyter_gpu_memory_used_bytes") == {
        'jupyter_gpu_memory_used_bytes{gpu="0",uuid="U",name="A"}': "1"}


def test_no_driver_and_no_reading_yet_are_up_zero() -> None:
    assert metric(render(None, []), "jupyter_gpu_up") == {"jupyter_gpu_up": "0"}
    text = render(Sample(1.0, "nvml", False, status="no_driver", message="NVML Shared Library Not Found"), [])
    assert metric(text, "jupyter_gpu_up") == {'jupyter_gpu_up{backend="nvml",simulated="false"}': "0"}


def test_a_lost_gpu_is_device_ok_zero() -> None:
    sample = Sample(1.0, "nvml", False, devices=(DeviceSample(0, "H200", "U", status="lost", error="gone"),))
    assert metric(render(sample, []), "jupyter_gpu_device_ok") == {
        'jupyter_gpu_device_ok{gpu="0",uuid="U",name="H200"}': "0"}


def test_escape_label() -> None:
    assert escape_label('a\\b"c\nd') == 'a\\\\b\\"c\\nd'


def test_each_kernel_holding_memory_has_its_idle_seconds_with_the_memory_gauges_labels() -> None:
    device0 = DeviceSample(0, "H200", "GPU-0", processes=(GpuProcess(77, 5 << 30), GpuProcess(88, 1 << 30),
                                                          GpuProcess(99, 2 << 30)))
    device1 = DeviceSample(1, "H200", "GPU-1", processes=(GpuProcess(77, 3 << 30),))
    now = 10_000.0
    kernels = [KernelInfo("idle-kernel", "python3", 77, "idle", now - 3600.5, None, ("forgotten.ipynb",)),
               KernelInfo("busy-kernel", "python3", 88, "busy", now - 5, now - 5, ("training.ipynb",)),
               KernelInfo("new-kernel", "python3", 99, "starting", None, None, ("new.ipynb",))]
    sample = Sample(now, "nvml", False, devices=(device0, device1))
    text = render(sample, attribute(sample, kernels, lambda pid: ProcessInfo(pid, 1, 0, "python"), 0))
    memory = metric(text, "jupyter_gpu_holder_memory_bytes")
    idle = metric(text, "jupyter_gpu_kernel_idle_seconds")
    labels = {series.partition("{")[2]: value for series, value in idle.items()}
    assert labels == {'gpu="0",kind="kernel",kernel_id="idle-kernel",notebook="forgotten.ipynb"}': "3600.5",
                      'gpu="1",kind="kernel",kernel_id="idle-kernel",notebook="forgotten.ipynb"}': "3600.5",
                      'gpu="0",kind="kernel",kernel_id="busy-kernel",notebook="training.ipynb"}': "0.0"}
    # Each idle series has a memory series with exactly the same labels; a starting kernel's state says neither.
    assert {series.partition("{")[2] for series in memory} >= set(labels)
    assert "new-kernel" in "".join(memory) and "new-kernel" not in "".join(idle)
    assert "# TYPE jupyter_gpu_kernel_idle_seconds gauge" in text
