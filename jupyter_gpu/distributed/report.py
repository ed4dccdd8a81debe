"""`ReadinessReport`: the result of `%gpucheck --distributed` and `jupyter-gpu check --distributed`.

Plain data like every result: the facts it was diagnosed from, the findings, the launch methods, and the checked
all-reduce when `--bench` ran one. Text, escaped HTML and `to_dict()` come from the renderer and dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from jupyter_gpu.distributed.readiness import LaunchMethod, diagnose_readiness, gpu_view
from jupyter_gpu.models import Finding, RichResult, Status, overall_status, primary_finding

if TYPE_CHECKING:
    from jupyter_gpu.distributed.collective import AllReduceResult


@dataclass(frozen=True, repr=False)
class ReadinessReport(RichResult):
    renderer: ClassVar[str] = "jupyter_gpu.distributed.render"

    facts: dict[str, Any]
    findings: list[Finding]
    launches: list[LaunchMethod]
    bench: AllReduceResult | None = None
    bench_error: str | None = None  # why the all-reduce --bench asked for did not finish

    @classmethod
    def from_facts(cls, facts: dict[str, Any], **extra: Any) -> ReadinessReport:
        findings, launches = diagnose_readiness(facts)
        return cls(facts, findings, launches, **extra)

    @property
    def status(self) -> Status:
        status = overall_status(self.findings)
        if self.bench_error or (self.bench is not None and not self.bench.ok):
            return "fail"
        return status

    @property
    def simulated(self) -> bool:
        return bool((self.facts.get("topology") or {}).get("simulated"))

    @property
    def verdict(self) -> str:
        view = gpu_view(self.facts)
        torch = self.facts.get("torch") or {}
        gpus = f"{view.count} GPU{'' if view.count == 1 else 's'}"
        if self.bench is not None and not self.bench.ok:
            return "Not ready: the all-reduce returned wrong values"
        if self.bench_error:
            return "Not ready: the all-reduce did not finish"
        main = primary_finding(self.findings)
        if main is not None and main.severity == "fail":
            return f"Not ready for multi-GPU training: {main.headline}"
        if view.count >= 2 and torch.get("nccl_available"):
            ready = f"Ready for DistributedDataParallel on {gpus} with NCCL {torch.get('nccl_version') or ''}".rstrip()
            warnings = sum(1 for f in self.findings if f.severity == "warn")
            return ready + (f", with {warnings} warning{'s' if warnings != 1 else ''}" if warnings else "")
        if view.count >= 2:
            return f"{gpus} but no NCCL in this torch: only gloo, on the CPU"
        if torch.get("gloo_available"):
            visible = gpus if view.count else "No GPU"
            return f"{visible} visible: multi-process training here means gloo on the CPU"
        return f"{gpus} visible"

    @property
    def exit_code(self) -> int:
        return {"ok": 0, "warn": 0, "fail": 1}[self.status]

    def summary(self) -> str:
        return self.verdict

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "verdict": self.verdict, "simulated": self.simulated,
                "findings": [f.to_dict() for f in self.findings], "launches": [m.to_dict() for m in self.launches],
                "bench": self.bench.to_dict() if self.bench is not None else None, "bench_error": self.bench_error,
                "facts": self.facts}
