"""Text and HTML renderings of a `GpuCheckReport`. Every value in the HTML is escaped."""

from __future__ import annotations

import json
from html import escape
from typing import Any

from jupyter_gpu.gpucheck.report import GpuCheckReport
from jupyter_gpu.models import Finding

STATUS_MARK = {"ok": "✓", "warn": "!", "fail": "✗"}
# The label every surface puts on output that came from the simulated backend or a simulated snapshot.
SIMULATED_TEXT = "   [simulated]"
SIMULATED_HTML = ' <span style="opacity:.7">[simulated]</span>'
COLOUR = {"fail": "#c62828", "warn": "#b26a00", "info": "#1565c0", "ok": "#2e7d32"}


def _value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(_value(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={_value(v)}" for k, v in value.items())
    return str(value)


def _evidence_items(evidence: dict[str, Any]) -> list[tuple[str, str]]:
    return [(str(k), _value(v)) for k, v in evidence.items() if v not in (None, "", [], {})]


def _simulated(report: GpuCheckReport) -> bool:
    return bool((report.facts.get("context") or {}).get("simulated"))


def rows_text(rows: list[tuple[str, str]]) -> list[str]:
    """(heading, text) rows as indented lines with the headings in one column."""
    width = max(len(heading) for heading, _ in rows)
    return [f"  {heading:<{width}}  {text}" for heading, text in rows]


def rows_html(rows: list[tuple[str, str]]) -> str:
    """(heading, text) rows as a two-column table, every value escaped."""
    cells = "".join(f'<tr><td style="text-align:left;opacity:.75;padding-right:1em">{escape(heading)}</td>'
                    f'<td style="text-align:left">{escape(text)}</td></tr>' for heading, text in rows)
    return f'<table style="margin:.2em 0;font-size:.92em">{cells}</table>'


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


def findings_text(findings: list[Finding]) -> list[str]:
    """Numbered findings with evidence and fix, as text lines (each finding preceded by a blank line)."""
    lines: list[str] = []
    for number, finding in enumerate(findings, 1):
        lines.append("")
        lines.append(f"{number}. [{finding.severity}] {finding.code}: {finding.headline}")
        for key, value in _evidence_items(finding.evidence):
            lines.append(f"     {key}: {value}")
        if finding.fix:
            lines.append("   Fix:")
            lines.extend(f"     {step}" for step in finding.fix)
    return lines


def findings_html(findings: list[Finding]) -> str:
    """The same findings as an escaped HTML list."""
    if not findings:
        return ""
    parts = ['<ol style="margin:.4em 0 0 1.2em;padding:0">']
    for finding in findings:
        parts.append(
            f'<li style="margin:.35em 0"><span style="color:{COLOUR[finding.severity]};font-weight:600">'
            f"[{escape(finding.severity)}] {escape(finding.code)}</span>: {escape(finding.headline)}"
        )
        evidence = _evidence_items(finding.evidence)
        if evidence:
            parts.append('<table style="margin:.2em 0;font-size:.9em">')
            parts.extend(
                f'<tr><td style="text-align:left;opacity:.75;padding-right:1em">{escape(k)}</td>'
                f'<td style="text-align:left"><code>{escape(v)}</code></td></tr>' for k, v in evidence
            )
            parts.append("</table>")
        if finding.fix:
            fix = "\n".join(finding.fix)
            parts.append(f'<div style="font-size:.9em">Fix:</div><pre style="margin:.1em 0;padding:.4em;'
                         f'background:var(--jp-layout-color2,#f5f5f5)">{escape(fix)}</pre>')
        parts.append("</li>")
    parts.append("</ol>")
    return "".join(parts)
