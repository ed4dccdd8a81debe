"""`GpuCheckReport`: the result object of `%gpucheck`, `jupyter-gpu check` and `require_gpu()`.

Follows IPython's `TimeitResult`: plain data, `__str__` for terminals, `_repr_html_` for notebooks,
`to_dict()` for JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

from jupyter_gpu.gpucheck.diagnose.stack import Stack
from jupyter_gpu.gpucheck.surface import NOTEBOOK, finding_for_terminal, for_terminal
from jupyter_gpu.models import Finding, RichResult, Status, primary_finding

REPORT_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Device:
    """A device PyTorch can use in this kernel, as shown in the verdict line."""

    index: int
    name: str
    kind: str = "cuda"  # "cuda" (also ROCm, which PyTorch exposes as cuda) or "mps"

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.index}" if self.kind == "cuda" else self.kind

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CheckBrief:
    """The verdict, the primary finding's headline and its fix: what a panel shows in place of a GPU.

    One wording for every panel (the notebook's, the server's JSON, hence the TypeScript side panel): the
    headline is None when the verdict already says it, so no surface decides that on its own.
    """

    status: Status
    verdict: str
    headline: str | None
    fix: list[str]
    code: str | None

    @classmethod
    def could_not_run(cls, error: BaseException) -> CheckBrief:
        return cls("fail", f"%gpucheck could not run: {error}", None, [], None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _says(verdict: str, headline: str) -> bool:
    # "... on the CPU: the driver is too old." already says "The driver is too old" (case and final dot aside).
    return headline.lower().rstrip(". \t\n") in verdict.lower()


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
    stack: Stack | None = field(default=None, repr=False)  # the versions and GPUs at a glance
    # Where the report is read: "notebook" (%gpucheck, require_gpu) or "terminal" (jupyter-gpu check, ./dev check);
    # the fix lines are worded for it (gpucheck/surface.py).
    surface: str = NOTEBOOK

    @property
    def primary(self) -> Finding | None:
        """The finding that explains the verdict: the first fail, else the first warn."""
        return primary_finding(self.findings)

    def brief(self) -> CheckBrief:
        """The verdict, the primary finding's headline (None when the verdict says it) and its fix."""
        primary = self.primary
        if primary is None:
            return CheckBrief(self.status, self.verdict, None, [], None)
        headline = None if _says(self.verdict, primary.headline) else primary.headline
        return CheckBrief(self.status, self.verdict, headline, list(primary.fix), primary.code)

    @property
    def python(self) -> str:
        """The interpreter that runs torch here, for a terminal's `python -m pip`."""
        return (self.facts.get("python") or {}).get("executable") or \
            (self.facts.get("context") or {}).get("python") or "python"

    @property
    def panels_note(self) -> str | None:
        """One line where a simulated or replayed backend feeds the panels (JUPYTER_GPU_BACKEND) while this check
        read the real machine: the two must never be mixed silently."""
        backend = ((self.facts.get("env") or {}).get("JUPYTER_GPU_BACKEND") or "").strip()
        if not backend.startswith(("simulated:", "replay:")) or (self.facts.get("context") or {}).get("simulated"):
            return None
        return (f"The panels and %gpupanel show {backend} (JUPYTER_GPU_BACKEND), not this machine's GPUs; this check "
                "reads the real machine.")

    def worded_for(self, surface: str) -> GpuCheckReport:
        """This report, read on `surface` ("notebook" or "terminal"): its text rendering words the verdict, headlines,
        evidence and fix lines for it; its findings and JSON keep the notebook's form beside the terminal's."""
        return replace(self, surface=surface)

    @property
    def terminal_findings(self) -> list[Finding]:
        """The findings as a terminal reads them (gpucheck/surface.py)."""
        return [finding_for_terminal(f, self.python) for f in self.findings]

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
            "surface": self.surface,
            "panels_note": self.panels_note,
            # Each fix in both wordings: the notebook's (`fix`) and the terminal's (`fix_terminal`).
            "findings": [{**f.to_dict(), "fix_terminal": [for_terminal(line, self.python) for line in f.fix]}
                         for f in self.findings],
            "stack": self.stack.to_dict() if self.stack else None,
        }
        if include_facts:
            data["facts"] = self.facts
        return data
