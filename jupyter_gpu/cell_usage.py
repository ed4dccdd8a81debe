"""How busy the GPU was while a cell ran, from the sampler's readings: the one rule `%gpucheck`'s
LOW_GPU_UTILIZATION and `%gpucells`' "held the GPU, kept it idle" flag share.

Pure. A reading is `{"t", "devices": [{"index", "uuid", "utilization_gpu", "pids"}]}` (facts/activity.py writes
them). A cell counts as long from LONG_CELL_S; NVML averages utilisation over 1/6 s to 1 s, so a handful of readings
(MIN_READINGS) is needed to say anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jupyter_gpu.device_uuid import canonical_uuid

LONG_CELL_S = 5.0
MIN_READINGS = 3
LOW_UTILIZATION_PERCENT = 10.0


def readings_during(samples: Iterable[dict[str, Any]], started: float, ended: float) -> list[dict[str, Any]]:
    """The readings taken while the cell ran (wall clock)."""
    return [s for s in samples if started < s["t"] <= ended]


def kernel_devices(readings: list[dict[str, Any]], pid: int | None, uuids: Iterable[str | None] = ()) -> set[int]:
    """The GPUs this kernel ran on: where NVML lists its PID, else the CUDA devices it opened (by UUID), else every
    GPU the readings have."""
    listed = {d["index"] for s in readings for d in s["devices"] if pid is not None and pid in (d.get("pids") or [])}
    if listed:
        return listed
    wanted = {canonical_uuid(uuid) for uuid in uuids} - {None}
    opened = {d["index"] for s in readings for d in s["devices"] if canonical_uuid(d.get("uuid")) in wanted}
    return opened or {d["index"] for s in readings for d in s["devices"]}


def average_utilization(readings: list[dict[str, Any]], devices: set[int]) -> float | None:
    """The mean of NVML's utilisation over those GPUs and readings; None when none reported one."""
    values = [d["utilization_gpu"] for s in readings for d in s["devices"]
              if d["index"] in devices and d.get("utilization_gpu") is not None]
    return sum(values) / len(values) if values else None


def pid_listed(readings: list[dict[str, Any]], pid: int | None) -> bool:
    """Whether NVML listed this process on any GPU during the readings."""
    return pid is not None and any(pid in (d.get("pids") or []) for s in readings for d in s["devices"])
