"""`GpuCheckReport`: the result object of `%gpucheck`, `jupyter-gpu check` and `require_gpu()`.

Follows IPython's `TimeitResult`: plain data, `__str__` for terminals, `_repr_html_` for notebooks,
`to_dict()` for JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from jupyter_gpu.models import Device, Finding, RichResult, Status, primary_finding

REPORT_SCHEMA_VERSION = 1


@dataclass(frozen=True, repr=False)  # RichResult's repr: a summary line, not every field
class GpuCheckReport(RichResult):
    renderer: ClassVar[str] = "jupyter_gpu.gpucheck.render"

    status: Status
    verdict: str
    gpu_usable: bool
    devices: list[Device]
    findings: list[Finding]
    facts: dict[str, Any] = field(repr=False)
    verbose: bool = False

    @property
    def primary(self) -> Finding | None:
        """The finding that explains the verdict: the first fail, else the first warn."""
        return primary_finding(self.findings)

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    @property
    def exit_code(self) -> int:
        """0 when PyTorch can use a GPU and nothing fails, 1 otherwise (2 is left for usage errors)."""
        return 0 if self.gpu_usable and self.status != "fail" else 1

    def to_dict(self, *, include_facts: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema_version": REPORT_SCHEMA_VERSION,
            "status": self.status,
            "verdict": self.verdict,
            "gpu_usable": self.gpu_usable,
            "devices": [d.to_dict() for d in self.devices],
            "primary": self.primary.code if self.primary else None,
            "findings": [f.to_dict() for f in self.findings],
        }
        if include_facts:
            data["facts"] = self.facts
        return data
