"""`MemoryEstimate`: what `%batchprobe --estimate` predicted, as plain data (the run is `batchprobe.estimate`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from jupyter_gpu.models import RichResult


@dataclass(frozen=True, repr=False)
class MemoryEstimate(RichResult):
    renderer: ClassVar[str] = "jupyter_gpu.batchprobe.estimate_render"

    points: list[tuple[int, int]]  # (batch size, predicted peak bytes), each evaluated with fake tensors, ascending
    intercept: float  # peak ≈ intercept + per_sample · batch size, through the two largest points
    per_sample: float
    fits: dict[int, int]  # memory size in bytes -> largest batch size whose peak fits its budget (0: none)
    reserve_bytes: int  # held back from each memory size for the CUDA context and workspaces (assumed)
    margin: float  # fraction of the rest kept free for allocator rounding and fragmentation
    device: str  # the device type of the fake run
    seconds: float
    notes: list[str] = field(default_factory=list)

    def budget_for(self, memory_bytes: int) -> int:
        """The bytes of tensors a card of `memory_bytes` is predicted to hold."""
        return budget_bytes(memory_bytes, self.reserve_bytes, self.margin)

    @property
    def seconds_per_evaluation(self) -> float:
        return self.seconds / max(len(self.points), 1)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["points"] = [list(point) for point in self.points]
        data["budgets"] = {size: self.budget_for(size) for size in self.fits}
        return data


def budget_bytes(memory_bytes: int, reserve: int, margin: float) -> int:
    return max(int((memory_bytes - reserve) * (1 - margin)), 0)
