"""Was the GPU busy during the last long cell? From the sampler readings in the snapshot's notebook activity.

Pure: reads `notebook["activity"]` (facts/activity.py documents its keys). A cell counts as long from
`LONG_CELL_S`; NVML averages utilisation over 1/6 s to 1 s, so a handful of readings is needed to say anything.
"""

from __future__ import annotations

from typing import Any

from jupyter_gpu.gpucheck.diagnose.stack import LastCell
from jupyter_gpu.gpucheck.diagnose.view import FactsView
from jupyter_gpu.gpucheck.diagnose.visibility import canonical_uuid
from jupyter_gpu.models import LAYER_USAGE, Finding

LONG_CELL_S = 5.0
MIN_READINGS = 3
LOW_UTILIZATION_PERCENT = 10.0


def _kernel_devices(activity: dict[str, Any], readings: list[dict[str, Any]], view: FactsView) -> set[int]:
    """The GPUs this kernel ran on: where NVML lists its PID, else the CUDA devices it opened, else every GPU."""
    pid = activity.get("pid")
    listed = {d["index"] for s in readings for d in s["devices"] if pid is not None and pid in (d.get("pids") or [])}
    if listed:
        return listed
    uuids = {canonical_uuid(d.get("uuid")) for d in view.in_kernel.get("devices") or []} - {None}
    opened = {d["index"] for s in readings for d in s["devices"] if canonical_uuid(d.get("uuid")) in uuids}
    return opened or {d["index"] for s in readings for d in s["devices"]}


def last_long_cell(view: FactsView) -> LastCell | None:
    activity = (view.notebook or {}).get("activity") or {}
    samples = activity.get("samples") or []
    for cell in reversed(activity.get("cells") or []):
        seconds = cell["ended"] - cell["started"]
        if seconds < LONG_CELL_S:
            continue
        readings = [s for s in samples if cell["started"] < s["t"] <= cell["ended"]]
        if len(readings) < MIN_READINGS:
            return None  # the last long cell was not watched: an older one would mislead
        devices = _kernel_devices(activity, readings, view)
        values = [d["utilization_gpu"] for s in readings for d in s["devices"]
                  if d["index"] in devices and d.get("utilization_gpu") is not None]
        if not values:
            return None
        pid = activity.get("pid")
        held = bool(view.in_kernel.get("cuda_initialized")) or any(
            pid in (d.get("pids") or []) for s in readings for d in s["devices"])
        names = sorted(f"GPU {i}" for i in devices)
        return LastCell(execution_count=cell.get("execution_count"), seconds=round(seconds, 1),
                        utilization_percent=round(sum(values) / len(values), 1), samples=len(readings),
                        devices=names, held_gpu=held, simulated=bool(activity.get("simulated")))
    return None


def low_utilization(cell: LastCell | None) -> list[Finding]:
    if cell is None or not cell.held_gpu or cell.utilization_percent >= LOW_UTILIZATION_PERCENT:
        return []
    where = f"In [{cell.execution_count}]" if cell.execution_count is not None else "the last long cell"
    headline = (f"The GPU was busy {cell.utilization_percent:.0f}% of the time during {where} "
                f"({cell.seconds:.0f} s) although this kernel holds it: the work ran elsewhere or waited.")
    evidence = {"cell": where, "seconds": cell.seconds, "average_utilization_percent": cell.utilization_percent,
                "readings": cell.samples, "gpus": cell.devices}
    if cell.simulated:
        evidence["backend"] = "simulated"
    fix = ["%%gpuprofile on the training cell: where each step's time goes (waiting for data, syncs with their "
           "line, copies, compute) and what to fix first, with the command to type",
           "%%gputime the training cell: its operation counts say whether the work ran on the GPU at all"]
    return [Finding("LOW_GPU_UTILIZATION", "warn", headline, evidence=evidence, fix=fix, layer=LAYER_USAGE)]
