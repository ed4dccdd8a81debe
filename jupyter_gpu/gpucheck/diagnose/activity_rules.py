"""Was the GPU busy during the last long cell? From the sampler readings in the snapshot's notebook activity.

Pure: reads `notebook["activity"]` (facts/activity.py documents its keys); what counts as long, watched and busy is
`cell_usage`'s, which `%gpucells` flags with too.
"""

from __future__ import annotations

from jupyter_gpu.cell_usage import (
    LONG_CELL_S,
    LOW_UTILIZATION_PERCENT,
    MIN_READINGS,
    average_utilization,
    kernel_devices,
    pid_listed,
    readings_during,
)
from jupyter_gpu.gpucheck.diagnose.stack import LastCell
from jupyter_gpu.gpucheck.diagnose.view import FactsView
from jupyter_gpu.models import LAYER_USAGE, Finding

__all__ = ["LONG_CELL_S", "LOW_UTILIZATION_PERCENT", "MIN_READINGS", "last_long_cell", "low_utilization"]


def last_long_cell(view: FactsView) -> LastCell | None:
    activity = (view.notebook or {}).get("activity") or {}
    samples = activity.get("samples") or []
    pid = activity.get("pid")
    for cell in reversed(activity.get("cells") or []):
        seconds = cell["ended"] - cell["started"]
        if seconds < LONG_CELL_S:
            continue
        readings = readings_during(samples, cell["started"], cell["ended"])
        if len(readings) < MIN_READINGS:
            return None  # the last long cell was not watched: an older one would mislead
        devices = kernel_devices(readings, pid, (d.get("uuid") for d in view.in_kernel.get("devices") or []))
        average = average_utilization(readings, devices)
        if average is None:
            return None
        held = bool(view.in_kernel.get("cuda_initialized")) or pid_listed(readings, pid)
        names = sorted(f"GPU {i}" for i in devices)
        return LastCell(execution_count=cell.get("execution_count"), seconds=round(seconds, 1),
                        utilization_percent=round(average, 1), samples=len(readings),
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
