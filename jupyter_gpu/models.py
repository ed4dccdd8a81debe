"""Plain data shared by every result: findings, their severities and layers, and the `RichResult` base.

Pure Python: no torch, NVML or IPython imports, so the CLI, the magics and later the server can all
build, serialise and render the same objects.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal

Severity = Literal["fail", "warn", "info"]
Status = Literal["ok", "warn", "fail"]

SEVERITY_RANK: dict[str, int] = {"fail": 0, "warn": 1, "info": 2}

# The layers of the catalogue (§0/§7): the primary finding is the lowest-layer fail, else warn. The hardware's health
# (a lost GPU, a Xid, a PCIe link down) comes first: it outranks every software finding (issue 49).
LAYER_HARDWARE = -1
LAYER_KERNEL = 0
LAYER_BUILD = 1
LAYER_HOST = 2
LAYER_VISIBILITY = 3
LAYER_COMPAT = 4
LAYER_LAST_ERROR = 5
LAYER_USAGE = 6


@dataclass(frozen=True)
class Finding:
    """One diagnosis: a stable code, how bad it is, and what to type to fix it."""

    code: str
    severity: Severity
    headline: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: list[str] = field(default_factory=list)
    refs: list[str] = field(default_factory=list)
    layer: int = LAYER_USAGE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return cls(
            code=data["code"],
            severity=data["severity"],
            headline=data["headline"],
            evidence=dict(data.get("evidence", {})),
            fix=list(data.get("fix", [])),
            refs=list(data.get("refs", [])),
            layer=int(data.get("layer", LAYER_USAGE)),
        )


class RichResult:
    """Text for terminals, escaped HTML for notebooks, both from one renderer module named by the class.

    The renderer is imported on first display, so building and serialising results stays import-light.
    """

    renderer: ClassVar[str]  # module with render_text(result) and render_html(result)

    def __str__(self) -> str:
        return str(importlib.import_module(self.renderer).render_text(self))

    def _repr_html_(self) -> str:
        return str(importlib.import_module(self.renderer).render_html(self))

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def summary(self) -> str:
        """One line: the headline of the text rendering unless a result knows a better one."""
        return str(self).splitlines()[0]

    def __repr__(self) -> str:
        # Like `<TimeitResult : 1.2 ms ± ...>`: short enough for a list or a log line.
        return f"<{type(self).__name__}: {self.summary()}>"


def order_findings(findings: list[Finding]) -> list[Finding]:
    """Most important first: severity, then the lower (more fundamental) layer."""
    return sorted(findings, key=lambda f: (SEVERITY_RANK[f.severity], f.layer))


def primary_finding(findings: list[Finding]) -> Finding | None:
    """The finding that explains the verdict (§7): the first fail in catalogue order, else the first warn."""
    for severity in ("fail", "warn"):
        for finding in findings:
            if finding.severity == severity:
                return finding
    return None


def overall_status(findings: list[Finding]) -> Status:
    severities = {f.severity for f in findings}
    if "fail" in severities:
        return "fail"
    if "warn" in severities:
        return "warn"
    return "ok"
