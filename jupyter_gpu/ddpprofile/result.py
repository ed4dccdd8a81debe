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


@dataclass(frozen=True)
class AppliedFixes:
    """`--apply`: the same run again with the mechanical fixes, set against the first."""

    fixes: list[tuple[str, str]]          # (name, the change as code)
    before_step: float                    # seconds per step, the ranks' mean
    after_step: float
    before_batches: int | None            # batches per epoch on a rank (the DataLoader's length)
    after_batches: int | None
    before_allreduces: float              # all-reduces per step
    after_allreduces: float
    gone: list[str] = field(default_factory=list)  # finding codes the second run no longer has
    failure: str | None = None

    @property
    def step_speedup(self) -> float:
        return self.before_step / self.after_step if self.after_step > 0 else 0.0

    @property
    def epoch_speedup(self) -> float | None:
        """Per epoch: steps per epoch times the step (a DistributedSampler makes fewer steps, not faster ones)."""
        if not self.before_batches or not self.after_batches or self.after_step <= 0:
            return None
        return (self.before_batches * self.before_step) / (self.after_batches * self.after_step)


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
    applied: AppliedFixes | None = None

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
