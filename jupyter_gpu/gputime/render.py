"""Text and HTML renderings of a `GpuTimeResult`. Every value in the HTML is escaped."""

from __future__ import annotations

from jupyter_gpu.gputime.result import GpuTimeResult
from jupyter_gpu.rendering.kit import (
    COLOUR,
    SIMULATED_HTML,
    SIMULATED_TEXT,
    code_html,
    findings_html,
    findings_text,
    rows_html,
    rows_text,
)
from jupyter_gpu.rendering.units import format_bytes, format_count, format_seconds


def summary_rows(result: GpuTimeResult) -> list[tuple[str, str]]:
    """(heading, text) rows shared by the text and HTML renderings."""
    rows = [("time", _time_line(result))]
    if result.repeated:
        first = format_seconds(result.first_time)
        if result.first_gpu_time is not None:
            first += f" · GPU {format_seconds(result.first_gpu_time)}"
        rows.append(("first run", f"{first} (one-time costs such as compilation, autotuning and warm-up land here, "
                                  "not in the median)"))
    rows.append(("operations", _ops_line(result)))
    rows.extend((f"memory {m.device}",
                 f"peak {format_bytes(m.peak_allocated)} allocated, {format_bytes(m.peak_reserved)} reserved; "
                 f"allocated {_signed_bytes(m.allocated_delta)} after the cell") for m in result.memory)
    if result.ops is not None and result.ops.cpu_bytes_allocated:
        ops = result.ops
        rows.append(("CPU tensors", f"{format_bytes(ops.cpu_bytes_allocated)} allocated, peak "
                     f"{format_bytes(ops.cpu_peak_bytes)} live, {format_bytes(ops.cpu_bytes_held)} still held "
                     "after the run"))
    if result.busy is not None:
        rows.append(("GPU busy", f"{result.busy.percent:.0f}% of the cell ({', '.join(result.busy.devices)}, "
                     f"{result.busy.samples} NVML samples)"))
    elif result.busy_note:
        rows.append(("GPU busy", result.busy_note))
    return rows


def render_text(result: GpuTimeResult) -> str:
    lines = [f"gputime: {result.label}" + (SIMULATED_TEXT if result.simulated else "")]
    lines.extend(rows_text(summary_rows(result)))
    lines.extend(findings_text(result.findings))
    return "\n".join(lines)


def render_html(result: GpuTimeResult) -> str:
    simulated = SIMULATED_HTML if result.simulated else ""
    worst = result.findings[0].severity if result.findings else "ok"
    colour = COLOUR["ok" if worst == "info" else worst]
    parts = [
        '<div class="jupyter-gpu-time" style="font-family:var(--jp-ui-font-family,sans-serif);line-height:1.4">',
        f'<div style="font-weight:600;color:{colour}">gputime: {code_html(result.label)}{simulated}</div>',
        rows_html(summary_rows(result)),
    ]
    parts.append(findings_html(result.findings))
    parts.append("</div>")
    return "".join(parts)


def _time_line(result: GpuTimeResult) -> str:
    stats = result.stats
    gpu = result.gpu_stats
    if result.repeated and stats.n == 1:
        # One timed run has no median, minimum or spread to report: its per-loop mean is the measurement.
        text = (f"{format_seconds(stats.median)} per loop, 1 run × {format_count(result.loops)} "
                f"loop{'s' if result.loops != 1 else ''} (wall, synchronised; one run has no spread: add -r N)")
    elif result.repeated:
        text = (f"{format_seconds(stats.median)} median, min {format_seconds(stats.minimum)}, "
                f"IQR {format_seconds(stats.iqr)}, n={stats.n} runs × "
                f"{format_count(result.loops)} "
                f"loop{'s' if result.loops != 1 else ''} (wall, synchronised)")
    if result.repeated:
        if result.warmup:
            text += f"; {result.warmup} warm-up run{'s' if result.warmup != 1 else ''} not counted"
        if gpu is not None:
            text += f"; GPU {format_seconds(gpu.median)} median (CUDA events)"
        if result.context.get("interrupted"):
            text += f"; {result.context['interrupted']}"
        return text
    text = f"{format_seconds(stats.median)} wall (1 run, synchronised)"
    if gpu is not None:
        text += f"; GPU {format_seconds(gpu.median)} (CUDA events)"
    return text


def _ops_line(result: GpuTimeResult) -> str:
    ops = result.ops
    if ops is None:
        return result.ops_note or "not counted"
    if not ops.total:
        text = "no PyTorch operations"
    else:
        text = " · ".join(f"{kind} {format_count(n)}" for kind, n in sorted(ops.by_device.items(),
                                                                           key=lambda kv: -kv[1]))
    extras = []
    if ops.copies:
        extras.append("copies " + ", ".join(f"{d.replace('_', ' ')} {format_count(n)} "
                                            f"({format_bytes(ops.copy_bytes.get(d, 0))})"
                                            for d, n in sorted(ops.copies.items())))
    if ops.syncs:
        extras.append(f"waits for the GPU {format_count(ops.sync_count)}")
    if extras:
        text += "; " + "; ".join(extras)
    where = "in the counted first run" if result.repeated else "in this run"
    text += f" ({where}"
    if ops.overhead_seconds is not None and ops.total:
        text += f"; counting added ≈{format_seconds(ops.overhead_seconds)}"
    return text + ")"


def _signed_bytes(count: int) -> str:
    return ("+" if count >= 0 else "") + format_bytes(count)
