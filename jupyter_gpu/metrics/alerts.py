"""Plain warnings about what a GPU is doing, from samples alone: the rules every panel shows.

Pure Python (no IPython, widgets or NVML), so the notebook panel and the server panel say the same thing
in the same words. A rule that needs something a sample lacks (a utilisation the GPU does not report,
a process list NVML could not read) stays silent rather than guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from jupyter_gpu.metrics.sample import POWER_THROTTLES, THERMAL_THROTTLES, DeviceSample, Sample
from jupyter_gpu.rendering.units import format_bytes, format_seconds

MEMORY_FULL_FRACTION = 0.90
IDLE_UTILIZATION = 10.0  # percent
IDLE_AFTER_S = 5.0  # a cell must have run this long before low utilisation means anything
IDLE_MIN_SAMPLES = 3
OTHER_PROCESS_FRACTION = 0.5  # "most of the memory"



@dataclass(frozen=True)
class Alert:
    code: str
    severity: str  # "fail" or "warn", as in findings
    device: int | None  # NVML index; None for the whole sample
    message: str


@dataclass(frozen=True)
class KernelView:
    """What the panel knows about the kernel it sits in."""

    pids: frozenset[int] = frozenset()
    cell_started: float | None = None  # time.time() when the running cell began; None when idle


def uses_device(device: DeviceSample, kernel: KernelView) -> bool:
    """Whether this kernel holds memory on the device: listed by NVML, or PyTorch's own allocator says so.

    The allocator matters in containers, where NVML lists host PIDs that never match ours.
    """
    if device.torch_reserved:
        return True
    return any(p.pid in kernel.pids for p in device.processes or ())


def kernel_memory(device: DeviceSample, kernel: KernelView) -> int | None:
    """Bytes this kernel holds on the device: NVML's per-process figure, else PyTorch's reserved memory."""
    listed = [p.memory_used for p in device.processes or () if p.pid in kernel.pids and p.memory_used is not None]
    if listed:
        return sum(listed)
    return device.torch_reserved


def sample_alerts(sample: Sample, history: Sequence[Sample], kernel: KernelView) -> list[Alert]:
    """Every alert for one sample; `history` (oldest first) is what the panel kept, for the idle rule."""
    if sample.status != "ok":
        return [Alert("NO_GPU" if sample.status == "no_driver" else "READ_FAILED", "fail", None,
                      sample.message or "No GPU metrics.")]
    alerts: list[Alert] = []
    for device in sample.devices:
        # The utilisation history only matters while a cell runs: skip the walk through it otherwise.
        readings = _readings(history, device.index) if kernel.cell_started is not None else []
        alerts.extend(device_alerts(device, readings, kernel, sample.timestamp))
    return alerts


def idle_during_cell_alerts(sample: Sample, history: Sequence[Sample], kernel: KernelView) -> list[Alert]:
    """Only the "GPU idle while a cell runs" rule, for every device: the server checks it per busy kernel."""
    if sample.status != "ok" or kernel.cell_started is None:
        return []
    alerts = []
    for device in sample.devices:
        if device.status != "ok":
            continue
        alert = _idle_during_cell(device, _readings(history, device.index), kernel, sample.timestamp)
        if alert is not None:
            alerts.append(alert)
    return alerts


def device_alerts(device: DeviceSample, utilization_history: Sequence[tuple[float, float]],
                  kernel: KernelView, now: float) -> list[Alert]:
    """Alerts for one device; `utilization_history` is (timestamp, percent) for this device, oldest first."""
    if device.status != "ok":
        return [Alert("GPU_LOST" if device.status == "lost" else "GPU_READ_FAILED", "fail", device.index,
                      device.error or f"{device.label} cannot be read.")]
    alerts: list[Alert] = []
    label = f"GPU {device.index}"
    fraction = device.memory_fraction
    if fraction is not None and fraction > MEMORY_FULL_FRACTION:
        alerts.append(Alert("MEMORY_NEARLY_FULL", "warn", device.index,
                            f"{label} memory is {fraction:.0%} full ({format_bytes(device.memory_used)} of "
                            f"{format_bytes(device.memory_total)}): the next allocation may fail with out of "
                            "memory."))
    idle = _idle_during_cell(device, utilization_history, kernel, now)
    if idle is not None:
        alerts.append(idle)
    throttle = _throttle(device)
    if throttle is not None:
        alerts.append(throttle)
    other = _other_process(device, kernel)
    if other is not None:
        alerts.append(other)
    return alerts


def _readings(history: Iterable[Sample], index: int) -> list[tuple[float, float]]:
    readings = []
    for sample in history:
        for device in sample.devices:
            if device.index == index and device.utilization_gpu is not None:
                readings.append((sample.timestamp, device.utilization_gpu))
    return readings


def _idle_during_cell(device: DeviceSample, history: Sequence[tuple[float, float]], kernel: KernelView,
                      now: float) -> Alert | None:
    if kernel.cell_started is None or now - kernel.cell_started < IDLE_AFTER_S or not uses_device(device, kernel):
        return None
    during = [percent for stamp, percent in history if stamp >= kernel.cell_started]
    if len(during) < IDLE_MIN_SAMPLES:
        return None
    mean = sum(during) / len(during)
    if mean >= IDLE_UTILIZATION:
        return None
    running = format_seconds(now - kernel.cell_started)
    return Alert("GPU_IDLE_DURING_CELL", "warn", device.index,
                 f"GPU {device.index} is {mean:.0f}% busy while a cell has run for {running}: input pipeline or "
                 "host-bound: see %gpucheck.")


def _throttle(device: DeviceSample) -> Alert | None:
    reasons = set(device.throttle_reasons or ())
    thermal = sorted(reasons & THERMAL_THROTTLES)
    power = sorted(reasons & POWER_THROTTLES)
    if not thermal and not power:
        return None
    kind = "thermal" if thermal else "power"
    detail = ", ".join(r.replace("_", " ") for r in thermal + power)
    temperature = f" at {device.temperature_c:.0f} °C" if thermal and device.temperature_c is not None else ""
    clock = f"; SM clock {device.sm_clock_mhz:.0f} MHz" if device.sm_clock_mhz is not None else ""
    return Alert("THROTTLED", "warn", device.index,
                 f"GPU {device.index} is slowed by {kind} throttling{temperature} ({detail}{clock}).")


def _other_process(device: DeviceSample, kernel: KernelView) -> Alert | None:
    if not device.memory_total or not device.processes:
        return None
    others = [p for p in device.processes if p.pid not in kernel.pids and p.memory_used is not None]
    if not others:
        return None
    biggest = max(others, key=lambda p: p.memory_used or 0)
    assert biggest.memory_used is not None
    if biggest.memory_used / device.memory_total <= OTHER_PROCESS_FRACTION:
        return None
    return Alert("OTHER_PROCESS_MEMORY", "warn", device.index,
                 f"Another process (pid {biggest.pid}) holds {format_bytes(biggest.memory_used)} of GPU "
                 f"{device.index}'s {format_bytes(device.memory_total)}: this kernel may run out of memory.")
