"""What one cell did on the GPU, measured around it for `%gpucells`: GPU time, peak and left-behind memory, and
how busy the GPU was while it ran.

Probe layer, called from the activity recorder's cell hooks. It never imports torch and never starts CUDA: with no
CUDA context in the kernel it reads nothing but the sampler's kept readings. With one, the cell's start resets the
allocator's peak statistics (`CudaMemoryWatch`, as `%%gputime` does) and records a CUDA event on each GPU this
kernel has a context on; the end records another on each and waits for them: the one synchronisation, so the GPU
time is the time the queued work really took. A CUDA context the cell itself created has its whole life inside the
cell, so its memory figures are the cell's too; only its GPU time is unknown (there was no event to start from).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from jupyter_gpu.cell_usage import average_utilization, kernel_devices, pid_listed
from jupyter_gpu.facts.activity import reading, running_samples
from jupyter_gpu.kernel_torch import context_devices, cuda_initialized, loaded_torch, torch_uuid
from jupyter_gpu.probekit.clock import CudaMemoryWatch, record_event


@dataclass
class OpenCell:
    """What the start of a cell recorded."""

    memory: CudaMemoryWatch
    starts: dict[int, Any]   # device -> the CUDA event recorded on its current stream; {} before CUDA starts


def open_cell() -> OpenCell:
    """At the cell's start. Before CUDA starts this reads one flag and nothing else."""
    torch = loaded_torch()
    if not cuda_initialized(torch):
        return OpenCell(CudaMemoryWatch(None), {})
    return OpenCell(CudaMemoryWatch(torch), {index: record_event(torch, index) for index in context_devices(torch)})


def close_cell(opened: OpenCell) -> dict[str, Any]:
    """At the cell's end: `gpu_seconds` (the longest span among this kernel's GPUs, each on its current stream),
    `peak_allocated`, `allocated_after`, `left_behind`, `reserved_after` (bytes, summed over the GPUs), `uuids`
    and `cuda_started` (the cell created the CUDA context); {} when the kernel still has no CUDA context."""
    torch = loaded_torch()
    if not cuda_initialized(torch):
        return {}
    ends = {index: record_event(torch, index) for index in opened.starts}
    for event in ends.values():
        event.synchronize()
    spans = [opened.starts[index].elapsed_time(ends[index]) for index in ends]
    memory = opened.memory.finish()
    devices = context_devices(torch)
    return {"cuda_started": not opened.starts,
            "gpu_seconds": max(spans) / 1000.0 if spans else None,
            "peak_allocated": sum(device.peak_allocated for device in memory),
            "allocated_after": sum(device.allocated_after for device in memory),
            "left_behind": sum(device.allocated_after - device.allocated_before for device in memory),
            # Every device with memory reserved is one of `devices`, so the watch's sum over all of them is theirs.
            "reserved_after": opened.memory.reserved_after,
            "uuids": [uuid for index in devices if (uuid := torch_uuid(torch, index))]}


def busy_during(started: float, ended: float, uuids: list[str]) -> dict[str, Any]:
    """How busy this kernel's GPUs were while the cell ran, from the shared sampler's kept readings: `gpu_busy`
    (percent, None when no reading had it), `readings`, and `pid_listed` (NVML listed this process); {} when no
    sampler was running."""
    samples = running_samples()
    if not samples:
        return {}
    readings = [reading(s) for s in samples if s.status == "ok" and started < s.timestamp <= ended]
    pid = os.getpid()
    return {"gpu_busy": average_utilization(readings, kernel_devices(readings, pid, uuids)),
            "readings": len(readings), "pid_listed": pid_listed(readings, pid)}
