"""The one line a kernel shows on its first cell when the start-up check fails, built from the check's JSON.

The wording is the report's own `brief()` (verdict, headline unless the verdict says it, fix), rebuilt from
`jupyter-gpu check --json`, so this line and every panel say the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jupyter_gpu.autoload.config import SILENCE_VARIABLE
from jupyter_gpu.gpucheck.report import CheckBrief, Device, GpuCheckReport
from jupyter_gpu.models import Finding

PREFIX = "jupyter-gpu:"
TAIL = f"(%gpucheck for details; {SILENCE_VARIABLE}=0 silences this)"


def report_from_json(data: Mapping[str, Any]) -> GpuCheckReport:
    """The report `jupyter-gpu check --json` printed (facts left out: the line never needs them)."""
    return GpuCheckReport(
        status=data["status"],
        verdict=data["verdict"],
        gpu_usable=bool(data["gpu_usable"]),
        devices=[Device(**device) for device in data.get("devices", [])],
        findings=[Finding.from_dict(finding) for finding in data.get("findings", [])],
        facts={},
    )


def failure_notice(data: Mapping[str, Any]) -> str | None:
    """The line to show for a report, or None when there is nothing wrong enough to interrupt for."""
    report = report_from_json(data)
    if report.status != "fail":
        return None
    return brief_line(report.brief())


def brief_line(brief: CheckBrief) -> str:
    parts = [PREFIX, brief.verdict]
    if brief.headline:
        parts.append(brief.headline)
    fix = first_fix(brief.fix)
    if fix:
        parts.append(f"Fix: {fix}")
    return _one_line(" ".join(parts)) + "  " + TAIL


def first_fix(fix: list[str]) -> str | None:
    """The first fix step; an introduction ending in ':' takes the command after it along (one step)."""
    if not fix:
        return None
    if fix[0].rstrip().endswith(":") and len(fix) > 1:
        return f"{fix[0].rstrip()} {fix[1].strip()}"
    return fix[0]


def could_not_run_notice(reason: str) -> str:
    return _one_line(f"{PREFIX} the start-up GPU check could not run ({reason}); run %gpucheck to see why.") + \
        "  " + TAIL


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())
