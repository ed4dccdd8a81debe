"""What the panel says about one device, as escaped HTML and plain text: no widgets here, so it is tested
without a front end and reused by anything that renders a Sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from jupyter_gpu.metrics.alerts import Alert, KernelView, kernel_memory
from jupyter_gpu.metrics.sample import DeviceSample
from jupyter_gpu.rendering.kit import COLOUR
from jupyter_gpu.rendering.units import format_bytes

SPARK_WIDTH = 160
SPARK_HEIGHT = 24
SPARK_VIEW = (1000, 100)
UTILIZATION_COLOUR = "#1565c0"
MEMORY_COLOUR = "#6a1b9a"
MUTED = "opacity:.75"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{format_bytes(value)}/s"


def device_title_html(device: DeviceSample, simulated_label: str) -> str:
    """'GPU 0 · NVIDIA H200' and its sensors; a value the GPU does not report shows as n/a."""
    parts = [f"<b>GPU {device.index} · {escape(device.name or 'unknown GPU')}</b>"]
    if device.status == "ok":
        sensors = [
            "n/a °C" if device.temperature_c is None else f"{device.temperature_c:.0f} °C",
            _power(device),
            "SM n/a" if device.sm_clock_mhz is None else f"SM {device.sm_clock_mhz:.0f} MHz",
            f"PCIe ↑{_rate(device.pcie_tx_bytes_per_s)} ↓{_rate(device.pcie_rx_bytes_per_s)}",
        ]
        parts.append(f'<span style="{MUTED}">{escape(" · ".join(sensors))}</span>')
    if simulated_label:
        parts.append(f'<span style="{MUTED}">[{escape(simulated_label)}]</span>')
    return " ".join(parts)


def _power(device: DeviceSample) -> str:
    if device.power_w is None:
        return "n/a W"
    limit = "" if device.power_limit_w is None else f" / {device.power_limit_w:.0f}"
    return f"{device.power_w:.0f}{limit} W"


def utilization_text(device: DeviceSample) -> str:
    if device.utilization_gpu is None:
        # NVML reports no utilisation for a GPU split into MIG slices.
        reason = " (MIG on: not reported)" if device.mig_enabled else ""
        return f"n/a{reason}"
    memory = "" if device.utilization_memory is None else f" · memory bus {device.utilization_memory:.0f}%"
    return f"{device.utilization_gpu:.0f}%{memory}"


def memory_text(device: DeviceSample, kernel: KernelView) -> str:
    """'60.1 GiB of 140.4 GiB (43%) · this kernel 12.0 GiB · PyTorch 10.1 GiB allocated, 11.0 GiB reserved'."""
    fraction = device.memory_fraction
    share = "" if fraction is None else f" ({fraction:.0%})"
    parts = [f"{format_bytes(device.memory_used)} of {format_bytes(device.memory_total)}{share}"]
    mine = kernel_memory(device, kernel)
    if mine is not None:
        parts.append(f"this kernel {format_bytes(mine)}")
    if device.torch_reserved is not None:
        parts.append(f"PyTorch {format_bytes(device.torch_allocated)} allocated, {format_bytes(device.torch_reserved)} "
                     "reserved")
    return " · ".join(parts)


def processes_html(device: DeviceSample, kernel: KernelView) -> str:
    if device.processes is None:
        return f'<span style="{MUTED}">Processes: NVML cannot list them here.</span>'
    if not device.processes:
        return f'<span style="{MUTED}">Processes: none.</span>'
    items = []
    for process in device.processes:
        who = f"pid {process.pid}"
        if process.pid in kernel.pids:
            who = f"<b>{who} (this kernel)</b>"
        slice_ = "" if process.gpu_instance_id is None else f" on MIG GI {process.gpu_instance_id}"
        items.append(f"{who} {escape(format_bytes(process.memory_used))}{slice_}")
    return f"Processes: {' · '.join(items)}"


def mig_html(device: DeviceSample) -> str:
    if not device.mig_enabled:
        return ""
    if not device.mig_instances:
        return f'<span style="{MUTED}">MIG on, no slices created.</span>'
    items = [f"{escape(m.profile or 'slice')} {escape(format_bytes(m.memory_used))}/"
             f"{escape(format_bytes(m.memory_total))}" for m in device.mig_instances]
    return f"MIG slices ({len(items)}): {' · '.join(items)}"


def alerts_html(alerts: Sequence[Alert]) -> str:
    return "".join(f'<div style="color:{COLOUR[a.severity]};font-weight:600">⚠ {escape(a.message)}</div>'
                   for a in alerts)


def sparkline_svg(values: Sequence[float | None], high: float, colour: str,
                  width: int = SPARK_WIDTH, height: int = SPARK_HEIGHT) -> str:
    """A polyline of the values scaled to [0, high]; gaps (None) break the line instead of drawing 0.

    Drawn in a 1000x100 integer view box stretched to the size: integer points keep the markup short and
    cheap to build (sixteen sparklines a second for eight GPUs).
    """
    step = SPARK_VIEW[0] / max(len(values) - 1, 1)
    scale = (SPARK_VIEW[1] - 2) / high if high > 0 else 0.0
    segments: list[list[str]] = [[]]
    for position, value in enumerate(values):
        if value is None or not scale:
            if segments[-1]:
                segments.append([])
            continue
        y = SPARK_VIEW[1] - 1 - round(min(max(value * scale, 0.0), SPARK_VIEW[1] - 2))
        segments[-1].append(f"{round(position * step)},{y}")
    lines = "".join(f'<polyline points="{" ".join(points)}" fill="none" stroke="{colour}" stroke-width="1.5" '
                    'vector-effect="non-scaling-stroke"/>' for points in segments if points)
    return (f'<svg width="{width}" height="{height}" viewBox="0 0 {SPARK_VIEW[0]} {SPARK_VIEW[1]}" '
            f'preserveAspectRatio="none" role="img"><rect width="{SPARK_VIEW[0]}" height="{SPARK_VIEW[1]}" '
            f'fill="none" stroke="#8884" vector-effect="non-scaling-stroke"/>{lines}</svg>')
