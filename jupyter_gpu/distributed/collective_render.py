"""Text and HTML renderings of an `AllReduceResult`, laid out like nccl-tests' `all_reduce_perf` output: the verdict,
one row per size (time, algbw, busbw, #wrong, share of the link's peak), the peak it is compared with, and the
checked peer-to-peer copies."""

from __future__ import annotations

from html import escape

from jupyter_gpu.distributed.collective import P2P_FIX, SINGLE_RANK_NOTE, AllReduceResult
from jupyter_gpu.rendering.kit import (
    COLOUR,
    SIMULATED_HTML,
    SIMULATED_TEXT,
    STATUS_MARK,
    code_block_html,
    rows_html,
    rows_text,
    table_text,
)
from jupyter_gpu.rendering.units import format_bytes, format_count, format_seconds

SIZE_HEADINGS = ("size", "count", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong", "% of peak")
P2P_HEADINGS = ("copy", "size", "GB/s", "#wrong")
NUMERIC = ("count", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong", "% of peak", "size", "GB/s")
TIMING = "time: per all-reduce, the slowest rank's median of the timed iterations; busbw = algbw x 2(n-1)/n"
NCCL_DEBUG_LINE = "NCCL_DEBUG=WARN jupyter-gpu allreduce  # NCCL then says what it did"


def _gbps(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.2f}"


def _percent(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio * 100:.1f}"


def size_table(result: AllReduceResult) -> list[tuple[str, ...]]:
    return [SIZE_HEADINGS, *((format_bytes(row.size_bytes), format_count(row.elements), row.dtype,
                              f"{row.time_s * 1e6:.1f}", _gbps(row.algbw), _gbps(row.busbw), format_count(row.wrong),
                              _percent(row.ratio)) for row in result.rows)]


def p2p_table(result: AllReduceResult) -> list[tuple[str, ...]]:
    return [P2P_HEADINGS, *((f"{copy.src} -> {copy.dst}", format_bytes(copy.size_bytes), _gbps(copy.bytes_per_s),
                             format_count(copy.wrong)) for copy in result.p2p)]


def _ranks(result: AllReduceResult) -> str:
    devices = ", ".join(result.devices) if len(set(result.devices)) > 1 else (result.devices or ("?",))[0]
    plural = "es" if result.world_size != 1 else ""
    return f"{result.backend}, {result.world_size} process{plural} ({devices})"


def _peak(result: AllReduceResult) -> str:
    if result.backend == "gloo":
        return "not compared: gloo reduces through the CPU and its memory, not over a GPU link"
    if result.peak is None:
        return "unknown (NVML did not give the links' generation and width): % of peak is n/a"
    simulated = " [simulated]" if result.peak.simulated else ""
    return f"{result.peak.description} = {result.peak.bytes_per_s / 1e9:.0f} GB/s per GPU and direction{simulated}"


def header_rows(result: AllReduceResult) -> list[tuple[str, str]]:
    return [("ranks", _ranks(result)), ("link peak", _peak(result)),
            ("init", f"{format_seconds(result.init_s)} (starting the ranks to the first collective ready)"),
            ("wall", format_seconds(result.wall_s))]


def fix_lines(result: AllReduceResult) -> list[str]:
    """What to type next when a result came back wrong: P2P off first, as nccl-tests #117 teaches."""
    if result.ok or result.backend != "nccl":
        return []
    return [P2P_FIX + "  # if this is correct, P2P between these GPUs is broken", NCCL_DEBUG_LINE]


def notes(result: AllReduceResult) -> list[str]:
    return [*result.notes, *([SINGLE_RANK_NOTE] if result.world_size == 1 else []), TIMING]


def render_text(result: AllReduceResult) -> str:
    lines = [f"{STATUS_MARK[result.status]} all-reduce: {result.verdict}"
             + (SIMULATED_TEXT if result.simulated else "")]
    lines.extend(rows_text(header_rows(result)))
    lines.append("")
    lines.extend(table_text(size_table(result), NUMERIC))
    if result.p2p:
        lines.append("")
        lines.append("Peer-to-peer copies (each checked on the destination):")
        lines.extend(table_text(p2p_table(result), NUMERIC))
    fixes = fix_lines(result)
    if fixes:
        lines.extend(["", "Fix:", *("  " + line for line in fixes)])
    lines.append("")
    lines.extend(notes(result))
    return "\n".join(lines)


def _table_html(table: list[tuple[str, ...]]) -> str:
    def cell(tag: str, text: str, heading: str) -> str:
        align = "right" if heading in NUMERIC else "left"
        wrong = tag == "td" and heading == "#wrong" and text != "0"
        colour = f";color:{COLOUR['fail']};font-weight:600" if wrong else ""
        return f'<{tag} style="text-align:{align}{colour}">{escape(text)}</{tag}>'

    headings = table[0]
    rows = ["<tr>" + "".join(cell("th", h, h) for h in headings) + "</tr>"]
    rows.extend("<tr>" + "".join(cell("td", text, h) for text, h in zip(row, headings, strict=True)) + "</tr>"
                for row in table[1:])
    return f'<table style="margin:.3em 0;font-size:.9em;font-variant-numeric:tabular-nums">{"".join(rows)}</table>'


def render_html(result: AllReduceResult) -> str:
    colour = COLOUR[result.status]
    parts = ['<div class="jupyter-gpu-allreduce" style="font-family:var(--jp-ui-font-family,sans-serif);'
             'line-height:1.4">',
             f'<div style="font-weight:600;color:{colour}">{STATUS_MARK[result.status]} all-reduce: '
             f"{escape(result.verdict)}{SIMULATED_HTML if result.simulated else ''}</div>",
             rows_html(header_rows(result)), _table_html(size_table(result))]
    if result.p2p:
        parts.append('<div style="margin-top:.3em">Peer-to-peer copies (each checked on the destination)</div>')
        parts.append(_table_html(p2p_table(result)))
    fixes = fix_lines(result)
    if fixes:
        parts.append(f'<div style="font-size:.9em">Fix:</div>{code_block_html(chr(10).join(fixes))}')
    parts.extend(f'<div style="font-size:.9em;opacity:.8">{escape(note)}</div>' for note in notes(result))
    parts.append("</div>")
    return "".join(parts)
