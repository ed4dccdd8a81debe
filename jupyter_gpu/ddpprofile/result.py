"""What the distributed profile found: every rank's step, its buckets and communication, the straggler, the clocks,
the scaling, the mistakes, and the ranked plan. Pure Python."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from jupyter_gpu.ddpprofile.analyse import RankSummary, Scaling, Straggler
from jupyter_gpu.models import Finding, RichResult


@dataclass(frozen=True)
class PlanItem:
    cause: str
    seconds: float | None   # per step it loses, where measured
    change: str             # the exact change


@dataclass(repr=False)  # RichResult's short repr: the headline, not every field
class DistributedProfile(RichResult):
    renderer: ClassVar[str] = "jupyter_gpu.ddpprofile.render"

    command: str
    world: int
    backend: str = ""
    device: str = ""
    steps: int = 0
    warmup: int = 0
    ranks: list[RankSummary] = field(default_factory=list)
    straggler: Straggler | None = None
    scaling: Scaling | None = None
    clocks: list[dict[str, Any]] = field(default_factory=list)  # each rank's offset against rank 0
    clock_line: str = ""
    clock_finding: str | None = None
    findings: list[Finding] = field(default_factory=list)
    plan: list[PlanItem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failure: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.failure is None and bool(self.ranks)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ranks"] = [{**asdict(r), "compute": r.compute} for r in self.ranks]
        if self.scaling is not None:
            data["scaling"] = {**asdict(self.scaling), "speedup": self.scaling.speedup, "lost": self.scaling.lost}
        data["ok"] = self.ok
        return data
