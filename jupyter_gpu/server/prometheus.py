"""The latest sample in Prometheus' text format, so a cluster's Prometheus can scrape every node's server.

Written by hand (the format is a few lines of text) rather than through prometheus_client, which would
register global collectors in the server process. A field the GPU did not report is left out, never 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from jupyter_gpu.metrics.sample import DeviceSample, Sample
from jupyter_gpu.server.attribution import Holder, idle_gauge_seconds

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_DEVICE_GAUGES: tuple[tuple[str, str, Callable[[DeviceSample], float | int | None]], ...] = (
    ("utilization_percent", "GPU (SM) utilisation over the driver's last sample period.",
     lambda d: d.utilization_gpu),
    ("memory_utilization_percent", "Share of time the memory controller was busy.", lambda d: d.utilization_memory),
    ("memory_used_bytes", "Device memory in use, all processes.", lambda d: d.memory_used),
    ("memory_total_bytes", "Device memory in all.", lambda d: d.memory_total),
    ("temperature_celsius", "GPU core temperature.", lambda d: d.temperature_c),
    ("power_watts", "Board power draw.", lambda d: d.power_w),
    ("power_limit_watts", "Enforced power limit.", lambda d: d.power_limit_w),
    ("sm_clock_hertz", "SM clock.", lambda d: None if d.sm_clock_mhz is None else d.sm_clock_mhz * 1e6),
    ("pcie_tx_bytes_per_second", "PCIe traffic out of the GPU.", lambda d: d.pcie_tx_bytes_per_s),
    ("pcie_rx_bytes_per_second", "PCIe traffic into the GPU.", lambda d: d.pcie_rx_bytes_per_s),
    ("throttled", "1 when clocks are cut by power or thermal throttling.",
     lambda d: None if d.throttle_reasons is None else int(d.throttled)),
)


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Iterable[tuple[str, str | None]]) -> str:
    return ",".join(f'{key}="{escape_label(value)}"' for key, value in pairs if value is not None)


def _number(value: float | int) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def render(sample: Sample | None, holders: Iterable[Holder]) -> str:
    lines: list[str] = []

    def gauge(name: str, help_text: str, rows: list[tuple[str, float | int]]) -> None:
        full = f"jupyter_gpu_{name}"
        lines.append(f"# HELP {full} {help_text}")
        lines.append(f"# TYPE {full} gauge")
        lines.extend(f"{full}{{{labels}}} {_number(value)}" if labels else f"{full} {_number(value)}"
                     for labels, value in rows)

    if sample is None:
        gauge("up", "1 when GPU metrics could be read; 0 before the first reading, with no driver, or on errors.",
              [("", 0)])
        return "\n".join(lines) + "\n"
    backend = _labels([("backend", sample.backend), ("simulated", str(sample.simulated).lower())])
    gauge("up", "1 when GPU metrics could be read; 0 before the first reading, with no driver, or on errors.",
          [(backend, int(sample.status == "ok"))])
    gauge("sample_timestamp_seconds", "When the figures below were read (Unix time).",
          [(backend, sample.timestamp)])
    devices = [(d, _labels([("gpu", str(d.index)), ("uuid", d.uuid), ("name", d.name)])) for d in sample.devices]
    gauge("device_ok", "1 when the GPU answered; 0 when it is lost or could not be read.",
          [(labels, int(d.status == "ok")) for d, labels in devices])
    for name, help_text, read in _DEVICE_GAUGES:
        rows = [(labels, value) for d, labels in devices if (value := read(d)) is not None]
        if rows:
            gauge(name, help_text, rows)
    holder_rows, idle_rows = [], []
    for holder in holders:
        paths = ", ".join(holder.kernel.paths) if holder.kernel is not None else None
        kernel_id = holder.kernel.kernel_id if holder.kernel is not None else None
        # At the reading's time, as the panel's holder table says it: the two never disagree.
        idle = idle_gauge_seconds(holder.kernel, sample.timestamp)
        for index, memory in sorted(holder.memory_by_device.items()):
            if memory is not None:
                labels = _labels([("gpu", str(index)), ("kind", holder.kind), ("kernel_id", kernel_id),
                                  ("notebook", paths or None), ("program", holder.label if holder.kind == "process"
                                                                else None)])
                holder_rows.append((labels, memory))
                if idle is not None:
                    idle_rows.append((labels, round(idle, 3)))
    gauge("holder_memory_bytes", "GPU memory held by each kernel (by notebook) or other process.", holder_rows)
    # The memory gauge's labels, so `holder_memory_bytes and kernel_idle_seconds > 1800` needs no `on (...)`.
    gauge("kernel_idle_seconds", "Seconds since the kernel holding this memory last ran anything; 0 while it runs "
                                 "a cell.", idle_rows)
    return "\n".join(lines) + "\n"
