"""The HTML and text kit every result renders with: status marks and colours, the [simulated] label,
(heading, text) rows and numbered findings. Every value that goes into HTML is escaped here.
"""

from __future__ import annotations

from html import escape
from typing import Any

from jupyter_gpu.models import Finding

STATUS_MARK = {"ok": "✓", "warn": "!", "fail": "✗"}
# The label every surface puts on output that came from the simulated backend or a simulated snapshot.
SIMULATED_TEXT = "   [simulated]"
SIMULATED_HTML = ' <span style="opacity:.7">[simulated]</span>'
COLOUR = {"fail": "#c62828", "warn": "#b26a00", "info": "#1565c0", "ok": "#2e7d32"}
# Code a user copies never breaks inside a word. JupyterLab's and Notebook 7's output area style every `pre` in an
# output with `word-break: break-all` (`.jp-OutputArea-output pre`), which cut `https://download.pytorch.or` /
# `g/whl/cu128` in the Fix block at 800 px: a block scrolls sideways in itself instead, and inline code wraps only at
# its spaces.
CODE_BLOCK_STYLE = ("margin:.1em 0;padding:.4em;background:var(--jp-layout-color2,#f5f5f5);white-space:pre;"
                    "overflow-x:auto;word-break:normal;overflow-wrap:normal")
CODE_INLINE_STYLE = "word-break:normal;overflow-wrap:normal"
# A number's cell never wraps ("119 ms" on two lines) and lines up on its last digit.
NUMBER_CELL_STYLE = "text-align:right;white-space:nowrap;padding-right:1em"


def code_block_html(text: str) -> str:
    """A block of code or commands, escaped: scrolls sideways rather than break a word."""
    return f'<pre style="{CODE_BLOCK_STYLE}">{escape(text)}</pre>'


def code_html(text: str) -> str:
    """Inline code, escaped: wraps only at its spaces."""
    return f'<code style="{CODE_INLINE_STYLE}">{escape(text)}</code>'


def table_html(table: list[tuple[str, ...]], numeric_headings: tuple[str, ...] = ()) -> str:
    """A table (its first row the headings) as an HTML table, every value escaped; the columns named in
    `numeric_headings` right-aligned and never wrapped, as `table_text` aligns them."""
    numeric = {i for i, heading in enumerate(table[0]) if heading in numeric_headings}

    def cell(tag: str, index: int, text: str) -> str:
        style = NUMBER_CELL_STYLE if index in numeric else "text-align:left;padding-right:1em"
        return f'<{tag} style="{style}">{escape(text)}</{tag}>'

    rows = ["<tr>" + "".join(cell(tag, i, text) for i, text in enumerate(row)) + "</tr>"
            for tag, row in (("th" if n == 0 else "td", row) for n, row in enumerate(table))]
    return f'<table style="margin:.2em 0;font-size:.9em">{"".join(rows)}</table>'


def evidence_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(evidence_value(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={evidence_value(v)}" for k, v in value.items())
    return str(value)


def evidence_items(evidence: dict[str, Any]) -> list[tuple[str, str]]:
    return [(str(k), evidence_value(v)) for k, v in evidence.items() if v not in (None, "", [], {})]


def rows_text(rows: list[tuple[str, str]]) -> list[str]:
    """(heading, text) rows as indented lines with the headings in one column."""
    width = max(len(heading) for heading, _ in rows)
    return [f"  {heading:<{width}}  {text}" for heading, text in rows]


def rows_html(rows: list[tuple[str, str]]) -> str:
    """(heading, text) rows as a two-column table, every value escaped."""
    cells = "".join(f'<tr><td style="text-align:left;opacity:.75;padding-right:1em">{escape(heading)}</td>'
                    f'<td style="text-align:left">{escape(text)}</td></tr>' for heading, text in rows)
    return f'<table style="margin:.2em 0;font-size:.92em">{cells}</table>'


def table_text(table: list[tuple[str, ...]], numeric_headings: tuple[str, ...] = ()) -> list[str]:
    """A table (its first row the headings) as indented text lines, each column as wide as its widest cell;
    the columns named in `numeric_headings` are right-aligned, so numbers line up on their last digit."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    numeric = {i for i, heading in enumerate(table[0]) if heading in numeric_headings}
    lines = []
    for row in table:
        cells = [f"{cell:>{widths[i]}}" if i in numeric else f"{cell:<{widths[i]}}" for i, cell in enumerate(row)]
        lines.append(("  " + "  ".join(cells)).rstrip())
    return lines


def findings_text(findings: list[Finding]) -> list[str]:
    """Numbered findings with evidence and fix, as text lines (each finding preceded by a blank line)."""
    lines: list[str] = []
    for number, finding in enumerate(findings, 1):
        lines.append("")
        lines.append(f"{number}. [{finding.severity}] {finding.code}: {finding.headline}")
        for key, value in evidence_items(finding.evidence):
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
        evidence = evidence_items(finding.evidence)
        if evidence:
            parts.append('<table style="margin:.2em 0;font-size:.9em">')
            parts.extend(
                f'<tr><td style="text-align:left;opacity:.75;padding-right:1em">{escape(k)}</td>'
                f'<td style="text-align:left">{code_html(v)}</td></tr>' for k, v in evidence
            )
            parts.append("</table>")
        if finding.fix:
            parts.append(f'<div style="font-size:.9em">Fix:</div>{code_block_html(chr(10).join(finding.fix))}')
        parts.append("</li>")
    parts.append("</ol>")
    return "".join(parts)
