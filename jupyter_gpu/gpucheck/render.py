"""Text and HTML renderings of a `GpuCheckReport`, built with the shared `render_kit`."""

from __future__ import annotations

import json
from html import escape

from jupyter_gpu.gpucheck.report import GpuCheckReport
from jupyter_gpu.render_kit import (
    COLOUR,
    SIMULATED_HTML,
    SIMULATED_TEXT,
    STATUS_MARK,
    findings_html,
    findings_text,
)


def _simulated(report: GpuCheckReport) -> bool:
    return bool((report.facts.get("context") or {}).get("simulated"))


def render_text(report: GpuCheckReport) -> str:
    lines = [f"{STATUS_MARK[report.status]} {report.verdict}"]
    if _simulated(report):
        lines[0] += SIMULATED_TEXT
    lines.extend(findings_text(report.findings))
    if report.verbose:
        lines.append("")
        lines.append("Facts:")
        lines.append(json.dumps(report.facts, indent=2, sort_keys=True, default=str))
    return "\n".join(lines)


def render_html(report: GpuCheckReport) -> str:
    colour = COLOUR[report.status]
    simulated = SIMULATED_HTML if _simulated(report) else ""
    parts = [
        '<div class="jupyter-gpu-check" style="font-family:var(--jp-ui-font-family,sans-serif);line-height:1.4">',
        f'<div style="font-weight:600;color:{colour};font-size:1.05em">'
        f"{STATUS_MARK[report.status]} {escape(report.verdict)}{simulated}</div>",
    ]
    parts.append(findings_html(report.findings))
    if report.verbose:
        facts = json.dumps(report.facts, indent=2, sort_keys=True, default=str)
        parts.append(f"<details><summary>Facts</summary><pre>{escape(facts)}</pre></details>")
    parts.append("</div>")
    return "".join(parts)


