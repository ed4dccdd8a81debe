"""Text and HTML for `%gpucells`. Every value in the HTML is escaped: the cell lines are the user's code.

The first text line says how many cells are shown and how many are flagged; the flagged cells follow the table,
each with what to type next.
"""

from __future__ import annotations

from html import escape

from jupyter_gpu.gpucells.result import CellLog, CellRow
from jupyter_gpu.rendering.kit import COLOUR, NUMBER_CELL_STYLE, code_html, table_text
from jupyter_gpu.rendering.units import format_bytes, format_growth, format_seconds

HEADINGS = ("In [n]", "cell", "wall", "GPU time", "GPU busy", "peak allocated", "left behind", "flags")
NUMERIC = ("wall", "GPU time", "GPU busy", "peak allocated", "left behind")
CELL_WIDTH = 36
NOTHING = "gpucells: no cell has finished since jupyter_gpu was loaded"
TABLE_OPEN = '<table style="margin:.4em 0;font-size:.92em;font-variant-numeric:tabular-nums">'
LEFT = 'style="text-align:left;padding-right:1em"'
RIGHT = f'style="{NUMBER_CELL_STYLE}"'  # a figure never wraps ("119 ms" on two lines at 800 px)
LABEL = 'style="text-align:left;padding-right:1em;white-space:nowrap"'  # "In [12]" on one line


def _short(text: str) -> str:
    return text if len(text) <= CELL_WIDTH else text[:CELL_WIDTH - 1] + "…"


def _signed(count: int | None) -> str:
    if count is None:
        return "–"
    return format_growth(count)


def _cells(row: CellRow) -> tuple[str, ...]:
    gpu_time = "–" if row.gpu_seconds is None else format_seconds(row.gpu_seconds)
    if row.cuda_started and row.gpu_seconds is None:
        gpu_time = "CUDA started"
    busy = "–" if row.gpu_busy is None else f"{row.gpu_busy:.0f}%"
    peak = "–" if row.peak_allocated is None else format_bytes(row.peak_allocated)
    flags = ", ".join(flag.code for flag in row.flags)
    return (row.label, _short(row.cell), format_seconds(row.wall_seconds), gpu_time, busy, peak,
            _signed(row.left_behind), flags)


def headline(log: CellLog) -> str:
    if not log.rows:
        return NOTHING
    flagged = len(log.flagged)
    of = f" of {log.recorded} recorded" if log.recorded > len(log.rows) else ""
    return (f"gpucells: the last {len(log.rows)} cells{of}; "
            + (f"{flagged} flagged" if flagged else "none flagged"))


def render_text(log: CellLog) -> str:
    lines = [headline(log)]
    if log.rows:
        lines.extend(table_text([HEADINGS, *(_cells(row) for row in log.rows)], NUMERIC))
    if log.flagged:
        lines.append("look at:")
        for row in log.flagged:
            lines.extend(f"  {row.label}  {flag.message}" for flag in row.flags)
    errors = [row for row in log.rows if row.error]
    lines.extend(f"  {row.label}: not fully recorded ({row.error}); the cell itself ran normally" for row in errors)
    lines.extend(f"note: {note}" for note in log.notes)
    return "\n".join(lines)


def render_html(log: CellLog) -> str:
    parts = [f"<div><b>{escape(headline(log))}</b>"]
    if log.rows:
        parts.append(TABLE_OPEN + "<tr>" + "".join(
            f"<th {RIGHT if h in NUMERIC else LABEL if h == HEADINGS[0] else LEFT}>{escape(h)}</th>"
            for h in HEADINGS) + "</tr>")
        for row in log.rows:
            cells = _cells(row)
            parts.append("<tr>" + "".join(
                f"<td {RIGHT if HEADINGS[i] in NUMERIC else LABEL if i == 0 else LEFT}>"
                + (f"{code_html(cell)}" if HEADINGS[i] == "cell" else escape(cell)) + "</td>"
                for i, cell in enumerate(cells)) + "</tr>")
        parts.append("</table>")
    if log.flagged:
        parts.append('<ul style="margin:.2em 0 .2em 1.2em;padding:0">')
        for row in log.flagged:
            parts.extend(f'<li><span style="color:{COLOUR["warn"]};font-weight:600">{escape(row.label)} '
                         f"{escape(flag.code)}</span>: {escape(flag.message)}</li>" for flag in row.flags)
        parts.append("</ul>")
    for row in log.rows:
        if row.error:
            parts.append(f'<div style="opacity:.8">{escape(row.label)}: not fully recorded ({escape(row.error)}); '
                         "the cell itself ran normally</div>")
    parts.extend(f'<div style="opacity:.8">note: {escape(note)}</div>' for note in log.notes)
    parts.append("</div>")
    return "".join(parts)
