"""From the activity recorder's rows to `%gpucells`' log: which cells to look at, and why.

Pure. The "kept the GPU idle" test is `cell_usage`'s (the one `%gpucheck`'s LOW_GPU_UTILIZATION uses); "memory
grew run after run" is `memory_growth`'s (the one `%gpumem --watch` uses), applied to every recorded run of a cell,
shown or not.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from jupyter_gpu.cell_usage import LONG_CELL_S, LOW_UTILIZATION_PERCENT, MIN_READINGS
from jupyter_gpu.gpucells.result import IDLE_GPU, MEMORY_GROWS, SLOWEST, CellFlag, CellLog, CellRow
from jupyter_gpu.memory_growth import grew_every_run
from jupyter_gpu.rendering.units import format_bytes, format_seconds

DEFAULT_SHOWN = 10
SLOWEST_FLAGGED = 3
SLOW_CELL_S = 1.0  # a cell faster than this is never "slowest": there is nothing there to win
# "Slowest" is relative: a cell is flagged only among enough cells to compare, and only when it took several times
# what the notebook's cells typically take. With two cells shown both were flagged; with five of about 2 s each the
# three slightly slower ones were: neither says where the time went.
MIN_CELLS_COMPARED = 5
SLOWER_THAN_MEDIAN = 3.0


def row_from_record(record: dict[str, Any]) -> CellRow:
    """One recorder row (magics/activity.py) as a CellRow, without flags."""
    reserved = record.get("reserved_after")
    held = bool(reserved) or bool(record.get("pid_listed"))
    return CellRow(
        execution_count=record.get("execution_count"), cell=record.get("cell", ""),
        cell_key=record.get("cell_key", ""), started=record["started"],
        wall_seconds=max(record["ended"] - record["started"], 0.0), gpu_seconds=record.get("gpu_seconds"),
        gpu_busy=record.get("gpu_busy"), readings=int(record.get("readings") or 0),
        peak_allocated=record.get("peak_allocated"), allocated_after=record.get("allocated_after"),
        left_behind=record.get("left_behind"), cuda_started=bool(record.get("cuda_started")), held_gpu=held,
        error=record.get("error"))


def _idle_gpu(row: CellRow) -> CellFlag | None:
    if (row.held_gpu and row.wall_seconds >= LONG_CELL_S and row.readings >= MIN_READINGS
            and row.gpu_busy is not None and row.gpu_busy < LOW_UTILIZATION_PERCENT):
        return CellFlag(IDLE_GPU, f"held the GPU and kept it {row.gpu_busy:.0f}% busy for "
                                  f"{format_seconds(row.wall_seconds)}: %%gpuprofile on that cell shows where its "
                                  "time went (waiting for data, syncs, the CPU)")
    return None


def _growing(rows: list[CellRow]) -> dict[str, tuple[int, ...]]:
    """cell_key -> the bytes each run left behind, for the cells whose every run grew memory."""
    runs: dict[str, list[int]] = {}
    for row in rows:
        if row.left_behind is not None and row.cell_key:
            runs.setdefault(row.cell_key, []).append(row.left_behind)
    return {key: tuple(growth) for key, growth in runs.items() if grew_every_run(growth)}


def build_log(records: list[dict[str, Any]], shown: int = DEFAULT_SHOWN, *, cuda_now: bool,
              sampler_running: bool) -> CellLog:
    """The last `shown` of the recorded cells (oldest first), each with its flags."""
    every = [row_from_record(record) for record in records]
    growing = _growing(every)
    last = every[-shown:] if shown else []
    median = statistics.median(row.wall_seconds for row in last) if last else 0.0
    slow = sorted((row for row in last if len(last) >= MIN_CELLS_COMPARED and row.wall_seconds >= SLOW_CELL_S
                   and row.wall_seconds >= SLOWER_THAN_MEDIAN * median), key=lambda r: -r.wall_seconds)
    slowest = {id(row) for row in slow[:SLOWEST_FLAGGED]}
    rows: list[CellRow] = []
    for row in last:
        flags = []
        idle = _idle_gpu(row)
        if idle is not None:
            flags.append(idle)
        if row.cell_key in growing:
            growth = ", ".join("+" + format_bytes(size) for size in growing[row.cell_key])
            flags.append(CellFlag(MEMORY_GROWS, f"memory grew every run ({growth}): %gpumem --watch, run it "
                                                "again, then %gpumem --history names what it keeps"))
        if id(row) in slowest:
            times = row.wall_seconds / median if median > 0 else float("inf")
            flags.append(CellFlag(SLOWEST, f"{format_seconds(row.wall_seconds)}, {times:.0f}x the median cell of the "
                                           f"{len(last)} shown ({format_seconds(median)})"))
        rows.append(replace(row, flags=tuple(flags)))
    notes = []
    if not cuda_now:
        notes.append("CUDA is not initialised in this kernel: GPU time and memory are measured from the cell that "
                     "starts it (%gpucells never starts CUDA)")
    if not any(row.readings for row in rows):
        notes.append("GPU busy is measured while something samples the GPU (an open %gpupanel, %%gputime, or "
                     "autoload's watch)" + ("" if sampler_running else "; nothing does now"))
    return CellLog(rows=tuple(rows), recorded=len(every), cuda_now=cuda_now, sampler_running=sampler_running,
                   notes=tuple(notes))

