"""`%gpucells`' result: one row per finished cell, with the flags that say which cells to look at."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from jupyter_gpu.models import RichResult

IDLE_GPU = "idle-gpu"          # held the GPU and kept it under 10% busy
MEMORY_GROWS = "memory-grows"  # memory grew run after run (the rule %gpumem --watch uses)
SLOWEST = "slowest"            # several times the median cell shown, among enough cells to compare


@dataclass(frozen=True)
class CellFlag:
    code: str       # IDLE_GPU, MEMORY_GROWS or SLOWEST
    message: str    # one sentence, with what to type next where there is something to type


@dataclass(frozen=True)
class CellRow:
    """One finished cell. GPU figures are None where they were not measured, and `notes` says why."""

    execution_count: int | None
    cell: str                            # the cell's first non-blank line, shortened
    cell_key: str                        # the same cell run again has the same key
    started: float                       # wall clock (time.time())
    wall_seconds: float
    gpu_seconds: float | None = None     # start event to end event on the current stream, synchronised at the end
    gpu_busy: float | None = None        # mean NVML utilisation (%) of this kernel's GPUs while it ran
    readings: int = 0                    # sampler readings taken while it ran
    peak_allocated: int | None = None    # bytes: the allocator's peak during the cell (peaks reset at its start)
    allocated_after: int | None = None   # bytes allocated when it ended
    left_behind: int | None = None       # bytes allocated at its end minus at its start
    cuda_started: bool = False           # this cell created the kernel's CUDA context
    held_gpu: bool = False               # a CUDA context with memory reserved, or NVML listed the kernel on a GPU
    error: str | None = None             # why the record is incomplete (the cell itself ran normally)
    flags: tuple[CellFlag, ...] = ()

    @property
    def label(self) -> str:
        return f"In [{self.execution_count}]" if self.execution_count is not None else "a cell"

    def to_dict(self) -> dict[str, Any]:
        return {"execution_count": self.execution_count, "cell": self.cell, "cell_key": self.cell_key,
                "started": self.started, "wall_seconds": self.wall_seconds, "gpu_seconds": self.gpu_seconds,
                "gpu_busy": self.gpu_busy, "readings": self.readings, "peak_allocated": self.peak_allocated,
                "allocated_after": self.allocated_after, "left_behind": self.left_behind,
                "cuda_started": self.cuda_started, "held_gpu": self.held_gpu, "error": self.error,
                "flags": [{"code": f.code, "message": f.message} for f in self.flags]}


@dataclass(frozen=True, repr=False)
class CellLog(RichResult):
    """The last cells of this kernel, oldest first, as `%gpucells` shows them."""

    renderer: ClassVar[str] = "jupyter_gpu.gpucells.render"

    rows: tuple[CellRow, ...]
    recorded: int                        # cells recorded in all (the log keeps the last few hundred)
    cuda_now: bool                       # the kernel has a CUDA context now
    sampler_running: bool                # the shared sampler is running now (a %gpupanel, %%gputime, ...)
    notes: tuple[str, ...] = field(default=())

    @property
    def flagged(self) -> list[CellRow]:
        return [row for row in self.rows if row.flags]

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [row.to_dict() for row in self.rows], "recorded": self.recorded, "cuda_now": self.cuda_now,
                "sampler_running": self.sampler_running, "notes": list(self.notes)}
